"""What reaching a Ray actor's captured methods costs (colo_shim/core/ray_actors.py).

A call through a Ray actor enters the `_resume_span` wrapper `@ray.remote` captured; with the
patch reached, it goes through one more Python-level call (`_Reach`) and the patch's wrapt wrapper.
Measured in a fresh interpreter on a real `@ray.remote` class (no cluster needed: this is the
call Ray's executor makes inside the actor), per call, for a no-op method and a no-op wrapper:
unpatched, patched but bypassed (before the fix: what Ray captured), patched and reached.
Also the one-off cost of fixing the class (`ray_actors.reach`) per method.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from _common import REPO, save

from harness.procs import PYTHON, clean_env

TARGET = '''
import ray

class Impl:
    def m(self):
        return None

@ray.remote
class Worker(Impl):
    pass
'''

CHILD = r'''
import json, sys, time, timeit
import bench_ray_target as t
from colo_shim.core import ray_actors, registry

Ray = t.Worker.__ray_metadata__.modified_class
obj = Ray.__new__(Ray)
call = vars(Ray)["m"]          # what Ray's executor holds for method m
number = int(sys.argv[1])

def per_call():
    return min(timeit.repeat(lambda: call(obj), number=number, repeat=5)) / number * 1e9

out = {"unpatched_ns": per_call()}
registry.register(registry.Patch("benchray", "", (registry.Target("bench_ray_target", "Impl.m",
                                                                  lambda w, i, a, k: w(*a, **k)),)))
real_reach = ray_actors.reach
ray_actors.reach = lambda owner, name: []   # the registry as before the fix: patch Impl only
registry.install(["benchray"])
out["patched_bypassed_ns"] = per_call()
calls = lambda: [r["calls"] for r in registry.status() if r["name"] == "benchray"][0]
assert calls() == 0
t0 = time.perf_counter()
real_reach(t.Impl, "m")
out["reach_once_us"] = (time.perf_counter() - t0) * 1e6
out["patched_reached_ns"] = per_call()
assert calls() > 0
print(json.dumps(out))
'''


def main() -> None:
    number = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "bench_ray_target.py"), "w") as fh:
            fh.write(TARGET)
        env = clean_env(PYTHONPATH=os.pathsep.join([REPO, tmp]))
        proc = subprocess.run([PYTHON, "-c", CHILD, str(number)], env=env, capture_output=True, text=True,
                              timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr)
        result = json.loads(proc.stdout.splitlines()[-1])
    import ray
    import wrapt

    result.update({"ray": ray.__version__, "wrapt": wrapt.__version__, "number": number,
                   "added_by_reach_ns": result["patched_reached_ns"] - result["patched_bypassed_ns"]})
    print(f"{'case':<40}{'ns per call':>14}")
    for key in ("unpatched_ns", "patched_bypassed_ns", "patched_reached_ns"):
        print(f"{key:<40}{result[key]:>14.0f}")
    print(f"{'reach() once, one method (us)':<40}{result['reach_once_us']:>14.1f}")
    print("saved", save("ray_reach", result))


if __name__ == "__main__":
    main()
