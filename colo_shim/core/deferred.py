"""Wait for the first target import before paying for the registry.

An activated interpreter that never imports NVRx, megatron, NeMo-RL or vLLM (a tokenizer worker,
a Ray agent, a shell-out to `python -c`) must not pay for wrapt, logging and the families, which
together cost more than the rest of interpreter start-up. A finder at the front of sys.meta_path
sees every import; the first one under a requested family's top-level package installs the shim
while that import is still being resolved, so the post-import hooks exist before any target
submodule loads. The finder never removes itself (the import system may be iterating
sys.meta_path at that moment); once fired it is a one-line no-op.
"""

import sys

_trigger = None


class _Trigger:
    def __init__(self, roots, names):
        self.roots, self.names, self.fired = frozenset(roots), names, False

    def find_spec(self, fullname, path=None, target=None):
        if not self.fired and fullname.partition(".")[0] in self.roots:
            fire()
        return None


def arm() -> None:
    """Called by `import colo_shim` when COLO_SHIM is set; idempotent."""
    global _trigger
    if _trigger is not None:
        return
    from colo_shim.core import config
    from colo_shim.core.families import FAMILIES, TRIGGERS

    names = config.requested_patches(FAMILIES)
    config.check_environment()
    _trigger = _Trigger({root for name in names for root in TRIGGERS[name]}, names)
    directory = config.get(config.STATUS_DIR)
    if directory:
        import atexit

        atexit.register(_dump, directory)
    if any(root in sys.modules for root in _trigger.roots):
        fire()
    else:
        sys.meta_path.insert(0, _trigger)


def fire() -> None:
    """Install now if armed and not yet installed (first target import, or status() asked)."""
    trigger = _trigger
    if trigger is None or trigger.fired:
        return
    trigger.fired = True
    from colo_shim.core import config, registry

    try:
        registry.install(trigger.names)
    except config.ConfigError as exc:  # strict, and a target cannot be patched: the job asked to stop
        config.stop(str(exc))
    except Exception as exc:  # never break the host's import
        config.complain(f"install failed: {type(exc).__name__}: {exc}", strict_mode=False)


def _dump(directory: str) -> None:
    """At exit: this process's status for `colo-shim doctor --from DIR` (decisions happen in Ray actors)."""
    import json
    import os
    import socket

    from colo_shim.core import config, registry

    fire()
    registry.families()
    path = os.path.join(directory, f"{socket.gethostname()}-{os.getpid()}.json")
    payload = {"host": socket.gethostname(), "pid": os.getpid(), "argv": sys.argv, "records": registry.status()}
    try:
        os.makedirs(directory, exist_ok=True)
        with open(path + ".tmp", "w") as fh:
            json.dump(payload, fh, default=str)
        os.replace(path + ".tmp", path)
    except OSError as exc:  # at exit a traceback would be the job's last words
        config.complain(f"could not write {path}: {exc} ({config.STATUS_DIR})", strict_mode=False)
