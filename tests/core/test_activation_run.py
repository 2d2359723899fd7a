"""`colo-shim run -- CMD`: the bootstrap reaches the command, a chained user sitecustomize, and
every descendant (subprocess and multiprocessing spawn), each a fresh interpreter."""

import os
import sys

import pytest

from helpers import REPO, TARGETS, last_json, run_python

REPORT = os.path.join(TARGETS, "activation_report.py")
FAMILIES_OFF = {"at_start": [], "layers": 0, "enabled": None}


@pytest.fixture
def user_site(tmp_path):
    """A pre-existing user sitecustomize: it must still run, and it declares the test family first."""
    (tmp_path / "sitecustomize.py").write_text(
        "import os\n"
        "os.environ['USER_SITECUSTOMIZE_RAN'] = __file__\n"
        "import activation_probe\n"
        "activation_probe.install()\n")
    return str(tmp_path)


def _run(launcher, user_site, *extra, env=None, children=False):
    cmd = [*launcher, "run", *extra, "--", sys.executable, REPORT] + (["--children"] if children else [])
    # what pip's generated `colo-shim` script does for the entry point colo_shim.cli:main
    code = f"import sys; sys.argv = ['colo-shim'] + {cmd[1:]!r}; from colo_shim.cli import main; sys.exit(main())" \
        if launcher == ["cli"] else None
    full = code or f"import os, sys; os.execv({sys.executable!r}, {[sys.executable, *cmd]!r})"
    return last_json(run_python(full, pythonpath=(user_site, TARGETS), env=env, timeout=180))


def _assert_active(result, enabled_contains=("shimtest",)):
    assert result["at_start"] == ["colo_shim", "colo_shim.core.deferred"], result
    assert set(enabled_contains) <= set(result["enabled"]), result
    assert result["layers"] == 1, result  # wrapped once, by the start-up install
    assert result["calls"]["shimtarget.sub:Engine.step"] == 1, result
    assert result["calls"]["shimtarget.sub:free"] == 1, result
    assert result["chained"] and result["user_sitecustomize_ran"], result


def test_python_m_colo_shim_run_activates_child_and_grandchildren(user_site):
    result = _run(["-m", "colo_shim"], user_site, children=True)
    assert result["colo_shim_env"] == "all"
    _assert_active(result)
    for child in ("subprocess", "spawn"):
        assert isinstance(result[child], dict), result[child]
        assert result[child]["pid"] != result["pid"]
        _assert_active(result[child])


def test_console_script_entry_and_patches_flag(user_site):
    # the console script is colo_shim.cli:main; run it the way the generated script does
    result = _run(["cli"], user_site, "--patches", "shimtest")
    assert result["colo_shim_env"] == "shimtest"
    _assert_active(result)
    assert result["enabled"] == ["shimtest"], result


def test_patches_flag_can_leave_the_test_family_out(user_site):
    known_real = run_python("from colo_shim.core.families import FAMILIES; print(FAMILIES[0])").stdout.strip()
    result = _run(["-m", "colo_shim"], user_site, "--patches", known_real)
    assert "colo_shim.core.deferred" in result["at_start"], result
    # shimtarget is no root of the requested family, so importing it neither installs nor wraps
    assert result["enabled"] is None and result["layers"] == 0, result


def test_existing_colo_shim_value_is_kept(user_site):
    result = _run(["-m", "colo_shim"], user_site, env={"COLO_SHIM": "shimtest"})
    assert result["colo_shim_env"] == "shimtest"
    assert result["enabled"] == ["shimtest"], result


def test_without_run_nothing_is_imported(user_site):
    result = last_json(run_python(REPORT, pythonpath=(user_site, TARGETS), args=["--children"], timeout=180))
    for r in (result, result["subprocess"], result["spawn"]):
        assert {k: r[k] for k in FAMILIES_OFF} == FAMILIES_OFF, r
        assert r["user_sitecustomize_ran"] and not r["chained"], r


def test_run_without_command_is_a_usage_error():
    proc = run_python("import sys; from colo_shim.cli import main; sys.exit(main(['run', '--']))", check=False)
    assert proc.returncode == 2 and "give a command" in proc.stderr


def test_bootstrap_reached_through_a_symlink_still_chains_once(user_site, tmp_path):
    link = tmp_path / "bootstrap-link"
    link.symlink_to(os.path.join(REPO, "colo_shim", "bootstrap"))
    code = ("import os, sys; os.execv(sys.executable, [sys.executable, %r])" % REPORT)
    r = last_json(run_python(code, pythonpath=(str(link), os.path.join(REPO, "colo_shim", "bootstrap"), user_site,
                                               TARGETS), env={"COLO_SHIM": "shimtest"}, timeout=60))
    assert r["enabled"] == ["shimtest"] and r["layers"] == 1 and r["chained"] and r["user_sitecustomize_ran"], r
