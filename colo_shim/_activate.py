"""Shared entry of every zero-code activation path (.pth line, .start file, sitecustomize, vLLM plugin).

It imports colo_shim only when COLO_SHIM asks for it, so an installed activator costs one
environment lookup per interpreter start and executes nothing taken from the environment.
"""

import os


def activate() -> None:
    if os.environ.get("COLO_SHIM", "").strip().lower() in ("", "0", "off", "false", "no"):
        return
    try:
        import colo_shim  # noqa: F401  (installs on import when COLO_SHIM is set)
    except Exception as exc:  # a start-up hook must never stop the interpreter
        import sys

        print(f"colo_shim: activation failed: {type(exc).__name__}: {exc}", file=sys.stderr)
