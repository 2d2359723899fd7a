"""Shared entry of every zero-code activation path (.pth line, .start file, sitecustomize, vLLM plugin).

The .pth line imports this module only when COLO_SHIM asks for it, so an installed activator costs
one environment lookup per interpreter start and executes nothing taken from the environment.
Several paths can reach one process (a venv runs .pth lines twice; the bootstrap and the vLLM
plugin may both fire), so only the first call acts. `import colo_shim` arms the shim by itself
when COLO_SHIM is set (colo_shim.core.deferred installs at the first target import); when something
imported colo_shim earlier while the switch was off (a vLLM plugin loaded before its register()
runs), arming is asked for explicitly.
"""

import sys

_done = False


def activate() -> None:
    global _done
    if _done:
        return
    imported_before = "colo_shim" in sys.modules
    try:
        from colo_shim.core import config  # the knob table: os only, no registry, no wrapt

        if not config.active():
            return
        _done = True
        import colo_shim

        if imported_before and "colo_shim.core.registry" not in sys.modules:
            colo_shim._autoinstall()
    except Exception as exc:  # a start-up hook must never stop the interpreter
        print(f"colo_shim: activation failed: {type(exc).__name__}: {exc}", file=sys.stderr)
