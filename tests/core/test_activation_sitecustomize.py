"""sitecustomize_example/: the block people paste into a sitecustomize.py they manage themselves."""

import os

from harness.procs import REPO
from helpers import TARGETS, last_json, run_python

EXAMPLE = os.path.join(REPO, "sitecustomize_example")
REPORT = os.path.join(TARGETS, "activation_report.py")


def test_example_on_pythonpath_activates_only_with_colo_shim():
    on = last_json(run_python(REPORT, pythonpath=(EXAMPLE, TARGETS), env={"COLO_SHIM": "1"}))
    assert on["at_start"] == ["colo_shim", "colo_shim.core.deferred"], on
    off = last_json(run_python(REPORT, pythonpath=(EXAMPLE, TARGETS)))
    assert off["at_start"] == [] and off["enabled"] is None, off


def test_block_pasted_after_existing_code_patches_a_target(tmp_path):
    with open(os.path.join(EXAMPLE, "sitecustomize.py")) as fh:
        block = fh.read()
    (tmp_path / "sitecustomize.py").write_text("import activation_probe\nactivation_probe.install()\n\n" + block)
    r = last_json(run_python(REPORT, pythonpath=(str(tmp_path), TARGETS), env={"COLO_SHIM": "1"}, args=["--children"]))
    for child in (r, r["subprocess"], r["spawn"]):
        assert "shimtest" in child["enabled"] and child["layers"] == 1, child
        assert child["calls"]["shimtarget.sub:Engine.step"] == 1, child


def test_block_is_silent_where_colo_shim_is_not_importable(tmp_path):
    from harness.envs import plain_venv, run_in, venv_python

    proc = run_in(venv_python(plain_venv()), "import sys; print('sitecustomize' in sys.modules)",
                  env={"PYTHONPATH": EXAMPLE, "COLO_SHIM": "1"})
    assert proc.stdout.strip() == "True" and proc.stderr == "", proc.stderr
