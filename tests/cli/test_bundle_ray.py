"""A real local Ray cluster whose actor runs in a second venv without colo-shim, reached only
through `colo-shim bundle` and runtime_env env_vars, the way a NeMo-RL job reaches its actors."""

import os
import subprocess
import sys

import pytest

from harness.envs import ray_venv, run_in, venv_python
from harness.procs import REPO, clean_env
from helpers import TARGETS, last_json

pytest.importorskip("ray")

DRIVER = r"""
import json, sys, time
import ray

python, pythonpath = sys.argv[1], sys.argv[2]
ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)


@ray.remote
class Probe:
    def report(self):
        import os, sys
        out = {"executable": sys.executable, "pid": os.getpid(),
               "active": "colo_shim.core.deferred" in sys.modules, "colo_shim": None}
        if out["active"]:
            import colo_shim
            from colo_shim.core import registry
            import shimtarget.sub as t
            t.free(1)
            out.update(colo_shim=colo_shim.__file__,
                       enabled=sorted(n for n in registry.families() if registry.enabled(n)),
                       wrapped=type(vars(t.Engine)["step"]).__name__,
                       calls={r["target"]: r["calls"] for r in colo_shim.status() if r["name"] == "shimtest"})
        return out


start = time.time()
env = {"py_executable": python, "env_vars": {"PYTHONPATH": pythonpath, "COLO_SHIM": "1"}}
actor = Probe.options(runtime_env=env).remote()
result = ray.get(actor.report.remote(), timeout=90)
result["seconds"] = round(time.time() - start, 1)
result["driver_has_colo_shim"] = "colo_shim" in sys.modules
ray.shutdown()
print(json.dumps(result))
"""


def test_ray_actor_in_a_venv_without_colo_shim_is_activated_by_the_bundle(tmp_path):
    python = venv_python(ray_venv())
    assert "No module named 'colo_shim'" in run_in(python, "import colo_shim", check=False).stderr
    assert run_in(python, "import ray; print(ray.__version__)", timeout=60).stdout.strip()
    bundle = tmp_path / "bundle"
    subprocess.run([sys.executable, "-m", "colo_shim", "bundle", str(bundle)], env=clean_env(PYTHONPATH=REPO),
                   check=True, capture_output=True, timeout=60, cwd="/")
    user_site = tmp_path / "usersite"  # declares the test family before activation, chained by the bundle
    user_site.mkdir()
    (user_site / "sitecustomize.py").write_text("import activation_probe\nactivation_probe.install()\n")
    pythonpath = os.pathsep.join([str(bundle), str(user_site), TARGETS])
    # the driver runs in the test interpreter's venv, where colo_shim is not installed either
    driver = subprocess.run([sys.executable, "-c", DRIVER, python, pythonpath],
                            env=clean_env(RAY_USAGE_STATS_ENABLED="0"), capture_output=True, text=True, timeout=180,
                            cwd=str(tmp_path))
    assert driver.returncode == 0, driver.stderr[-4000:]
    r = last_json(driver)
    assert r["executable"] == python, r
    assert r["active"] and r["colo_shim"] == str(bundle / "colo_shim" / "__init__.py"), r
    assert "shimtest" in r["enabled"] and r["wrapped"] == "ShimWrapper", r
    assert r["calls"]["shimtarget.sub:free"] == 1, r
    assert not r["driver_has_colo_shim"], r
