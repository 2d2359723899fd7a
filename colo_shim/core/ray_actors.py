"""Make a patch reach the class a Ray actor really runs.

`@ray.remote` (ray.actor._make_actor) subclasses the decorated class (ray.actor._modify_class,
marked by `__ray_actor_class__` in its own dict) and gives that subclass, through
ray.util.tracing.tracing_helper._inject_tracing_into_class, one wrapper per method found at
decoration time: a function `_resume_span` calling the function it captured then, held in its
closure cell `method`. The decoration runs while the worker's module executes, before any
post-import hook, so a patch on the class or on a base (`MegatronPolicyWorkerImpl`) is bypassed by
every call through the actor, `self.other_method()` inside it included. The actor process
receives that subclass by cloudpickle: by value (its own copy of the methods; up to NeMo-RL v0.5
a copy of the whole worker class, whose module name resolves to the ActorClass, not the class),
bases by reference only where the module names them (v0.6+ `...Impl`). Ray then builds one
executor per method from the class's members (FunctionActorManager._make_actor_method_executor)
and keeps them.

So the captured function is swapped in Ray's own cell for a `_Reach`, which calls the method as
the class's MRO now resolves it (the patched base), wherever Ray or `self.x()` holds the wrapper.
A `_Reach` pickles as the function it replaced, so the receiving process gets exactly what Ray
would have sent and its own colo-shim decides. In the driver this is done when a patch is
applied; in an actor process when Ray loads an actor class (the registry then also patches the
by-value copy of the worker class, found by module and qualname).

Relied on, checked on every use and fail-open (Ray 2.46 to 2.60): the `__ray_actor_class__`
marker; a wrapper with a free variable `method`; FunctionActorManager._make_actor_method_executor
called for each method after the class was stored in `_loaded_actor_classes`. When a wrapper has
another shape, `shadowed()` says so and the registry reports the target `shadowed`, not applied.
"""

from __future__ import annotations

import logging
import operator
import sys
import weakref

from colo_shim.core import wrapping

log = logging.getLogger("colo_shim")

FM = "ray._private.function_manager"
HOOK_KEY = "colo_shim:ray:FunctionActorManager._make_actor_method_executor"
_MISSING = wrapping._MISSING

_on_loaded = None  # registry callback: on_loaded(actor_class) for each class Ray loads here
_active = False
_hook_registered = False
_seen: "weakref.WeakSet[type]" = weakref.WeakSet()
_undo: list = []  # (cell, captured) to restore on uninstall
_warned: set[str] = set()


class _Reach:
    """Stands in Ray's closure cell: calls `target`; pickles as the function Ray had captured."""

    __slots__ = ("target", "captured", "__weakref__")

    def __init__(self, target, captured):
        self.target, self.captured = target, captured

    def __call__(self, *args, **kwargs):
        return self.target(*args, **kwargs)

    def __reduce__(self):  # no colo_shim name in the pickle: an actor without colo-shim unpickles it
        return operator.itemgetter(0), ((self.captured,),)

    @property
    def __name__(self):  # Ray's tracing span names read it
        return getattr(self.captured, "__name__", "method")


def _warn_once(what: str, exc: BaseException) -> None:
    if what not in _warned:
        _warned.add(what)
        log.warning("colo_shim: Ray actor support: %s failed (%s: %s); targets there may show shadowed",
                    what, type(exc).__name__, exc)


def is_actor_class(cls) -> bool:
    """A class made by ray.actor._modify_class (the class Ray instantiates in the actor)."""
    try:
        return isinstance(cls, type) and "__ray_actor_class__" in vars(cls)
    except TypeError:
        return False


def actor_classes(owner) -> list:
    """Ray-generated actor classes deriving from owner, in this process."""
    if not isinstance(owner, type):
        return []
    found, stack, seen = [], [owner], set()
    while stack:
        cls = stack.pop()
        try:
            subs = type.__subclasses__(cls)
        except TypeError:
            continue
        for sub in subs:
            if id(sub) not in seen:
                seen.add(id(sub))
                stack.append(sub)
                if is_actor_class(sub):
                    found.append(sub)
    return found


def _cell(entry):
    """Ray's captured-function cell of a method wrapper, or None if the wrapper is not Ray's shape."""
    code, closure = getattr(entry, "__code__", None), getattr(entry, "__closure__", None)
    if code is None or not closure or "method" not in code.co_freevars:
        return None
    return closure[code.co_freevars.index("method")]


def _resolved(cls, name):
    """What `getattr(cls, name)` would give without cls's own entry: what Ray would capture now."""
    for base in cls.__mro__[1:]:
        raw = vars(base).get(name, _MISSING)
        if raw is not _MISSING:
            getter = getattr(type(raw), "__get__", None)
            return raw.__get__(None, cls) if getter is not None else raw
    raise AttributeError(f"{cls.__name__} has no attribute {name!r}")


