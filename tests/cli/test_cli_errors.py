"""The command line answers every user mistake with one line and a non-zero status, never a traceback.

Each case is a real `colo-shim` process. Nothing here runs the demo's checkpoint cycle (that is
tests/cli/test_demo.py, once): its argument and setup errors are refused before any run starts,
and a broken NVRx is a stand-in package that fails at import, which takes seconds, not minutes.
"""

import os
import re
import subprocess
import sys

import pytest

from harness.procs import PYTHON, REPO, clean_env
from helpers import deps_dir, run_python

MAIN = "import sys; from colo_shim.cli import main; sys.exit(main(sys.argv[1:]))"


def cli(*args, env=None, pythonpath=(), timeout=120):
    return run_python(MAIN, args=args, env=env, pythonpath=pythonpath, check=False, timeout=timeout)


def _lines(text):
    return [line for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version(flag):
    proc = cli(flag)
    assert proc.returncode == 0 and re.fullmatch(r"colo-shim \d+\.\d+\.\d+\S*\n", proc.stdout), proc


def _described(help_text: str) -> dict:
    """argparse's rows: '  --mib MIB   words...' (the words may start on the next line) -> {'--mib': words}."""
    rows, lines = {}, help_text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^  (\S.*?)(?:\s{2,}(\S.*))?$", line)
        if m and not line.startswith("   "):
            after = lines[i + 1] if i + 1 < len(lines) else ""
            words = m.group(2) or (after.strip() if after.startswith("   ") else "")
            for token in re.split(r",\s*", m.group(1)):
                rows[token.split()[0] if not token.startswith("-- ") else token.split()[1]] = words
    return rows


@pytest.mark.parametrize("command,arguments", [
    ("run", ["--patches", "--bundle", "COMMAND"]), ("bundle", ["DIR"]),
    ("doctor", ["--json", "--import", "--from", "--verbose"]), ("demo", ["--mib", "--timeout", "--json"]),
])
def test_every_argument_is_described_in_help(command, arguments):
    proc = cli(command, "--help")
    assert proc.returncode == 0, proc.stderr
    rows = _described(proc.stdout)
    for argument in arguments:
        assert len(rows.get(argument, "").split()) >= 3, f"{argument} not described:\n{proc.stdout}"


def test_run_help_lists_every_family_of_the_registry():
    from colo_shim.core.families import FAMILIES

    text = " ".join(cli("run", "--help").stdout.split())
    described = re.search(r"--patches FAMILIES (.*?) --bundle", text).group(1)
    named = described.split("when set), ")[-1].split(", ")  # after "all (default, or COLO_SHIM when set)"
    assert named == list(FAMILIES), described


@pytest.fixture(scope="module")
def run_bundle(tmp_path_factory):
    return str(tmp_path_factory.mktemp("run-bundle"))


@pytest.mark.parametrize("flags,env,says", [
    ((), {"COLO_SHIM": "0"}, "(COLO_SHIM='0' inherited)"),
    (("--patches", ""), {}, "(--patches '')"),
    (("--patches", "off"), {"COLO_SHIM": "1"}, "(--patches 'off')"),
    ((), {"COLO_SHIM": "nvrx", "COLO_SHIM_DISABLE": "nvrx"}, "(COLO_SHIM_DISABLE='nvrx' inherited, which removes "
                                                            "every family of 'nvrx')"),
    ((), {}, None), (("--patches", "all"), {"COLO_SHIM": "0"}, None), ((), {"COLO_SHIM": "true"}, None),
])
def test_run_says_in_one_line_when_the_shim_is_off_and_why(flags, env, says, run_bundle):
    proc = cli("run", "--bundle", run_bundle, *flags, "--", sys.executable, "-c", "print('job ran')", env=env)
    assert proc.returncode == 0 and proc.stdout == "job ran\n", proc
    if says is None:
        assert proc.stderr == "", proc.stderr
    else:
        assert _lines(proc.stderr) == [f"colo-shim run: colo-shim is OFF in this job {says}: the command runs "
                                       "unpatched; --patches all turns it on"], proc.stderr


def test_top_level_help_lists_every_command():
    proc = cli("--help")
    assert proc.returncode == 0 and all(c in proc.stdout for c in ("run", "bundle", "doctor", "demo", "--version"))


def test_bundle_into_an_impossible_place_is_one_line():
    proc = cli("bundle", "/proc/nope")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert _lines(proc.stderr) == ["colo-shim bundle: error: No such file or directory: '/proc/nope'"], proc.stderr


def test_a_closed_pipe_ends_quietly():
    # `colo-shim doctor | head -1`: the reader is gone before the table is written
    env = clean_env(PYTHONPATH=REPO)
    proc = subprocess.Popen([PYTHON, "-c", MAIN, "doctor"], env=env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141 and err == "", err


def test_doctor_says_unset_not_none():
    proc = cli("doctor")
    header = proc.stdout.splitlines()[0]
    assert "COLO_SHIM unset (inactive" in header and "None" not in header, header


@pytest.mark.parametrize("args,says", [
    (["--mib", "-5"], "argument --mib: must be a positive number, got '-5'"),
    (["--mib", "lots"], "argument --mib: must be a positive number, got 'lots'"),
    (["--timeout", "0"], "argument --timeout: must be a positive number, got '0'"),
    (["--bogus"], "unrecognized arguments: --bogus"),
])
def test_demo_refuses_bad_arguments_before_running(args, says):
    proc = cli("demo", *args)
    assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert "starting" not in proc.stderr  # nothing ran


def test_demo_without_nvrx_says_how_to_get_it():
    proc = cli("demo")  # the tests' PYTHONPATH holds no NVRx
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert _lines(proc.stderr) == [line for line in _lines(proc.stderr) if "nvidia_resiliency_ext is not importable"]
    assert "pip install nvidia-resiliency-ext" in proc.stderr and ".ci/install_deps.sh" in proc.stderr


def test_demo_exits_1_when_the_shim_row_does_not_show_the_fix(tmp_path, short_tmpdir):
    broken = tmp_path / "nvidia_resiliency_ext"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise ImportError('a broken NVRx build')\n")
    proc = cli("demo", "--mib", "1", "--timeout", "300", pythonpath=(str(tmp_path),), timeout=400,
               env={"TMPDIR": short_tmpdir})
    assert proc.returncode == 1 and "Traceback" not in proc.stdout, (proc.stdout, proc.stderr)
    assert os.listdir(short_tmpdir) == []  # a failed demo leaves nothing behind either (issue 35 item 2)
    last = _lines(proc.stdout)[-1]
    assert last.startswith("FAILED: the 'with shim' row does not show the fix (ImportError: a broken NVRx build)")
    assert "the good result is 'checkpoint == live: yes'" in last
    progress = [line for line in _lines(proc.stderr) if line.startswith("colo-shim demo: ")]
    assert any("with shim: starting a fresh process" in line for line in progress), proc.stderr
    assert any("importing torch and NVRx" in line for line in progress), proc.stderr


@pytest.mark.parametrize("version", ["0.4.1", "0.5.0"])
def test_demo_on_an_nvrx_without_the_cached_writer_says_not_supported_here(version):
    # issue 35 item 8: on 0.4.1 the demo showed NVRx "?" and exited 0 with both rows "yes"
    proc = cli("demo", "--mib", "1", pythonpath=(deps_dir("nvrx", version),), timeout=400)
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr, proc
    assert _lines(proc.stderr) == [line for line in _lines(proc.stderr) if line.startswith(
        f"colo-shim demo: not supported here: NVRx {version} has no cached checkpoint writer (NVRx >= 0.6.0)")]
    assert "starting" not in proc.stderr  # refused before any run


def test_demo_children_read_the_nvrx_version_beside_the_package_when_it_has_no_dunder_version():
    code = "import nvidia_resiliency_ext as n; from colo_shim.cli.demo_child import nvrx_version as v; " \
           "print(getattr(n, '__version__', None), v())"
    assert run_python(code, pythonpath=(deps_dir("nvrx", "0.4.1"),)).stdout.split() == ["None", "0.4.1"]


def test_demo_verdict_on_a_cpu_where_both_rows_are_right_says_it_cannot_show_the_bug():
    from colo_shim.cli.demo import verdict

    rows = [dict(_row(shim, held=None, equal=True), device="cpu (NVRx shm path)", nvrx="0.6.0") for shim in (0, 1)]
    code, closing = verdict(rows)
    assert code == 2 and closing.startswith("NOT SHOWN HERE: both rows are right on this machine (cpu (NVRx shm "
                                            "path), NVRx 0.6.0)"), closing
    assert "held after offload" not in closing and "NVRx 0.7.0 on a CPU" in closing, closing


def _row(shim, **values):
    return {"shim": shim, "device": "NVIDIA H200", "nvrx": "0.7.0", "cached": 2048 << 20, "seconds": 20.0,
            **values}


@pytest.mark.parametrize("with_shim,code,starts", [
    (dict(held=66 << 20, equal=True), 0, "the good result is 'checkpoint == live: yes': the 'with shim' row has it"),
    (dict(held=2118 << 20, equal=True), 1, "FAILED: the 'with shim' row still holds 2118.0 MiB of 2048.0 MiB"),
    (dict(held=66 << 20, equal=False), 1, "FAILED: the 'with shim' row does not show the fix (its checkpoint"),
])
def test_demo_verdict_on_a_gpu_counts_the_memory_held_after_offload(with_shim, code, starts):
    # no GPU here: the verdict alone, on rows shaped as a GPU run reports them (README's H200 table)
    from colo_shim.cli.demo import verdict

    got = verdict([_row(False, held=2118 << 20, equal=True), _row(True, **with_shim)])
    assert got[0] == code and got[1].startswith(starts), got
