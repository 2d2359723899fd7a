"""Child script: every kind of patched callable survives pickle/copy/introspection, and crosses
into a multiprocessing spawn child by reference, where it resolves to that child's own patch."""

import asyncio
import copy
import inspect
import json
import multiprocessing
import pickle
import sys

import shimtarget.sub as t

ORIGINALS = {}


def kinds():
    engine = t.Engine()
    return {  # name -> (callable as user code reaches it, args, expected result, target key, coroutine?)
        "function": (t.free, (1,), 6, "free", False),
        "async_function": (t.free_async, (5,), 5, "free_async", True),
        "method": (engine.step, (1,), 2, "Engine.step", False),
        "unbound_method": (t.Engine.step, (engine, 1), 2, "Engine.step", False),
        "classmethod": (t.Engine.build, (3,), 6, "Engine.build", False),
        "staticmethod": (t.Engine.helper, (3,), 2, "Engine.helper", False),
        "async_method": (engine.step_async, (1,), 11, "Engine.step_async", True),
    }


def is_shim(obj):
    from colo_shim.core import wrapping

    return isinstance(obj, (wrapping.ShimWrapper, wrapping._BoundWrapper))


def call(fn, args):
    result = fn(*args)
    return asyncio.run(result) if inspect.iscoroutine(result) else result


def calls(key):
    from colo_shim.core import registry

    return {r["target"]: r["calls"] for r in registry.status() if r["name"] == "shimtest"}[f"shimtarget.sub:{key}"]


def call_in_child(fn, args, key):
    """Runs in the spawn child: fn arrived pickled by reference and must be this process's patch."""
    before = calls(key)
    return [call(fn, args), calls(key) - before, "colo_shim.core.registry" in sys.modules]


def main():
    from colo_shim.core import registry

    assert registry.enabled("shimtest"), "parent not activated"
    import wrapt

    out = {"wrapt": wrapt.__version__, "wrapt_c": "wrapt._wrappers" in sys.modules, "kinds": {}}
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        for name, (fn, args, expected, key, coro) in kinds().items():
            wrapped = getattr(fn, "__wrapped__", None)
            sig_ref = inspect.signature(wrapped if wrapped is not None else fn)
            checks = {
                "is_shim": lambda: is_shim(fn),
                "pickle": lambda: call(pickle.loads(pickle.dumps(fn)), args) == expected,
                "copy": lambda: call(copy.copy(fn), args) == expected,
                "deepcopy": lambda: call(copy.deepcopy(fn), args) == expected,
                "signature": lambda: str(inspect.signature(fn)) == str(sig_ref),
                "coroutine": lambda: inspect.iscoroutinefunction(fn) == coro,
                "spawn": lambda: pool.apply(call_in_child, (fn, args, key)) == [expected, 1, True],
            }
            rec = {}
            for check, run in checks.items():
                try:
                    rec[check] = run()
                except Exception as exc:
                    rec[check] = f"{type(exc).__name__}: {exc}"
            out["kinds"][name] = rec
    print(json.dumps(out))


if __name__ == "__main__":
    main()
