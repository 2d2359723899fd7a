"""`colo-shim demo`, the README's main command, on this machine (CPU: NVRx shared-memory path).

Without the shim the save after reload hangs: the fresh NVRx writer dies on a cache miss while
the trainer waits in preload_q.join(). The demo must report that cause (the writer's exit and its
"Worker cache miss" traceback), however slow the machine is; its --timeout is only a safety
limit whose message says no cause was detected, so a slow run can never pass for a hang.
Whether it ends well, fails or is interrupted, it leaves nothing in the temp directory (issue 35
item 2): each run here gets a fresh TMPDIR (tests/conftest.py's short_tmpdir), listed afterwards.
"""

import os
import re
import signal
import subprocess

import pytest

from harness.procs import PYTHON, REPO, clean_env
from helpers import SEMAPHORE_OWNER, deps_dir, left_semaphores, run_python, semaphore_owner

MAIN = "import sys; from colo_shim.cli import main; sys.exit(main(sys.argv[1:]))"

pytestmark = pytest.mark.timeout(1500)  # a safety limit only; a loaded 2-core VM takes minutes


def _rows(stdout: str) -> dict:
    return {line.split("|")[0].strip(): [c.strip() for c in line.split("|")[1:]]
            for line in stdout.splitlines() if "|" in line}


def test_demo_shows_the_hang_by_its_cause_without_and_an_equal_checkpoint_with_the_shim(short_tmpdir):
    temp = short_tmpdir
    proc = run_python(MAIN, args=("demo", "--mib", "1", "--timeout", "600"), pythonpath=(deps_dir("nvrx", "0.7.0"),),
                      env={"TMPDIR": temp}, timeout=1300)  # exit 0 checked: the shim's row shows the fix
    assert sorted(os.listdir(temp)) == []  # no checkpoints, no pymp-* of the killed writers, no torchinductor_*
    rows = _rows(proc.stdout)
    closing = proc.stdout.splitlines()[-1]
    assert closing.startswith("the good result is 'checkpoint == live: yes': the 'with shim' row shows the fix, "
                              "the 'no shim' row shows the bug (hang: the NVRx writer died on a cache miss"), closing
    progress = [line for line in proc.stderr.splitlines() if line.startswith("colo-shim demo: ")]
    for row in ("no shim", "with shim"):  # said while it runs, phase by phase, for each run
        phases = [line for line in progress if line.startswith(f"colo-shim demo: {row}: ")]
        assert len(phases) >= 6 and phases[-1].startswith(f"colo-shim demo: {row}: done in "), progress
    assert any("with shim: reading the checkpoint back" in line for line in progress), progress
    assert rows["with shim"][3] == "n/a on CPU", proc.stdout
    no_cause = f"no cause detected, only the safety limit:\n{proc.stdout}"
    assert not rows["no shim"][4].startswith("no: timed out"), no_cause
    assert rows["no shim"][4].startswith("no: hang: the NVRx writer died on a cache miss (exit code"), proc.stdout
    assert "preload_q.join()" in rows["no shim"][4], proc.stdout
    assert rows["with shim"][4] == "yes", proc.stdout
    assert rows["with shim"][0] == "cpu (NVRx shm path)" and rows["with shim"][1] == "0.7.0", proc.stdout



def _end_children_of(temp: str) -> None:
    """Safety net: a demo that died without ending its children (their own session) leaves them running."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                tmpdir = next((v[7:] for v in fh.read().split(b"\0") if v.startswith(b"TMPDIR=")), b"")
            if tmpdir.decode(errors="replace").startswith(temp):
                os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass



def _as_from_a_terminal():
    """SIGINT as a shell gives it: xdist's workers ignore it, and an ignored SIGINT is inherited, so
    the demo would never see the interrupt this test sends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)

