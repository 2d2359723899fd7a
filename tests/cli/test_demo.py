"""`colo-shim demo`, the README's main command, on this machine (CPU: NVRx shared-memory path)."""

from helpers import deps_dir, run_python


def test_demo_shows_the_hang_without_and_an_equal_checkpoint_with_the_shim():
    proc = run_python("import sys; from colo_shim.cli import main; sys.exit(main(sys.argv[1:]))",
                      args=("demo", "--mib", "1", "--timeout", "40"), pythonpath=(deps_dir("nvrx", "0.7.0"),),
                      timeout=240)
    rows = {line.split("|")[0].strip(): [c.strip() for c in line.split("|")[1:]]
            for line in proc.stdout.splitlines() if "|" in line}
    assert rows["no shim"][4].startswith("no: hung in the save after reload"), proc.stdout
    assert rows["with shim"][4] == "yes", proc.stdout
    assert rows["with shim"][0] == "cpu (NVRx shm path)" and rows["with shim"][1] == "0.7.0", proc.stdout
