"""Patch declarations and their lazy, idempotent, fail-open application.

A family declares what it wraps (Target) and where it is safe (versions, upstream-fix detector);
this module decides when: at once if the target module is already imported, else from a wrapt
post-import hook. wrapt hooks fire once and cannot be unregistered, so each hook only consults
state here, which is what makes uninstall/re-install and repeated install() calls safe. A class
that `@ray.remote` turned into an actor class captured its methods before any hook ran:
core/ray_actors.py points those at the patch, here and in the actor process, and status() says
`shadowed` wherever it could not. How one target is patched (version gate, lookup, upstream-fixed
detector, wrap) is core/targets.py.
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
import types
from dataclasses import dataclass
from typing import Callable

from colo_shim.core import config, guard, ray_actors, versions, wrapping
from colo_shim.core.targets import (APPLIED, DISABLED, FAILED, MISSING, PENDING, SHADOWED, UNSUPPORTED, State, apply,
                                    calls, owners, reach)

log = logging.getLogger("colo_shim")
RAY_CLASS = ".__ray_actor_class__"  # a target on the class behind a Ray ActorClass (NeMo-RL <= v0.5)


@dataclass(frozen=True)
class Target:
    module: str
    attribute: str
    wrapper: Callable
    distribution: str | None = None
    versions: str = ""
    upstream_fixed: Callable | None = None
    required: bool = True

    @property
    def key(self) -> str:
        return f"{self.module}:{self.attribute}"


@dataclass(frozen=True)
class Patch:
    name: str
    summary: str
    targets: tuple
    report: Callable | None = None


_lock = threading.RLock()
_patches: dict[str, Patch] = {}
_states: dict[tuple[str, str], State] = {}
_hooked: set[str] = set()
_enabled: set[str] = set()
_broken: dict[str, str] = {}


def families() -> dict[str, Patch]:
    """Import every family declaration once (cheap: families import no target library)."""
    from colo_shim.core.families import FAMILIES, MODULES

    with _lock:
        for name in FAMILIES:
            if name not in _patches and name not in _broken:
                try:
                    register(importlib.import_module(MODULES[name]).PATCH)
                except Exception as exc:  # one broken family must not take the others down
                    _broken[name] = f"{type(exc).__name__}: {exc}"
                    log.warning("colo_shim: patch family %s unavailable: %s", name, _broken[name])
        return dict(_patches)


def register(patch: Patch) -> Patch:
    with _lock:
        _patches[patch.name] = patch
        for target in patch.targets:
            _states.setdefault((patch.name, target.key), State(patch.name, target))
    return patch


def _class_path(target: Target) -> str:
    path = target.attribute.rpartition(".")[0]
    return path[: -len(RAY_CLASS)] if path.endswith(RAY_CLASS) else path


def _on_actor_class(cls) -> None:
    """Ray loaded an actor class into this process: patch each class of its MRO that a target names.

    Its bases are the module's own classes where pickled by reference, else by-value copies with
    the same module and qualname that nothing imported here (the whole worker class, NeMo-RL <= v0.5).
    """
    with _lock:
        for base in cls.__mro__[1:]:
            where, qualname = getattr(base, "__module__", None), getattr(base, "__qualname__", None)
            for state in list(_states.values()):
                target = state.target
                if (state.patch in _enabled and state.status in (PENDING, APPLIED) and target.module == where
                        and _class_path(target) == qualname):
                    module = sys.modules.get(where) or types.SimpleNamespace(
                        __name__=where, **{c.__qualname__: c for c in cls.__mro__
                                           if c.__module__ == where and "." not in c.__qualname__})
                    apply(state, module, owner=base)
        for state in _states.values():
            if state.status == APPLIED:
                reach(state)


def _on_import(module) -> None:
    with _lock:
        for state in list(_states.values()):
            # APPLIED too: when a Ray actor's copy of the class came first, the module's own class follows
            mine = state.target.module == module.__name__ and state.patch in _enabled
            if mine and state.status in (PENDING, APPLIED):
                apply(state, module)


def _hook(module_name: str) -> None:
    if module_name in _hooked:
        return
    _hooked.add(module_name)
    import wrapt

    wrapt.register_post_import_hook(_on_import, module_name)


def install(patches=None, strict=None) -> list[dict]:
    """Enable patches (default: COLO_SHIM, else all); safe to call repeatedly from any thread.

    strict, when given, decides over COLO_SHIM_STRICT: a caller's argument is never worth less than the environment.
    """
    asked = None if strict is None else bool(strict)
    strict = config.strict() if asked is None else asked
    config.check_environment(asked)
    config.configure_logging()
    known = families()
    names = config.requested_patches(tuple(known), patches, asked)
    with _lock:
        _enabled.update(names)
        for state in _states.values():
            if state.patch not in _enabled or state.status not in (DISABLED, PENDING):
                continue
            target = state.target
            if strict and target.distribution:
                version = versions.installed_version(target.distribution)
                if version is not None and not versions.supported(version, target.versions):
                    raise config.ConfigError(
                        f"{state.patch}: {target.distribution} {version} not in {target.versions!r} ({target.key})")
            state.status, state.reason = PENDING, ""
            module = sys.modules.get(target.module)
            if module is not None:
                apply(state, module)
                broken = state.status in (FAILED, UNSUPPORTED) or (state.status == MISSING and target.required)
                if strict and broken:
                    raise config.ConfigError(f"{state.patch} {target.key}: {state.status}: {state.reason}")
            else:
                _hook(target.module)
        try:
            ray_actors.install(_on_actor_class)
        except Exception as exc:  # Ray internals drifted: status() says where a patch is shadowed
            log.warning("colo_shim: Ray actor support unavailable: %s: %s", type(exc).__name__, exc)
    return status()


def uninstall() -> None:
    """Restore every original exactly; wrappers someone else wrapped over stay but turn inert."""
    with _lock:
        for state in sorted(_states.values(), key=lambda s: -s.seq):  # last applied (outermost) first
            if state.status == APPLIED:
                key = f"{state.patch}:{state.target.key}"
                name = state.target.attribute.rsplit(".", 1)[-1]
                if not wrapping.unwrap(state.owner, name, state.original, key):
                    ours = _find_ours(vars(state.owner).get(name), key)
                    if ours is not None:
                        wrapping.set_enabled(ours, False)
                    log.warning("colo_shim: %s was re-wrapped by another library; left inert", state.target.key)
                for owner, original in state.twins:
                    wrapping.unwrap(owner, name, original, key)
            state.status, state.reason, state.owner, state.twins = DISABLED, "", None, []
            state.original = wrapping._MISSING
        _enabled.clear()
        ray_actors.uninstall()


def _find_ours(obj, key: str):
    while obj is not None:
        if wrapping.is_ours(obj, key):
            return obj
        obj = getattr(obj, "__wrapped__", None)
    return None


def enabled(name: str) -> bool:
    return name in _enabled


def status() -> list[dict]:
    with _lock:
        details = {}
        for name, patch in _patches.items():
            try:
                details[name] = patch.report() if patch.report and name in _enabled else {}
            except Exception as exc:
                details[name] = {"error": f"{type(exc).__name__}: {exc}"}
            contained = {what: n for what, n in guard.errors().items() if what.startswith(f"{name}:")}
            if contained:  # colo-shim's own errors the job did not see (core/guard.py)
                details[name] = dict(details[name], shim_errors=contained)
        broken = [{"name": name, "target": "*", "status": FAILED, "reason": reason, "installed_version": None,
                   "distribution": None, "supported": "", "calls": 0, "details": {}}
                  for name, reason in _broken.items()]
        return broken + [
            {
                "name": s.patch,
                "target": s.target.key,
                "status": row[0],
                "reason": row[1],
                "installed_version": s.installed_version,
                "distribution": s.target.distribution,
                "supported": s.target.versions,
                "calls": calls(s),
                "details": details.get(s.patch, {}),
            }
            for s in _states.values()
            for row in (_reachable(s),)
        ]


def _reachable(state: State) -> tuple[str, str]:
    """(status, reason) as this process really calls the target: never `applied` when bypassed."""
    if state.status != APPLIED:
        return state.status, state.reason
    name = state.target.attribute.rsplit(".", 1)[-1]
    try:
        found = ray_actors.verdict(owners(state), name, _env_requests(state.patch), state.patch)
    except Exception as exc:  # never let the report break status()
        return state.status, f"{state.reason} (Ray actor check failed: {type(exc).__name__}: {exc})".strip()
    return (SHADOWED, found[1]) if found and found[0] == "shadowed" else found or (state.status, state.reason)


def _env_requests(patch: str) -> bool:
    """Whether processes inheriting this environment (NeMo-RL copies it into every actor) enable patch."""
    try:
        return config.active() and patch in config.requested_patches(tuple(_patches))
    except Exception:
        return False
