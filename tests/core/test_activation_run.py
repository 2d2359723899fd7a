"""`colo-shim run -- CMD`: the bootstrap reaches the command, a chained user sitecustomize, and
every descendant (subprocess and multiprocessing spawn), each a fresh interpreter."""

import json
import os
import sys

import pytest

from harness.procs import REPO
from helpers import TARGETS, last_json, run_python

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


# --- interpreters that cannot import colo_shim (issue 16, item 3) -------------------------------

def _run_cli(python_cmd, *run_args, env=None, user_site=None, bundle=None):
    """`colo-shim run` from the test venv, with colo_shim found by the CLI only (not on PYTHONPATH),
    so the command's own interpreter sees nothing of ours but what `run` puts there."""
    from harness.envs import run_in

    argv = ["run", *(["--bundle", bundle] if bundle else []), *run_args, "--", *python_cmd]
    code = f"import sys; sys.path.insert(0, {REPO!r}); from colo_shim.cli import main; sys.exit(main({argv!r}))"
    path = os.pathsep.join(p for p in (user_site, TARGETS) if p)
    return run_in(sys.executable, code, env={"PYTHONPATH": path, **(env or {})}, check=False, timeout=180)


@pytest.mark.parametrize("version", ["3.10", "3.11", "3.12", "3.13"])
def test_run_reaches_an_interpreter_without_colo_shim(version, user_site, tmp_path_factory):
    from harness.envs import plain_venv, require_python, venv_python

    from harness.envs import run_in

    python = venv_python(plain_venv()) if version == "3.12" else require_python(version)
    assert "No module named 'colo_shim'" in run_in(python, "import colo_shim", check=False).stderr
    own = run_in(python, "import os, wrapt; print(os.path.dirname(wrapt.__file__))", check=False)
    bundle = str(tmp_path_factory.getbasetemp() / "run-bundle")  # shared by the versions
    # a wrapt of the interpreter's own (pyenv's 3.11 has one) wins over the bundled pure-Python copy
    wrapt_from = own.stdout.strip() if own.returncode == 0 else os.path.join(bundle, "bundle-")
    proc = _run_cli([python, REPORT, "--children"], "--patches", "shimtest", user_site=user_site, bundle=bundle)
    assert proc.returncode == 0, proc.stderr
    r = last_json(proc)
    for child in (r, r["subprocess"], r["spawn"]):
        assert child["at_start"] == ["colo_shim", "colo_shim.core.deferred"], (child, proc.stderr)
        assert child["enabled"] == ["shimtest"] and child["layers"] == 1, child
        assert child["calls"]["shimtarget.sub:free"] == 1, child
        assert child["wrapt"].startswith(wrapt_from), (child, wrapt_from)
        assert child["chained"] and child["user_sitecustomize_ran"], child
    assert "NOT active" not in proc.stderr, proc.stderr


def test_an_interpreter_that_still_cannot_import_warns_once_and_leaves_a_record(tmp_path):
    """Python 3.8 is older than the shim supports: `import colo_shim` fails there even with the bundle."""
    from harness.envs import require_python

    python = require_python("3.8")
    status = tmp_path / "status"
    proc = _run_cli([python, "-c", "print('job ran')"], env={"COLO_SHIM_STATUS_DIR": str(status)},
                    bundle=str(tmp_path / "b"))
    assert proc.returncode == 0 and proc.stdout.strip() == "job ran", proc.stderr  # the job is not stopped
    warnings = [line for line in proc.stderr.splitlines() if "colo_shim" in line]
    assert len(warnings) == 1, proc.stderr
    assert f"{python} (Python 3.8." in warnings[0] and "NOT active" in warnings[0], warnings
    assert warnings[0].endswith("Fix: colo-shim needs Python 3.10-3.13: run this part of the job with one of those")
    shown = run_python("import sys; from colo_shim.cli import main; sys.exit(main(sys.argv[1:]))",
                       args=("doctor", "--from", str(status)))
    assert "NOT active: " + python in shown.stdout and "Python 3.8." in shown.stdout, shown.stdout


def test_bootstrap_without_a_copy_of_colo_shim_warns_instead_of_a_silent_no_op(tmp_path):
    """The in-package bootstrap dir alone (what `run` used to put there) in a venv without colo_shim."""
    from harness.envs import plain_venv, run_in, venv_python

    python = venv_python(plain_venv())
    env = {"PYTHONPATH": os.path.join(REPO, "colo_shim", "bootstrap"), "COLO_SHIM": "1",
           "COLO_SHIM_STATUS_DIR": str(tmp_path)}
    proc = run_in(python, "print('job ran')", env=env)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and python in lines[0] and "No module named 'colo_shim'" in lines[0], proc.stderr
    assert "Fix: start the job with `colo-shim run`" in lines[0] and "pip install colo-shim" in lines[0], lines
    [record] = [json.loads(p.read_text()) for p in tmp_path.glob("*.json")]
    assert record["python"] == python and record["records"] == [] and "colo_shim" in record["not_active"], record
    assert record["argv"] == ["-c"], record  # sys.argv as Python has it while site runs


@pytest.mark.parametrize("where", ["--patches", "env"])
def test_unknown_patch_family_is_an_error_naming_the_valid_ones(where, tmp_path):
    args, env = (["--patches", "nope"], None) if where == "--patches" else ([], {"COLO_SHIM": "nvrx,nope"})
    marker = tmp_path / "ran"
    proc = _run_cli(["touch", str(marker)], *args, env=env, bundle=str(tmp_path / "b"))
    assert proc.returncode == 2 and not marker.exists(), proc
    lines = [line for line in proc.stderr.splitlines() if line.strip() and line.startswith("colo-shim run")]
    assert len(lines) == 1 and "'nope'" in lines[0] and "valid: all, nvrx, offload, megatron, vllm" in lines[0], lines
    if where == "--patches":  # from the environment, the CLI's own `import colo_shim` already warned once
        assert proc.stderr.strip() == lines[0], proc.stderr


def test_strict_bad_value_at_start_up_stops_with_one_line(tmp_path):
    proc = _run_cli([sys.executable, "-c", "print('job ran')"], bundle=str(tmp_path / "b"),
                    env={"COLO_SHIM_STRICT": "1", "COLO_SHIM_FENCE_TIMEOUT": "abc"})
    assert proc.returncode == 2 and "job ran" not in proc.stdout, proc
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "COLO_SHIM_FENCE_TIMEOUT='abc'" in lines[0] and "stopping" in lines[0], lines
