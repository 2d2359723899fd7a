"""Child: a fault injected into colo-shim's own steps inside the vllm family's driver wrappers (issue 32
item 3), on the v0.7 layout with inline workers on the engine double.

For each fault, a fresh VllmGeneration; one colo-shim internal (policy.decide, policy.record,
policy.note_refit) is swapped for one that raises, then the host's call runs: finish_generation, or a
refit's update_weights_via_ipc_zmq. Recorded: what the call returned or raised, how often upstream's
own body asked the workers to do its work (the worker group's calls, counted by method), the levels
the engine slept at and the family's status row. Once more under COLO_SHIM_STRICT=1. Prints one JSON line.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _vllm_support as sup  # noqa: E402
import colo_shim  # noqa: E402

colo_shim.install(["vllm"])

from colo_shim.discard import policy as discard_policy  # noqa: E402
from nemo_rl.distributed.virtual_cluster import RayVirtualCluster  # noqa: E402
from nemo_rl.models.generation.vllm import VllmGeneration  # noqa: E402

FAULTS = ("none", "decide", "record", "note_refit")


def fresh():
    discard_policy.reset()
    pg = VllmGeneration(RayVirtualCluster([1]), sup.generation_config())
    calls = []
    run = pg.worker_group.run_all_workers_single_data

    def counted(method_name, *args, **kwargs):
        calls.append(method_name)
        return run(method_name, *args, **kwargs)

    pg.worker_group.run_all_workers_single_data = counted
    return pg, sup.PolicyDouble(os.environ["NRL_DOUBLE_REFIT_PATH"]), calls


def shim_errors() -> dict:
    rows = [r for r in colo_shim.status() if r["name"] == "vllm"]
    return rows[0]["details"].get("shim_errors", {})


def boom(*args, **kwargs):
    raise RuntimeError("injected fault in colo-shim's own step")


def one(fault: str, strict: bool) -> dict:
    pg, policy, calls = fresh()
    refit = fault == "note_refit"
    if refit:
        pg.prepare_for_generation(tags=["weights"])
        policy.stream_weights_via_ipc_zmq()
    original = getattr(discard_policy, fault, None)
    if original is not None:
        setattr(discard_policy, fault, boom)
    if strict:
        os.environ["COLO_SHIM_STRICT"] = "1"
    before, escaped, result = shim_errors(), None, None
    try:
        if refit:
            result = pg.worker_group.get_all_worker_results(pg.update_weights_via_ipc_zmq())
        else:
            result = pg.finish_generation(refit_pending=True)
    except Exception as exc:  # noqa: BLE001 - what reached the host, for the test to judge
        escaped = {"type": type(exc).__name__, "message": str(exc)}
    finally:
        os.environ.pop("COLO_SHIM_STRICT", None)
        if original is not None:
            setattr(discard_policy, fault, original)
    after = shim_errors()
    method = "update_weights_via_ipc_zmq" if refit else "sleep"
    return {"result": result, "escaped": escaped, "upstream_calls": calls.count(method),
            "levels": [e["level"] for e in pg.worker_group.workers[0].llm.core.events if e["event"] == "sleep"],
            "shim_errors": {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)}}


if __name__ == "__main__":
    out = {fault: one(fault, False) for fault in FAULTS}
    out.update({f"{fault}_strict": one(fault, True) for fault in FAULTS if fault != "none"})
    print("RESULT " + json.dumps(out))
