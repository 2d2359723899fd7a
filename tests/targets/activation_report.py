"""Child script: reports whether start-up activated colo_shim in this process (and its children).

What matters is the state before any test code ran, so it is captured on the first line; the
target is imported afterwards, like a training script importing its libraries.
"""

import sys

AT_START = sorted(m for m in ("colo_shim", "colo_shim.core.deferred", "colo_shim.core.registry", "wrapt") if m in sys.modules)

import json  # noqa: E402
import multiprocessing  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402


def report() -> dict:
    import shimtarget.sub as target

    engine_step = vars(target.Engine)["step"]
    wrapping = sys.modules.get("colo_shim.core.wrapping")  # type(x).__module__ is proxied by pure-Python wrapt 1.x
    layers, obj = 0, engine_step
    while wrapping is not None and isinstance(obj, wrapping.ShimWrapper):
        layers, obj = layers + 1, obj.__wrapped__
    assert target.Engine().step(1) == 2 and target.free(1) == 6
    out = {"pid": os.getpid(), "at_start": AT_START, "layers": layers,
           "colo_shim_env": os.environ.get("COLO_SHIM"), "enabled": None, "calls": None,
           "chained": "_colo_shim_chained_sitecustomize" in sys.modules,
           "user_sitecustomize_ran": os.environ.get("USER_SITECUSTOMIZE_RAN")}
    registry = sys.modules.get("colo_shim.core.registry")
    if registry is not None:
        out["enabled"] = sorted(n for n in registry.families() if registry.enabled(n))
        out["calls"] = {r["target"]: r["calls"] for r in registry.status() if r["name"] == "shimtest"}
        out["status"] = {r["target"]: r["status"] for r in registry.status() if r["name"] == "shimtest"}
        import wrapt

        out["wrapt"] = wrapt.__file__
    return out


def main() -> None:
    result = report()
    if "--children" in sys.argv:
        proc = subprocess.run([sys.executable, os.path.abspath(__file__)], capture_output=True, text=True,
                              timeout=120)
        result["subprocess"] = json.loads(proc.stdout.splitlines()[-1]) if proc.returncode == 0 else proc.stderr
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(1) as pool:
            result["spawn"] = pool.apply(report)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