def _plain(obj):
    """The plain function under our own wrappers (so a `_Reach` never pickles a ShimWrapper)."""
    while isinstance(obj, (wrapping.ShimWrapper, wrapping.wrapt.BoundFunctionWrapper)):
        obj = obj.__wrapped__
    return obj


def _fix(cls, name: str) -> str | None:
    """Point cls's captured method `name` at the MRO resolution; a problem string if impossible."""
    entry = vars(cls).get(name, _MISSING)
    if entry is _MISSING:  # Ray captured nothing here: lookups go through the MRO
        return None
    cell = _cell(entry)
    if cell is None:
        return f"{cls.__name__}.{name} is a {type(entry).__name__}, not Ray's method wrapper"
    target = _resolved(cls, name)
    current = cell.cell_contents
    if isinstance(current, _Reach):
        current.target = target
        return None
    cell.cell_contents = _Reach(target, _plain(current))
    _undo.append((cell, current))
    return None


def reach(owner, name: str) -> list[str]:
    """After `owner.name` was patched: make every Ray actor class deriving from owner call it."""
    problems = []
    for cls in actor_classes(owner):
        try:
            problem = _fix(cls, name)
        except Exception as exc:  # fail open: report, never break the host
            problem = f"{cls.__name__}.{name}: {type(exc).__name__}: {exc}"
        if problem:
            problems.append(problem)
    return problems


def shadowed(owner, name: str) -> list[str]:
    """Ray actor classes deriving from owner whose method `name` bypasses owner's patched entry."""
    out = []
    for cls in actor_classes(owner):
        entry = vars(cls).get(name, _MISSING)
        if entry is _MISSING:
            continue
        cell = _cell(entry)
        current = cell.cell_contents if cell is not None else None
        if isinstance(current, _Reach) or isinstance(current, wrapping.wrapt.BoundFunctionWrapper):
            continue
        where = f"Ray actor class {cls.__module__}.{cls.__name__} captured {name} at @ray.remote"
        out.append(f"{where}, before the patch; calls through the actor bypass it" if cell is not None else
                   f"{where} in a form colo-shim cannot redirect (Ray internals changed?); calls through the "
                   f"actor may bypass the patch")
    return out


def verdict(owners, name: str, env_enables: bool, family: str):
    """("shadowed", why) when a Ray actor class here bypasses the patch; ("applied", note) when the
    patch holds here but this environment would not activate the family in its actors; else None."""
    problems = [p for owner in owners for p in shadowed(owner, name)]
    if problems:
        return "shadowed", "; ".join(problems)
    if not env_enables and any(actor_classes(owner) for owner in owners):
        return "applied", (f"in this process only: COLO_SHIM here does not enable {family}, and a Ray actor "
                           f"of this class is patched only where colo-shim is active in the actor process")
    return None


def loaded_classes() -> list:
    """Actor classes Ray has loaded into this process (an actor process); [] elsewhere."""
    worker_mod = sys.modules.get("ray._private.worker")
    manager = getattr(getattr(worker_mod, "global_worker", None), "function_actor_manager", None)
    return list(getattr(manager, "_loaded_actor_classes", {}).values())


def _scan(classes) -> None:
    for cls in classes:
        if isinstance(cls, type) and cls not in _seen:
            _seen.add(cls)
            if _on_loaded is not None:
                _on_loaded(cls)


def _on_executor(wrapped, instance, args, kwargs):
    """Ray builds an executor per method right after storing the loaded class: prepare it first."""
    if _active:
        try:
            _scan(list(getattr(instance, "_loaded_actor_classes", {}).values()))
        except Exception as exc:
            _warn_once("preparing a loaded actor class", exc)
    return wrapped(*args, **kwargs)


def _hook(module) -> None:
    try:
        owner = module.FunctionActorManager
        if not callable(getattr(owner, "_make_actor_method_executor", None)):
            raise AttributeError("FunctionActorManager has no _make_actor_method_executor")
        if not wrapping.is_ours(vars(owner).get("_make_actor_method_executor"), HOOK_KEY):
            wrapping.wrap(owner, "_make_actor_method_executor", _on_executor, HOOK_KEY)
    except Exception as exc:
        _warn_once("hooking Ray's actor class loading", exc)


def install(on_loaded) -> None:
    """Call on_loaded(cls) for each actor class Ray loads here (now for those already loaded)."""
    global _on_loaded, _active, _hook_registered
    _on_loaded, _active = on_loaded, True
    if FM in sys.modules:
        _hook(sys.modules[FM])
    elif not _hook_registered:
        import wrapt

        wrapt.register_post_import_hook(_hook, FM)
    _hook_registered = True
    try:
        _scan(loaded_classes())
    except Exception as exc:
        _warn_once("scanning loaded actor classes", exc)


def uninstall() -> None:
    """Put every captured function back in Ray's cells; the loading hook turns inert."""
    global _active
    _active = False
    while _undo:
        cell, captured = _undo.pop()
        if isinstance(cell.cell_contents, _Reach):
            cell.cell_contents = captured
    _seen.clear()
