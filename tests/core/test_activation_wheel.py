"""The activator and the vLLM entry point as pip installs them from the built wheel, in a fresh venv.

Nothing from the repo is on PYTHONPATH here: colo_shim, its .pth line and its entry point come
from the venv's site-packages, exactly as on a user's machine.
"""

import os

import pytest

from harness.envs import PROBE_PTH, run_in, site_packages, venv_python, wheel_venv
from helpers import TARGETS, last_json

REPORT = os.path.join(TARGETS, "activation_report.py")
PROBE = {"COLO_SHIM_TEST_PROBE": "1"}


@pytest.fixture(scope="module")
def venv():
    return wheel_venv()


@pytest.fixture(scope="module")
def python(venv):
    return venv_python(venv)


def test_wheel_installs_both_activator_files(venv):
    site = site_packages(venv)
    with open(os.path.join(site, "colo_shim.pth")) as fh:
        pth = fh.read()
    assert pth.startswith("import os;") and pth.count("\n") <= 1, pth  # one import line, nothing else
    with open(os.path.join(site, "colo_shim.start")) as fh:
        entries = [line.strip() for line in fh if line.strip() and not line.startswith("#")]
    assert entries == ["colo_shim._activate:activate"]
    assert sorted(os.listdir(site)).index(PROBE_PTH) < sorted(os.listdir(site)).index("colo_shim.pth")


def test_start_entry_resolves_and_activates(python):
    # Python 3.15 calls pkgutil.resolve_name on each .start entry; no 3.15 here, so call it the same way
    code = ("import sys, pkgutil; before = 'colo_shim.core.deferred' in sys.modules; "
            "import os; os.environ['COLO_SHIM'] = '1'; pkgutil.resolve_name('colo_shim._activate:activate')(); "
            "import json; print(json.dumps([before, 'colo_shim.core.deferred' in sys.modules]))")
    assert last_json(run_in(python, code)) == [False, True]


def test_pth_activates_only_when_colo_shim_is_set(python):
    off = last_json(run_in(python, REPORT, env=PROBE, args=["--children"]))
    for r in (off, off["subprocess"], off["spawn"]):
        assert r["at_start"] == [] and r["layers"] == 0 and r["enabled"] is None, r
    on = last_json(run_in(python, REPORT, env={**PROBE, "COLO_SHIM": "1"}, args=["--children"]))
    for r in (on, on["subprocess"], on["spawn"]):
        assert r["at_start"] == ["colo_shim", "colo_shim.core.deferred"], r
        assert "shimtest" in r["enabled"] and r["layers"] == 1, r
        assert r["calls"]["shimtarget.sub:Engine.step"] == 1, r
        assert r["wrapt"].startswith(os.path.dirname(os.path.dirname(python))), r  # the venv's own wrapt


@pytest.mark.parametrize("off", ["0", "off", "", " "])
def test_off_values_import_nothing(python, off):
    r = last_json(run_in(python, REPORT, env={**PROBE, "COLO_SHIM": off}))
    assert r["at_start"] == [] and r["layers"] == 0, r


def test_pth_runs_twice_in_a_venv_but_installs_once(python, venv, tmp_path):
    # the venv really does process site-packages .pth lines twice: count with a .pth of our own
    counter = os.path.join(site_packages(venv), "zz_count_test.pth")
    marker = tmp_path / "count"
    with open(counter, "w") as fh:
        fh.write(f"import os; open({str(marker)!r}, 'a').write('x')\n")
    try:
        proc = run_in(python, REPORT, env={**PROBE, "COLO_SHIM": "shimtest", "COLO_SHIM_LOG_LEVEL": "INFO"})
    finally:
        os.unlink(counter)
    assert marker.read_text() == "xx"
    r = last_json(proc)
    assert r["layers"] == 1, r
    patched = [line for line in proc.stderr.splitlines() if "colo_shim: patched shimtest" in line]
    assert len(patched) == 6 and len(set(line.split(" INFO ")[1] for line in patched)) == 6, proc.stderr
    assert all("(shimtarget 1.0)" in line for line in patched), patched


def test_pth_executes_no_code_from_the_environment(python, tmp_path):
    marker = tmp_path / "pwned"
    payload = f'__import__("os").system("touch {marker}")'
    proc = run_in(python, "import sys; print('colo_shim.core.deferred' in sys.modules)", env={"COLO_SHIM": payload})
    assert not marker.exists()
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    named = [line for line in lines if "valid values" in line]
    assert len(named) == 1 and "COLO_SHIM=" in named[0] and "all" in named[0], proc.stderr
    others = [line for line in lines if line not in named and "patch family" not in line]
    assert others == [], proc.stderr  # 'patch family X unavailable' only while a family is unwritten


def test_vllm_entry_point_respects_colo_shim(python):
    # what vllm.plugins.load_general_plugins does: find the group, load each entry point, call it
    code = """
import importlib.metadata as md, json, os, sys
sys.path.insert(0, %r)
import activation_probe; activation_probe.install()
eps = [ep for ep in md.entry_points(group="vllm.general_plugins") if ep.name == "colo_shim"]
before = "colo_shim" in sys.modules
funcs = [ep.load() for ep in eps]
if sys.argv[1] == "set-late":
    os.environ["COLO_SHIM"] = "1"   # colo_shim is already imported (inactive) by ep.load()
for f in funcs:
    f()
import shimtarget.sub as t
print(json.dumps({"eps": [ep.value for ep in eps], "before": before,
                  "registry": "colo_shim.core.registry" in sys.modules,
                  "wrapped": "colo_shim.core.wrapping" in sys.modules and
                             isinstance(vars(t.Engine)["step"], sys.modules["colo_shim.core.wrapping"].ShimWrapper)}))
""" % TARGETS
    # COLO_SHIM is unset at start, so the .pth line stays inert and only the plugin can activate
    def run(mode):
        return last_json(run_in(python, code, args=[mode]))

    off = run("never")
    assert off == {"eps": ["colo_shim.vllm_plugin:register"], "before": False, "registry": False,
                   "wrapped": False}, off
    late = run("set-late")
    assert late == {"eps": ["colo_shim.vllm_plugin:register"], "before": False, "registry": True,
                    "wrapped": True}, late


@pytest.mark.parametrize("var,value", [("COLO_SHIM", "yes please"), ("COLO_SHIM_FENCE_TIMEOUT", "abc")])
def test_strict_bad_value_stops_the_process_with_one_line(python, var, value):
    # the .pth runs twice in a venv; before, each pass printed a traceback and the job ran anyway
    env = {"COLO_SHIM": "1", var: value, "COLO_SHIM_STRICT": "1"}
    proc = run_in(python, "print('job ran')", env=env, check=False)
    assert proc.returncode == 2 and "job ran" not in proc.stdout, proc
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{var}={value!r}" in lines[0] and "COLO_SHIM_STRICT=1: stopping" in lines[0], lines
