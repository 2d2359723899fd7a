"""wrapt wrappers that survive pickling and undo exactly.

NVRx pickles its async callables into the checkpoint worker, Ray pickles actor methods and
multiprocessing's spawn pickles targets; wrapt's FunctionWrapper refuses to pickle, so ours pickle
by reference (module + qualname), which resolves to whatever the receiving process has patched.
Undo must put back the raw class-dict object (classmethod/staticmethod included), not the
bound function getattr would return.
"""

from __future__ import annotations

import importlib
import operator
import types

import wrapt

_MISSING = object()


def _resolve(module: str, qualname: str):
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _by_reference(obj, parent):
    """Pickle as (module, qualname) only when that path leads back to this wrapper, as cloudpickle
    decides for functions; otherwise as the wrapped object itself. A Ray actor class of NeMo-RL
    <= v0.5 is such a case: the module's name is the ActorClass, whose attribute is Ray's own
    method, so a reference would resolve to a method bound to the ActorClass in the receiver."""
    try:
        found = _resolve(obj.__module__, obj.__qualname__)
    except Exception:
        found = None
    if found is parent or getattr(found, "_self_parent", None) is parent:
        return _resolve, (obj.__module__, obj.__qualname__)
    return operator.itemgetter(0), ((obj.__wrapped__,),)


class _Shared:
    """A wrapper is the patched attribute itself: copies are the same object, and pickling goes
    through the subclass's __reduce_ex__ (wrapt's proxies refuse both by default)."""

    __slots__ = ()

    def __reduce__(self):
        return self.__reduce_ex__(2)

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


class _BoundWrapper(_Shared, wrapt.BoundFunctionWrapper):
    def __reduce_ex__(self, protocol):
        try:  # bound to an instance or, for a classmethod, to the class
            return getattr, (self.__self__, self.__name__)
        except AttributeError:  # reached through the class: plain function or staticmethod
            return _by_reference(self, self._self_parent)


class ShimWrapper(_Shared, wrapt.FunctionWrapper):
    """FunctionWrapper tagged with the patch that owns it, pickled by reference."""

    __bound_function_wrapper__ = _BoundWrapper

    def __init__(self, wrapped, wrapper, owner_key: str, enabled=None):
        super().__init__(wrapped, wrapper, enabled)
        self._self_colo_shim_key = owner_key

    def __reduce_ex__(self, protocol):
        return _by_reference(self, self)


class _FunctionShimWrapper(ShimWrapper):
    """For module-level functions only.

    wrapt's C call first probes `wrapped.__self__` so that it can wrap bound methods; for a plain
    function that raises and clears an AttributeError on every call, which costs more than the
    rest of the call. A module attribute is never bound, so instance is always None here.
    """

    def __call__(self, *args, **kwargs):
        enabled = self._self_enabled
        if enabled is not None and not (enabled() if callable(enabled) else enabled):
            return self.__wrapped__(*args, **kwargs)
        return self._self_wrapper(self.__wrapped__, None, args, kwargs)


def resolve_owner(module, dotted: str):
    """Return (owner, name) for 'Cls.meth' inside module; AttributeError names the missing part."""
    owner = module
    parts = dotted.split(".")
    for part in parts[:-1]:
        if not hasattr(owner, part):  # Python's own message says 'partially initialized' inside the hook
            raise AttributeError(f"{getattr(owner, '__name__', owner)!s} has no attribute {part!r}")
        owner = getattr(owner, part)
    if not hasattr(owner, parts[-1]):
        raise AttributeError(f"{getattr(owner, '__name__', owner)!s} has no attribute {parts[-1]!r}")
    return owner, parts[-1]


def _raw(owner, name):
    """The descriptor as stored, searching the MRO so inherited classmethods stay classmethods."""
    for klass in getattr(owner, "__mro__", (owner,)):
        found = vars(klass).get(name, _MISSING)
        if found is not _MISSING:
            return found
    return getattr(owner, name)


def is_ours(obj, key: str) -> bool:
    return isinstance(obj, ShimWrapper) and getattr(obj, "_self_colo_shim_key", None) == key


def inner_keys(wrapped) -> list:
    """Keys of the live colo-shim wrappers a wrapper's `wrapped` still runs, outermost first."""
    keys, obj = [], wrapped
    for _ in range(32):  # a chain of __wrapped__ (functools.wraps) never loops, but never trust it
        shim = getattr(obj, "_self_parent", None) if isinstance(obj, wrapt.BoundFunctionWrapper) else obj
        if isinstance(shim, ShimWrapper) and shim._self_enabled is not False:
            keys.append(shim._self_colo_shim_key)
        obj = getattr(obj, "__wrapped__", None)
        if obj is None:
            break
    return keys


def wrap(owner, name: str, wrapper, key: str, enabled=None):
    """Install wrapper; returns the value to pass to unwrap() (the original own-dict entry).

    enabled is wrapt's per-call gate; the registry passes a C-level counter there so that counting
    calls adds no Python frame.
    """
    original = vars(owner).get(name, _MISSING)
    target = original if original is not _MISSING else _raw(owner, name)
    plain = isinstance(owner, types.ModuleType) and isinstance(target, types.FunctionType)
    setattr(owner, name, (_FunctionShimWrapper if plain else ShimWrapper)(target, wrapper, key, enabled))
    return original


def set_enabled(obj: ShimWrapper, enabled) -> None:
    """Re-arm or silence a wrapper in place (wrapt allows re-running __init__ on a wrapper)."""
    type(obj).__init__(obj, obj.__wrapped__, obj._self_wrapper, obj._self_colo_shim_key, enabled)


def unwrap(owner, name: str, original, key: str) -> bool:
    """Restore the original; False when someone wrapped on top of us (then we stay, inert)."""
    current = vars(owner).get(name, _MISSING)
    if not is_ours(current, key):
        return False
    if original is _MISSING:
        delattr(owner, name)
    else:
        setattr(owner, name, original)
    return True