@pytest.mark.parametrize("signum,code", [(signal.SIGINT, 130), (signal.SIGTERM, 128 + signal.SIGTERM)],
                         ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_demo_leaves_nothing_in_the_temp_directory(short_tmpdir, signum, code):
    temp = short_tmpdir
    env = clean_env(PYTHONPATH=os.pathsep.join([REPO, deps_dir("nvrx", "0.7.0")]), TMPDIR=temp)
    proc = subprocess.Popen([PYTHON, "-c", MAIN, "demo", "--mib", "1"], env=env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_as_from_a_terminal)
    try:
        seen = []
        for line in proc.stderr:  # the first save is done and its writer runs: checkpoint and pymp-* exist
            seen.append(line)
            if "no shim: train step 2" in line:
                proc.send_signal(signum)
                break
        out, err = proc.communicate(timeout=300)  # a safety limit only
    finally:
        proc.kill()
        _end_children_of(temp)
    assert any("no shim: train step 2" in line for line in seen), "".join(seen) + err
    assert proc.returncode == code, (proc.returncode, out, err)
    assert "Traceback" not in err, err
    assert sorted(os.listdir(temp)) == []


def test_readme_command_1_installs_into_a_venv_of_the_python_the_demo_needs_and_names_the_cpu_torch():
    """Issue 35 item 11: command 1 installed into whatever Python was on PATH, CUDA torch included."""
    readme = open(os.path.join(REPO, "README.md")).read()
    block = readme.split("```bash\n# 1.", 1)[1].split("\n# 2.", 1)[0]
    commands = [line for line in block.splitlines()[1:] if line.strip() and not line.lstrip().startswith("#")]
    needed = re.search(r"--python-version (\S+)", open(os.path.join(REPO, ".ci", "install_deps.sh")).read()).group(1)
    venv = re.fullmatch(rf"python{re.escape(needed)} -m venv (\S+) && \. (\S+)/bin/activate", commands[0])
    assert venv and venv.group(1) == venv.group(2), commands[0]  # before any pip install, the one NVRx is built for
    assert any("pip install" in line for line in commands[1:]), commands
    after = " ".join(readme.split("```bash\n# 1.", 1)[1].split("```", 2)[1].split())
    assert f"Python {needed}" in after and "CPU build" in after and "PyTorch's own package index" in after, after
    assert not re.findall(r"://(?!pypi\.org)\S+", readme)  # no registry but PyPI named in the repo's README


def test_the_demo_ends_its_childs_group_but_lets_the_resource_tracker_unlink_the_semaphores(tmp_path):
    """Issue 35 item 2: killing the child's whole group (its resource tracker too) left each run's
    queue semaphores in /dev/shm (19 per demo run on main). The tracker is spared and unlinks them.
    The demo and the tests' scenario runner end their children this one way (cli/groups.py)."""
    from colo_shim.cli import groups

    with semaphore_owner(tmp_path) as (proc, names):
        proc.wait(timeout=120)  # a safety limit only
        assert len(names) == 3 and all(os.path.exists(f"/dev/shm/sem.{n}") for n in names), names
        assert any(groups._is_tracker(pid) for pid in groups._group(proc.pid))  # the writer and the tracker live on
        groups.end(proc.pid)
        assert groups._group(proc.pid) == []
        assert left_semaphores(names) == []


def test_the_scenario_runner_ends_a_scenario_without_leaving_its_semaphores(tmp_path):
    """The tests' scenario runner killed each scenario's whole group too: after one CI run 38 new
    sem.mp-* stayed in /dev/shm. It now ends the group as the demo does."""
    from nvrx_scenarios import runner

    script = tmp_path / "owner.py"
    script.write_text(SEMAPHORE_OWNER)
    outcome = runner.run("owner", {}, nvrx="0.7.0", script=str(script), timeout=120)
    names = outcome.stdout.split()
    try:
        assert len(names) == 3, outcome
        assert left_semaphores(names) == []
    finally:
        for n in left_semaphores(names):
            os.unlink(f"/dev/shm/sem.{n}")
