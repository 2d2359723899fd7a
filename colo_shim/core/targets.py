"""One declared target in this process: its state, and patching it where it lives.

Separate from the registry, which decides when (an import hook, install(), a Ray actor class
arriving), because how is the part a reader checks against a drifted library: the version gate,
the attribute lookup, the upstream-fixed detector, the wrap, and what each outcome reports. Every
failure here is caught and recorded as the target's status: a broken patch never breaks the
host's import.
"""

from __future__ import annotations

import functools
import itertools
import logging
from dataclasses import dataclass, field
from typing import Callable

from colo_shim.core import ray_actors, versions, wrapping

log = logging.getLogger("colo_shim")

APPLIED, PENDING, NOT_NEEDED, SHADOWED = "applied", "pending", "not-needed", "shadowed"
UNSUPPORTED, MISSING, DISABLED, FAILED = "unsupported-version", "target-missing", "disabled", "failed"
_applied = itertools.count(1)  # application order across every target: State.seq


@dataclass
class State:
    """One target of one family: what happened to it here, and what to put back at uninstall."""

    patch: str
    target: object  # a registry.Target
    status: str = DISABLED
    reason: str = ""
    installed_version: str | None = None
    counter: object = field(default_factory=lambda: itertools.count(1), repr=False)
    original: object = field(default=wrapping._MISSING, repr=False)
    owner: object = field(default=None, repr=False)
    twins: list = field(default_factory=list, repr=False)  # (owner, original): copies Ray unpickled here
    seq: int = 0  # when it was applied: uninstall unwraps in reverse, so wrappers sharing an attribute come off


def calls(state: State) -> int:
    return int(repr(state.counter)[len("count("):-1]) - 1


def gate(state: State) -> Callable:
    """wrapt's `enabled` hook as a C-level call that counts: no Python frame per patched call."""
    return functools.partial(next, state.counter)


def apply(state: State, module, owner=None) -> None:
    """Patch the target in module; with owner, patch that class instead (a copy Ray unpickled here)."""
    target = state.target
    key = f"{state.patch}:{target.key}"
    twin = state.status == APPLIED
    try:
        if target.distribution and not twin:
            state.installed_version = versions.installed_version(target.distribution)
            if not versions.supported(state.installed_version, target.versions):
                state.status = UNSUPPORTED
                state.reason = f"{target.distribution} {state.installed_version} not in {target.versions!r}"
                log.warning("colo_shim: skipped %s %s: %s", state.patch, target.key, state.reason)
                return
        if owner is not None:
            name = target.attribute.rsplit(".", 1)[-1]
            if not hasattr(owner, name):
                return
        else:
            try:
                owner, name = wrapping.resolve_owner(module, target.attribute)
            except AttributeError as exc:
                if twin:
                    return
                state.status, state.reason = MISSING, str(exc)
                (log.warning if target.required else log.debug)("colo_shim: %s %s: %s", state.patch, target.key, exc)
                return
        if owner is state.owner or any(owner is o for o, _ in state.twins):
            return
        fixed = target.upstream_fixed(module) if target.upstream_fixed and not twin else None
        if fixed:
            state.status, state.reason = NOT_NEEDED, fixed
            log.info("colo_shim: %s %s not needed: %s", state.patch, target.key, fixed)
            return
        current = vars(owner).get(name, wrapping._MISSING)
        if wrapping.is_ours(current, key):  # left in place, silenced, by an earlier uninstall
            wrapping.set_enabled(current, gate(state))
            original = wrapping._MISSING
        else:
            original = wrapping.wrap(owner, name, target.wrapper, key, enabled=gate(state))
        if twin:
            state.twins.append((owner, original))
        else:
            state.owner, state.original, state.seq = owner, original, next(_applied)
            state.status, state.reason = APPLIED, ""
        log.info("colo_shim: patched %s %s%s (%s %s)", state.patch, target.key, " (Ray actor copy)" if twin else "",
                 target.distribution or target.module, state.installed_version or "unknown version")
        reach(state)
    except Exception as exc:  # a broken patch must not break the host's import
        if twin:  # the target holds where it was applied; status() says if an actor class bypasses it
            log.warning("colo_shim: patch %s %s on a Ray actor copy failed: %s: %s", state.patch, target.key,
                        type(exc).__name__, exc)
            return
        state.status, state.reason = FAILED, f"{type(exc).__name__}: {exc}"
        log.warning("colo_shim: patch %s %s failed: %s", state.patch, target.key, state.reason)


def owners(state: State) -> list:
    return ([state.owner] if state.owner is not None else []) + [o for o, _ in state.twins]


def reach(state: State) -> None:
    """Ray actor classes made from a patched class captured its methods: point them at the patch."""
    name = state.target.attribute.rsplit(".", 1)[-1]
    for owner in owners(state):
        ray_actors.reach(owner, name)
