"""wrapt wrappers that survive pickling and undo exactly.

NVRx pickles its async callables into the checkpoint worker, Ray pickles actor methods and
multiprocessing's spawn pickles targets; wrapt's FunctionWrapper refuses to pickle, so ours pickle
by reference (module + qualname), which resolves to whatever the receiving process has patched.
Undo must put back the raw class-dict object (classmethod/staticmethod included), not the
bound function getattr would return.
"""

from __future__ import annotations

import importlib

import wrapt

_MISSING = object()


def _resolve(module: str, qualname: str):
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


class _BoundWrapper(wrapt.BoundFunctionWrapper):
    def __reduce_ex__(self, protocol):
        return getattr, (self.__self__, self.__name__)

    def __reduce__(self):
        return self.__reduce_ex__(2)


class ShimWrapper(wrapt.FunctionWrapper):
    """FunctionWrapper tagged with the patch that owns it, pickled by reference."""

    __bound_function_wrapper__ = _BoundWrapper

    def __init__(self, wrapped, wrapper, owner_key: str):
        super().__init__(wrapped, wrapper)
        self._self_colo_shim_key = owner_key

    def __reduce_ex__(self, protocol):
        return _resolve, (self.__module__, self.__qualname__)

    def __reduce__(self):
        return self.__reduce_ex__(2)

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


def resolve_owner(module, dotted: str):
    """Return (owner, name) for 'Cls.meth' inside module; AttributeError names the missing part."""
    owner = module
    parts = dotted.split(".")
    for part in parts[:-1]:
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


def wrap(owner, name: str, wrapper, key: str):
    """Install wrapper; returns the value to pass to unwrap() (the original own-dict entry)."""
    original = vars(owner).get(name, _MISSING)
    if is_ours(original, key):
        return None
    target = original if original is not _MISSING else _raw(owner, name)
    setattr(owner, name, ShimWrapper(target, wrapper, key))
    return original


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
