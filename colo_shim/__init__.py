"""colo-shim: memory fixes for colocated RL training, applied without code changes.

`import colo_shim` costs nothing unless COLO_SHIM is set, and even then the registry (and wrapt)
load only when the first target package is imported (colo_shim.core.deferred), so the activator can
sit in every interpreter of a job.
"""

__version__ = "0.1.0"
__all__ = ["install", "uninstall", "status", "fence", "__version__"]


def install(patches=None, strict=None) -> list[dict]:
    """Enable patches now or when their target imports; returns status(). Idempotent."""
    from colo_shim.core import registry

    return registry.install(patches, strict)


def uninstall() -> None:
    """Put back every original attribute exactly as it was."""
    from colo_shim.core import registry

    registry.uninstall()


def status() -> list[dict]:
    """Per patch and target: status, reason, version, supported range, call count, details."""
    from colo_shim.core import deferred as _deferred
    from colo_shim.core import registry

    _deferred.fire()
    registry.families()
    return registry.status()


def fence(reason: str = ""):
    """Finalize pending async checkpoint saves and release what pins offloaded GPU storage."""
    from colo_shim.checkpoint.fence import fence as _fence

    return _fence(reason)


def _autoinstall() -> None:
    """Arm installation for the first target import; costs nothing more until then."""
    from colo_shim.core import config as _config

    if not _config.active():
        return
    from colo_shim.core import deferred as _deferred

    _deferred.arm()


_autoinstall()
