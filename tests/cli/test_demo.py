"""`colo-shim demo`, the README's main command, on this machine (CPU: NVRx shared-memory path).

Without the shim the save after reload hangs: the fresh NVRx writer dies on a cache miss while
the trainer waits in preload_q.join(). The demo must report that cause (the writer's exit and its
"Worker cache miss" traceback), however slow the machine is; its --timeout is only a safety
limit whose message says no cause was detected, so a slow run can never pass for a hang.
"""

import pytest

from helpers import deps_dir, run_python

pytestmark = pytest.mark.timeout(1500)  # a safety limit only; a loaded 2-core VM takes minutes


def _rows(stdout: str) -> dict:
    return {line.split("|")[0].strip(): [c.strip() for c in line.split("|")[1:]]
            for line in stdout.splitlines() if "|" in line}


def test_demo_shows_the_hang_by_its_cause_without_and_an_equal_checkpoint_with_the_shim():
    proc = run_python("import sys; from colo_shim.cli import main; sys.exit(main(sys.argv[1:]))",
                      args=("demo", "--mib", "1", "--timeout", "600"), pythonpath=(deps_dir("nvrx", "0.7.0"),),
                      timeout=1300)
    rows = _rows(proc.stdout)
    assert not rows["no shim"][4].startswith("no: timed out"), f"no cause detected, only the safety limit: {proc.stdout}"
    assert rows["no shim"][4].startswith("no: hang: the NVRx writer died on a cache miss (exit code"), proc.stdout
    assert "preload_q.join()" in rows["no shim"][4], proc.stdout
    assert rows["with shim"][4] == "yes", proc.stdout
    assert rows["with shim"][0] == "cpu (NVRx shm path)" and rows["with shim"][1] == "0.7.0", proc.stdout

