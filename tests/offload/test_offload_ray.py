"""NeMo-RL's move_optimizer through real Ray `.remote()` actors of the worker doubles (v0.5: a
`@ray.remote` class copied by value into the actor; v0.7: `MegatronPolicyWorkerImpl` behind a thin
remote subclass), colo-shim active in the builder and the worker as NeMo-RL's environment copy
makes it (ray_child.py). Inside the worker the offload wrapper runs under the fence's, the state
comes back bit for bit, and every offload after the first copies into the same host tensors."""

import json
import os

import pytest

from helpers import run_python

pytestmark = pytest.mark.timeout(300)
HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = {"v0_5": "MegatronPolicyWorker.__ray_actor_class__.move_optimizer",
          "v0_7": "MegatronPolicyWorkerImpl.move_optimizer"}


def test_move_optimizer_in_ray_actors_reuses_mirrors():
    proc = run_python(os.path.join(HERE, "ray_child.py"), args=[json.dumps(sorted(TARGET))], timeout=280)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT "):])
    for release, target in TARGET.items():
        run = result[release]
        assert "error" not in run, run.get("error")
        shim = run["shim"]
        assert shim["layers"] == ["megatron", "offload"], shim  # the fence's wrapper outside: it runs first
        assert shim["rows"][f"offload:{target}"] == ["applied", 7] == shim["rows"][f"megatron:{target}"], shim
        report = shim["report"]
        assert report["mode"].startswith("pageable mirrors") and report["fallbacks"] == 0, report
        assert (report["offloads"], report["restores"], report["replaced"]) == (3, 4, 0), report
        first, *rounds = run["rounds"]
        assert all(first["on_device"]), first
        for i in range(3):
            before, offloaded, restored, trained = ([first] + rounds)[3 * i: 3 * i + 4]
            assert not any(offloaded["on_device"]) and offloaded["mirrors"] == len(offloaded["ids"]), offloaded
            assert offloaded["values"] == before["values"] == restored["values"] and all(restored["on_device"])
            assert offloaded["ids"] == rounds[0]["ids"], (release, i)  # the same host tensors every round
            assert trained["values"] != restored["values"]
