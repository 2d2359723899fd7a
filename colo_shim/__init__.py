"""colo-shim: memory fixes for colocated RL training, applied without code changes.

`import colo_shim` costs nothing unless COLO_SHIM is set: the registry (and wrapt) load only
when something is to be installed, so the activator can sit in every interpreter of a job.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["install", "uninstall", "status", "fence", "__version__"]


def install(patches=None, strict=None) -> list[dict]:
    """Enable patches now or when their target imports; returns status(). Idempotent."""
    from colo_shim import registry

    return registry.install(patches, strict)


def uninstall() -> None:
    """Put back every original attribute exactly as it was."""
    from colo_shim import registry

    registry.uninstall()


def status() -> list[dict]:
    """Per patch and target: status, reason, version, supported range, call count, details."""
    from colo_shim import registry

    registry.families()
    return registry.status()


def fence(reason: str = ""):
    """Finalize pending async checkpoint saves and release what pins offloaded GPU storage."""
    from colo_shim.checkpoint_fence import fence as _fence

    return _fence(reason)


def _autoinstall() -> None:
    from colo_shim import _config

    if not _config.active():
        return
    try:
        install()
        directory = __import__("os").environ.get(_config.STATUS_DIR)
        if directory:
            import atexit

            from colo_shim import doctor

            atexit.register(doctor.dump, directory)
    except _config.ConfigError:
        raise
    except Exception as exc:  # never break the host job at import time
        import logging

        logging.getLogger("colo_shim").warning("colo_shim: install failed: %s: %s", type(exc).__name__, exc)


_autoinstall()
