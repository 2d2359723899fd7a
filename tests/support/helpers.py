"""What several rooms of the tests share: the target libraries, the doubles, a child's JSON answer.

Every behaviour that depends on import order or interpreter start-up is checked in a fresh
interpreter, never in the pytest process, where earlier tests have already imported things. The
plumbing the benchmarks use too (the interpreter, a clean environment) is harness/procs.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import textwrap

from harness.procs import PYTHON, REPO, clean_env, succeeded

DOUBLES = os.path.join(REPO, "tests", "doubles")
TARGETS = os.path.join(REPO, "tests", "targets")


# A process that leaves a spawned child holding a queue's three named semaphores and exits without
# cleanup, as a driver or trainer whose writer hangs does: stdout names the semaphores; the child and
# multiprocessing's resource tracker live on in its process group, which a test then ends.
SEMAPHORE_OWNER = """
import multiprocessing as mp, os, sys, time
def hold(q):
    time.sleep(3600)
if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ctx.Process(target=hold, args=(q,), daemon=True).start()
    names = [q._rlock._semlock.name, q._wlock._semlock.name, q._sem._semlock.name]
    print(" ".join(n.lstrip("/") for n in names), flush=True)
    os._exit(0)  # no cleanup: as a child whose writer hangs, ended by its parent
"""


def left_semaphores(names: list) -> list:
    """Those of the named semaphores still in /dev/shm."""
    return [n for n in names if os.path.exists(f"/dev/shm/sem.{n}")]


@contextlib.contextmanager
def semaphore_owner(tmp_path):
    """SEMAPHORE_OWNER started in its own session: yields (its Popen, the three semaphore names); on
    the way out kills whatever of its group still runs and unlinks what the test left in /dev/shm."""
    from colo_shim.cli import groups

    script = tmp_path / "owner.py"
    script.write_text(SEMAPHORE_OWNER)
    proc = subprocess.Popen([PYTHON, str(script)], stdout=subprocess.PIPE, text=True, start_new_session=True,
                            env=clean_env())
    names = proc.stdout.readline().split()
    proc.stdout.close()
    try:
        yield proc, names
    finally:
        for pid in groups._group(proc.pid):
            os.kill(pid, signal.SIGKILL)
        for n in left_semaphores(names):
            os.unlink(f"/dev/shm/sem.{n}")


def deps_dir(name: str, version: str) -> str:
    """Directory holding one version of a target library (installed by .ci/install_deps.sh)."""
    root = os.environ.get("COLO_SHIM_TEST_DEPS", os.path.join(REPO, ".deps"))
    path = os.path.join(root, f"{name}-{version}")
    if not os.path.isfile(os.path.join(path, ".complete")):
        raise RuntimeError(f"{path} missing: run .ci/install_deps.sh (tests need the real library)")
    return path


def doubles_root(release: str) -> str:
    """Root of one NeMo-RL release's test doubles, e.g. doubles_root('v0_7')."""
    return os.path.join(DOUBLES, f"nemo_rl_{release}")


def doubles_path(release: str) -> tuple[str, str]:
    """PYTHONPATH entries for one release's vLLM-side doubles: its root plus tests/doubles (nemo_rl_common)."""
    return (doubles_root(release), DOUBLES)


def run_python(code_or_path: str, *, pythonpath=(), env=None, timeout: float = 120, python: str = PYTHON,
               args=(), check: bool = True, cwd: str | None = None) -> subprocess.CompletedProcess:
    """Run code (or a .py file) in a fresh interpreter with REPO first on PYTHONPATH.

    env: extra variables on top of clean_env(); check: raise with the child's output on failure.
    Unless env names one, the child gets a TMPDIR of its own, removed when it ends: what it and
    its children leave there (checkpoints, a killed NVRx writer's pymp-*) goes with it.
    """
    full_env = clean_env(**(env or {}))
    paths = [REPO, *pythonpath]
    if full_env.get("PYTHONPATH"):
        paths.append(full_env["PYTHONPATH"])
    full_env["PYTHONPATH"] = os.pathsep.join(paths)
    if code_or_path.endswith(".py") and os.path.isfile(code_or_path):
        cmd = [python, code_or_path, *args]
    else:
        cmd = [python, "-c", textwrap.dedent(code_or_path), *args]
    scratch = None if "TMPDIR" in (env or {}) else tempfile.mkdtemp(prefix="c")
    if scratch:
        full_env["TMPDIR"] = scratch
    try:
        proc = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout, cwd=cwd or REPO)
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    if check:
        succeeded(proc)
    return proc


def last_json(proc: subprocess.CompletedProcess):
    """The child's result: the last stdout line, which by convention is JSON."""
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if not lines:
        raise AssertionError(f"child printed nothing\n--- stderr\n{proc.stderr}")
    return json.loads(lines[-1])
