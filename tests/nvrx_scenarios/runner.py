"""Runs one scenario in its own process session so that a hung trainer and its NVRx worker are
both killed at the deadline (a plain subprocess timeout would leave the spawned worker behind)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from colo_shim.cli import groups
from harness.procs import PYTHON, REPO, clean_env
from helpers import deps_dir

HERE = os.path.dirname(os.path.abspath(__file__))
SCENARIO = os.path.join(HERE, "scenario.py")


@dataclass
class Outcome:
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool

    @property
    def result(self):
        lines = [line for line in self.stdout.splitlines() if line.startswith("{")]
        if not lines:
            raise AssertionError(f"no result (rc={self.returncode}, timed out={self.timed_out})\n"
                                 f"--- stdout\n{self.stdout[-3000:]}\n--- stderr\n{self.stderr[-3000:]}")
        return json.loads(lines[-1])


@dataclass
class Cases:
    """The outcome of run_cases: each case's result, or why there is none, and what it wrote to stderr."""
    outcome: Outcome

    def _lines(self) -> dict:
        lines = [json.loads(line) for line in self.outcome.stdout.splitlines() if line.startswith('{"case"')]
        return {line["case"]: line for line in lines}

    def result(self, key: str):
        line = self._lines().get(key)
        if line is None:  # it hung or the process died: the runner's deadline ended what was left
            raise AssertionError(f"case {key} never ended (rc={self.outcome.returncode}, timed out="
                                 f"{self.outcome.timed_out})\n--- stderr\n{self.outcome.stderr[-4000:]}")
        if "error" in line:
            raise AssertionError(f"case {key} raised\n{line['error']}\n--- its stderr\n{self.stderr(key)[-3000:]}")
        return line["result"]

    def stderr(self, key: str) -> str:
        """What was written to stderr from this case's start to the next case's (its workers' too)."""
        parts = self.outcome.stderr.split(f"[case {key}]\n", 1)
        return parts[1].split("\n[case ", 1)[0] if len(parts) == 2 else ""


def pythonpath(nvrx: str, mcore: str | None = "0.19.2", doubles: str | None = None) -> str:
    parts = [REPO, HERE, deps_dir("nvrx", nvrx)]
    if mcore:
        parts.append(deps_dir("mcore", mcore))
    if doubles:
        parts += [os.path.join(REPO, "tests", "doubles", f"nemo_rl_{doubles}"), os.path.join(REPO, "tests", "doubles")]
    return os.pathsep.join(parts)


def run(name: str, opts: dict, *, nvrx: str, mcore: str | None = "0.19.2", doubles: str | None = None,
        timeout: float = 90, env: dict | None = None, until=None, script: str = SCENARIO) -> Outcome:
    """until(stdout, stderr) -> bool stops early (and kills) once a condition is seen.

    The scenario gets a TMPDIR of its own, removed with its output once it and its workers are
    killed: its checkpoint directories and the killed workers' pymp-* go with it."""
    scratch = tempfile.mkdtemp(prefix="s")
    try:
        return _run(name, opts, nvrx, mcore, doubles, timeout, dict(env or {}, TMPDIR=scratch), until, script)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def run_cases(cases: dict, **kwargs) -> Cases:
    """cases: {key: (scenario name, options)}, run in this order in one process (entry.py says when
    cases may share one); kwargs as run(), whose timeout is then the whole run's safety net."""
    return Cases(run("--cases", [[key, name, opts] for key, (name, opts) in cases.items()], **kwargs))


def _run(name, opts, nvrx, mcore, doubles, timeout, env, until, script) -> Outcome:
    full_env = clean_env(**env)
    full_env["PYTHONPATH"] = pythonpath(nvrx, mcore, doubles)
    out_path = os.path.join(env["TMPDIR"], "scenario")
    with open(out_path + ".out", "w+") as out, open(out_path + ".err", "w+") as err:
        proc = subprocess.Popen([PYTHON, script, name, json.dumps(opts)], stdout=out, stderr=err, env=full_env,
                                cwd=REPO, start_new_session=True, stdin=subprocess.DEVNULL)
        deadline, timed_out = time.monotonic() + timeout, False
        try:
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    timed_out = True
                    break
                if until is not None and until(_read(out_path + ".out"), _read(out_path + ".err")):
                    timed_out = True  # still running when the condition held: reported as not exited
                    break
                time.sleep(0.2)
        finally:
            groups.end(proc.pid)  # the trainer and any worker it left; the resource tracker unlinks their semaphores
            proc.wait()
        return Outcome(None if timed_out else proc.returncode, _read(out_path + ".out"), _read(out_path + ".err"),
                       timed_out)


def _read(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read()


if __name__ == "__main__":  # manual use: python runner.py NAME JSON NVRX
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "support"))
    print(run(sys.argv[1], json.loads(sys.argv[2]), nvrx=sys.argv[3]).stdout)
