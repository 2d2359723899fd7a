"""Measured in a fresh interpreter per wrapt mode: the same call sites before and after install()."""

import json
import sys
import timeit

import _noop_target as target
import wrapt
from colo_shim.core import registry
from colo_shim.core import wrapping


def passthrough(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs)


def per_call_ns(stmt, number):
    runs = timeit.repeat(stmt, globals={"s": target.Service(), "t": target}, number=number, repeat=9)
    return sorted(runs)[len(runs) // 2] / number * 1e9, min(runs) / number * 1e9


def raw_wrapt(number):
    """Same no-op behind wrapt's own FunctionWrapper, no registry: wrapt's share of the overhead."""
    class Service:
        def method(self):
            return None

    def function():
        return None

    Service.method = wrapt.FunctionWrapper(vars(Service)["method"], passthrough)
    fn = wrapt.FunctionWrapper(function, passthrough)
    globs = {"s": Service(), "f": fn}
    out = {}
    for kind, stmt in (("method", "s.method()"), ("function", "f()")):
        runs = timeit.repeat(stmt, globals=globs, number=number, repeat=9)
        out[kind] = sorted(runs)[len(runs) // 2] / number * 1e9
    return out


def calibration(number):
    """What this machine charges for a Python call and for a raised-and-caught AttributeError."""
    def f():
        return None

    globs = {"f": f, "w": lambda: passthrough(f, None, (), {})}
    stmts = {"python_wrapper_call": "w()", "attribute_error": "try:\n f.__self__\nexcept AttributeError: pass"}
    return {k: sorted(timeit.repeat(v, globals=globs, number=number, repeat=9))[4] / number * 1e9
            for k, v in stmts.items()}


def main():
    number = int(sys.argv[1])
    calls = {"method": "s.method()", "function": "t.function()"}
    before = {k: per_call_ns(v, number) for k, v in calls.items()}
    registry.register(registry.Patch("bench", "no-op", (
        registry.Target("_noop_target", "Service.method", passthrough),
        registry.Target("_noop_target", "function", passthrough))))
    registry.install(["bench"])
    assert isinstance(vars(target.Service)["method"], wrapping.ShimWrapper)
    after = {k: per_call_ns(v, number) for k, v in calls.items()}
    counted = {r["target"]: r["calls"] for r in registry.status() if r["name"] == "bench"}
    print(json.dumps({"wrapt": wrapt.__version__, "c_extension": "wrapt._wrappers" in sys.modules,
                      "before": before, "after": after, "counted": counted,
                      "raw_wrapt_ns": raw_wrapt(number), "calibration_ns": calibration(number)}))


if __name__ == "__main__":
    main()
