"""`colo-shim bundle DIR` reaches venvs that have neither colo-shim nor wrapt installed.

The plain venv is what a NeMo-RL per-actor uv venv looks like to us: its own interpreter and
packages, none of ours, and the job can only hand it environment variables.
"""

import os
import subprocess
import sys

import pytest

from harness.envs import HOST_SITE, plain_venv, ray_venv, run_in, venv_python
from harness.procs import REPO, clean_env
from helpers import TARGETS, last_json

REPORT = os.path.join(TARGETS, "activation_report.py")


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("bundle")
    env = clean_env(PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, "-m", "colo_shim", "bundle", str(out)], env=env, capture_output=True,
                          text=True, timeout=60, cwd="/")
    assert proc.returncode == 0, proc.stderr
    assert f"PYTHONPATH={out} COLO_SHIM=1" in proc.stdout
    return str(out)


@pytest.fixture(scope="module")
def user_site(tmp_path_factory):
    """Declares the test family before activation; the bundle's bootstrap must chain to it."""
    path = tmp_path_factory.mktemp("usersite")
    (path / "sitecustomize.py").write_text(
        "import os\nos.environ['USER_SITECUSTOMIZE_RAN'] = __file__\n"
        "import activation_probe\nactivation_probe.install()\n")
    return str(path)


def test_bundle_layout(bundle_dir):
    assert os.path.isfile(os.path.join(bundle_dir, "sitecustomize.py"))
    assert os.path.isfile(os.path.join(bundle_dir, "colo_shim", "core", "registry.py"))
    vendor = os.path.join(bundle_dir, "_colo_shim_vendor")
    assert sorted(os.listdir(vendor)) == ["packaging", "wrapt"]
    binaries = [f for _, _, files in os.walk(bundle_dir) for f in files if f.endswith((".so", ".pyd"))]
    assert binaries == []  # pure Python: usable by any CPython ABI the job's venvs use
    tag = sys.implementation.cache_tag  # bytecode only for the bundling interpreter, in __pycache__
    pycs = {f.split(".")[1] for _, _, files in os.walk(bundle_dir) for f in files if f.endswith(".pyc")}
    assert pycs == {tag}, pycs


def test_plain_venv_has_neither_colo_shim_nor_wrapt():
    proc = run_in(venv_python(plain_venv()), "import colo_shim", check=False)
    assert "No module named 'colo_shim'" in proc.stderr
    proc = run_in(venv_python(plain_venv()), "import wrapt", check=False)
    assert "No module named 'wrapt'" in proc.stderr


def test_bundle_activates_plain_venv_with_pure_python_wrapt(bundle_dir, user_site):
    python = venv_python(plain_venv())
    path = os.pathsep.join([bundle_dir, user_site, TARGETS])
    r = last_json(run_in(python, REPORT, env={"PYTHONPATH": path, "COLO_SHIM": "1"}, args=["--children"]))
    for child in (r, r["subprocess"], r["spawn"]):
        assert child["at_start"] == ["colo_shim", "colo_shim.core.deferred"], child
        assert "shimtest" in child["enabled"] and child["layers"] == 1, child
        assert child["calls"]["shimtarget.sub:free"] == 1, child
        assert child["wrapt"] == os.path.join(bundle_dir, "_colo_shim_vendor", "wrapt", "__init__.py"), child
        assert child["chained"] and child["user_sitecustomize_ran"], child
    pure = run_in(python, "import sys, wrapt.wrappers as w; print(w.FunctionWrapper.__module__, "
                          "'wrapt._wrappers' in sys.modules)", env={"PYTHONPATH": bundle_dir, "COLO_SHIM": "1"})
    assert pure.stdout.split() == ["wrapt.wrappers", "False"], pure.stdout


def test_bundle_is_inert_without_colo_shim(bundle_dir, user_site):
    python = venv_python(plain_venv())
    r = last_json(run_in(python, REPORT, env={"PYTHONPATH": os.pathsep.join([bundle_dir, user_site, TARGETS])}))
    assert r["at_start"] == [] and r["layers"] == 0 and r["enabled"] is None, r
    assert r["chained"] and r["user_sitecustomize_ran"], r  # the user's sitecustomize still runs


def test_host_wrapt_wins_over_the_bundled_copy(bundle_dir, user_site):
    python = venv_python(ray_venv())  # has the host's wrapt (C extension) through a path line
    path = os.pathsep.join([bundle_dir, user_site, TARGETS])
    r = last_json(run_in(python, REPORT, env={"PYTHONPATH": path, "COLO_SHIM": "1"}))
    assert r["wrapt"] == os.path.join(HOST_SITE, "wrapt", "__init__.py"), r
    assert r["layers"] == 1 and r["calls"]["shimtarget.sub:Engine.step"] == 1, r


def test_doctor_runs_from_the_bundle_alone_with_colo_shim_unset(bundle_dir):
    # the bootstrap adds the bundled wrapt only when COLO_SHIM is set; doctor needs it anyway
    proc = run_in(venv_python(plain_venv()), "import runpy; runpy.run_module('colo_shim', run_name='__main__')",
                  env={"PYTHONPATH": bundle_dir}, args=["doctor"])
    assert "COLO_SHIM unset (inactive: a job patches nothing; " in proc.stdout.splitlines()[0], proc.stdout
    assert proc.stdout.splitlines()[1].split()[:3] == ["name", "target", "status"], proc.stdout
