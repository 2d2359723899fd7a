"""Patches reach the class a Ray actor really runs (colo_shim/core/ray_actors.py).

`@ray.remote` captures every method when the worker module executes, before any post-import hook,
and the actor process runs its own unpickled copy. Through real `.remote()` actors in a real local
cluster (tests/core/ray_actor_scenario.py, one cluster per test), for each NeMo-RL layout of the
Megatron policy worker (v0.3 single module, v0.5 `workers/`, v0.7 and main `Impl` + `@ray.remote`
subclass) and the v0.7 vLLM worker Impl classes, the wrappers must run inside the actor - their
call counters move and the fence ran there - and no row may say `applied` for a wrapper the process
does not reach. Without core/ray_actors.py every one of these counters stays 0.
"""

from __future__ import annotations

import json
import os

import pytest

from harness.vllm_runs import dist_info
from helpers import DOUBLES, doubles_root, last_json, run_python

pytestmark = pytest.mark.timeout(400)

SCENARIO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ray_actor_scenario.py")
CALLED = ("offload_before_refit", "offload_after_refit", "move_model", "prepare_for_lp_inference",
          "prepare_for_training")


def _run(tmp_path, cases):
    spec = {"cases": cases, "vllm_dir": dist_info(str(tmp_path), "0.20.0")}
    proc = run_python(SCENARIO, args=[json.dumps(spec)], timeout=380)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"no result\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
    out = json.loads(lines[-1][len("RESULT "):])
    errors = [(r["case"], r["error"]) for r in out if "error" in r]
    assert not errors, errors
    return {(r["case"]["layout"], r["case"]["order"]): r for r in out}


def _by_method(rows, layout):
    """The rows of the targets this layout's class is patched through (module and class path)."""
    module = "nemo_rl.models.policy." + ("megatron_policy_worker" if layout == "v0_3"
                                         else "workers.megatron_policy_worker")
    prefix = f"{module}:" + ("MegatronPolicyWorkerImpl." if layout in ("v0_7", "main")
                             else "MegatronPolicyWorker.__ray_actor_class__.")
    return {r["target"][len(prefix):]: r for r in rows if r["target"].startswith(prefix)}


def _assert_reached(rows, layout, where):
    """Every wrapped method that was called ran its wrapper here, and the fence ran."""
    methods = _by_method(rows, layout)
    called = CALLED + (() if layout == "v0_3" else ("move_optimizer",))
    for name in called:
        row = methods[name]
        if layout == "main" and name in ("offload_before_refit", "offload_after_refit"):  # PR #3322 fences itself
            assert (row["status"], row["calls"]) == ("not-needed", 0), (where, row)
            continue
        assert row["status"] == "applied" and row["calls"] > 0, (where, layout, row)
    assert max(r["fences"] or 0 for r in rows) > 0, (where, rows)
    never = [r for r in rows if r["status"] == "applied" and r["calls"] == 0 and r["target"].endswith(called)]
    assert not never, (where, never)


def _assert_vllm(result):
    sync = {r["target"].split(":", 1)[1]: r for r in result["worker"]["vllm-sync"]}
    assert sync["VllmGenerationWorkerImpl.sleep"]["status"] == "applied"
    assert sync["VllmGenerationWorkerImpl.sleep"]["calls"] >= 1, sync  # sleep.remote()
    # inside the actor, sleep(level=) exists only through the shim's wrapper (upstream: sleep(self))
    assert result["sleep_level_in_worker"] is True, result["sleep_level_in_worker"]
    if "vllm-async" in result["worker"]:
        asyn = {r["target"].split(":", 1)[1]: r for r in result["worker"]["vllm-async"]}
        row = asyn["VllmAsyncGenerationWorkerImpl.sleep_async"]
        assert row["status"] == "applied" and row["calls"] >= 1, row


def test_real_actors_reach_the_patch_in_every_layout_and_import_order(tmp_path):
    """One local cluster. Order a: COLO_SHIM in every process, as NeMo-RL copies the environment
    into its actors. Order b: install() after the worker module was imported, before .remote().
    Order c: the decorating process had no colo-shim when it sent the class (worker made before
    install). Order d: the decorating process's COLO_SHIM does not ask for the family."""
    res = _run(tmp_path, [
        {"layout": "v0_3", "order": "a", "families": ["megatron"]},
        {"layout": "v0_5", "order": "a", "families": ["megatron"]},
        {"layout": "v0_7", "order": "a", "families": ["megatron", "vllm"]},
        {"layout": "v0_3", "order": "b", "families": ["megatron"], "c_first": True},
        {"layout": "v0_5", "order": "b", "families": ["megatron"]},
        {"layout": "v0_7", "order": "b", "families": ["megatron", "vllm"], "async_vllm": False},
    ])
    for (layout, order), r in res.items():
        if order == "a":  # armed only: it installed at the worker module's own import
            assert r["shim_loaded_before_import"] is False
        _assert_reached(r["worker"]["megatron"], layout, f"actor, order {order}")
        _assert_reached(r["local"], layout, f"decorating process, order {order}")
    _assert_reached(res[("v0_3", "b")]["worker"]["megatron-c"], "v0_3", "actor, order c")
    _assert_vllm(res[("v0_7", "a")])
    _assert_vllm(res[("v0_7", "b")])
    # order d, the decorating process: its patch holds there only, and it says so
    for name, row in _by_method(res[("v0_7", "b")]["local"], "v0_7").items():
        if name == "finalize_async_save":  # NeMo-RL main's method (PR #3322): v0.7's class has none
            assert row["status"] == "target-missing", row
            continue
        assert row["status"] == "applied" and "in this process only" in row["reason"], row


SHADOW = r"""
import json, sys
import colo_shim
from colo_shim.core import ray_actors
find_cell = ray_actors._cell
if sys.argv[1] == "drift":  # Ray changed the shape of its method wrapper: nothing to point at the patch
    ray_actors._cell = lambda entry: None
from nemo_rl.models.policy.workers import megatron_policy_worker as m
import torch
Ray = m.MegatronPolicyWorker.__ray_metadata__.modified_class
model = torch.nn.Linear(2, 2)
w = Ray({"model": model, "optimizer": torch.optim.Adam(model.parameters())}, None, worker_sharding_annotations=None)
w.offload_before_refit()
rows = {r["target"].split(":")[1]: (r["status"], r["calls"], r["reason"]) for r in colo_shim.status()
        if r["target"].endswith("MegatronPolicyWorkerImpl.offload_before_refit")}
cell = find_cell(vars(Ray)["offload_before_refit"])
colo_shim.uninstall()
print(json.dumps({"rows": rows, "restored": type(cell.cell_contents).__name__ == "function"}))
"""


@pytest.mark.parametrize("mode", ["ray", "drift"])
def test_status_never_says_applied_when_ray_bypasses_the_patch(mode):
    """In the decorating process: reached (applied, counted) with Ray's wrappers as they are; when
    their shape is unknown (simulated drift), `shadowed` with the reason, and the call uncounted."""
    env = {"COLO_SHIM": "megatron", "PYTHONPATH": os.pathsep.join([doubles_root("v0_7"), DOUBLES])}
    out = last_json(run_python(SHADOW, env=env, args=[mode], timeout=120))
    (status, calls, reason), = out["rows"].values()
    if mode == "ray":
        assert (status, calls) == ("applied", 1), out
    else:
        assert (status, calls) == ("shadowed", 0), out
        assert "captured" in reason and "@ray.remote" in reason and "MegatronPolicyWorker" in reason, reason
    assert out["restored"], out
