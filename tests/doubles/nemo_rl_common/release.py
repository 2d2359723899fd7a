"""Define shared function bodies in a release module, as if written there.

NeMo-RL's training loops call module-level functions by name through their module's globals
(grpo_train -> validate / refit_policy_generation / dynamic_sampling), colo-shim wraps those
module attributes, and colo-shim's discard policy recognises a loop by its frame (the frame's
module `__name__` and function name, plus its locals such as `master_config`). A plain call from
a release module into shared code would run the loop in a frame of nemo_rl_common and resolve
those names here, at import. `define` instead gives each release module its own function object
for the shared code: same code, the release module's globals (names resolve there at call time,
patched attributes included), the release module's `__module__` / `__qualname__` (pickling by
reference and repr point at the release module). Only the source file and line numbers are the
shared module's.
"""

from __future__ import annotations

import builtins
import dis
import types


def _globals_read(code: types.CodeType) -> set[str]:
    names = {ins.argval for ins in dis.get_instructions(code) if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _globals_read(const)
    return names


def define(namespace: dict, *functions: types.FunctionType, may_lack: tuple[str, ...] = ()) -> None:
    """Bind each function to `namespace` (a release module's globals()) under its own name.

    Fails at import when the release module lacks a global the bodies read (other than
    `may_lack`: names on a path this release never takes), instead of at the first call in the
    middle of a test.
    """
    module = namespace["__name__"]
    for fn in functions:
        missing = sorted(n for n in _globals_read(fn.__code__) if n not in namespace and n not in may_lack and not hasattr(builtins, n))
        if missing:
            raise ImportError(f"{module} lacks {missing}, read by the shared {fn.__module__}.{fn.__name__}")
        bound = types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__, fn.__closure__)
        bound.__kwdefaults__ = fn.__kwdefaults__
        bound.__annotations__ = dict(fn.__annotations__)
        bound.__doc__ = fn.__doc__
        bound.__module__ = module
        bound.__qualname__ = fn.__name__
        namespace[fn.__name__] = bound


def upstream_module(module: str, *objects) -> None:
    """Name `module` (the upstream path every release re-exports them from) as the objects' home.

    Pickling by reference (cloudpickle, Ray: a VllmGeneration sent to the SyncRolloutActor, actor
    classes' bases) then imports that release module in the receiving process - which is what
    fires colo-shim's import hooks there, as with upstream - and resolves to the same objects.
    """
    for obj in objects:
        obj.__module__ = module
