"""The one rule every patch shares: colo-shim's own logic never raises into the host job and never
keeps upstream's own call from running.

Written once here, as dd-trace-py does for its integrations, because a try/except repeated in every
wrapper is a rule that some wrapper forgets (issue 32: an error in the fence's bookkeeping skipped
NeMo-RL main's own finalize, close and cleanup, and escaped into its offload). A wrapper names its
shim steps and hands them to one of these:

- `step(what, fn)`: shim work beside upstream's call (before or after it); an error is logged once
  per kind and counted, and the wrapper goes on to upstream's call or returns its result.
- `instead(what, shim, upstream)`: shim work that replaces upstream's call; if it raises, upstream's
  call runs as if colo-shim were off, so a failure falls back to exactly what upstream would do.

What passes through (`passthrough`): errors that are the job's, not the shim's: a checkpoint write
that failed, a writer that died with a save pending, an opt-in timeout the user set. Under
COLO_SHIM_STRICT=1 the shim's own errors pass through too: the user asked to be stopped.
"""

from __future__ import annotations

import logging

from colo_shim.core import config

log = logging.getLogger("colo_shim")

_errors: dict = {}  # what -> count of shim errors contained there, for status() and doctor
_said: set = set()


def contain(what: str, exc: BaseException) -> None:
    """Log (once per place and kind) and count a shim error the host job will not see."""
    _errors[what] = _errors.get(what, 0) + 1
    key = (what, type(exc).__name__)
    if key not in _said:
        _said.add(key)
        log.warning("colo_shim: %s failed (%s: %s); the job goes on as without colo-shim there",
                    what, type(exc).__name__, exc)


def step(what: str, fn, *args, passthrough=(), default=None, **kwargs):
    """Run one shim step; its error is contained unless it is the job's or strict mode is on.

    passthrough: exception types, or a predicate on the exception, that are the job's errors."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        return _contained(what, exc, passthrough, default)


async def step_async(what: str, awaitable, *, passthrough=(), default=None):
    """step() for an awaitable (an async engine's RPC): the same rule where the host's call is a coroutine."""
    try:
        return await awaitable
    except Exception as exc:
        return _contained(what, exc, passthrough, default)


def _contained(what: str, exc: Exception, passthrough, default):
    """The job's error, or any under strict mode, goes on up with its own traceback; a shim error stops here."""
    if _jobs(exc, passthrough) or config.strict():
        raise exc
    contain(what, exc)
    return default


def _jobs(exc: BaseException, passthrough) -> bool:
    if callable(passthrough) and not isinstance(passthrough, type):
        return bool(passthrough(exc))
    return isinstance(exc, passthrough)


_FAILED = object()


def instead(what: str, shim, upstream, *, passthrough=()):
    """shim() in place of upstream(); upstream() when the shim raises (the job's errors pass through)."""
    result = step(what, shim, passthrough=passthrough, default=_FAILED)
    if result is _FAILED:
        return upstream()
    return result


def errors() -> dict:
    return dict(_errors)
