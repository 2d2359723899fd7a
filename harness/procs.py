"""Child interpreters: the repo, the interpreter, and an environment without colo-shim's switches.

Every behaviour that depends on import order or interpreter start-up is measured in a fresh
interpreter, never in the parent, where earlier work has already imported things; and a child must
not inherit the parent's COLO_SHIM_* settings, or it measures the parent's configuration.
"""

from __future__ import annotations

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = os.environ.get("COLO_SHIM_TEST_PYTHON", sys.executable)
KEPT = ("COLO_SHIM_TEST_DEPS", "COLO_SHIM_LEDGER_DIR")


def clean_env(**overrides) -> dict:
    """The parent's environment without colo-shim switches, plus overrides (None deletes). The ledger's
    directory is a place, not a switch: tests keep every child's ledger in one of their own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLO_SHIM") or k in KEPT}
    env.pop("PYTHONPATH", None)
    env["PYTHONUNBUFFERED"] = "1"
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def succeeded(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """proc, or an AssertionError carrying everything the child said (a failure is read in CI logs)."""
    if proc.returncode != 0:
        raise AssertionError(f"child failed (rc={proc.returncode})\n--- stdout\n{proc.stdout}\n--- stderr\n"
                             f"{proc.stderr}")
    return proc
