"""Subprocess driver: run NeMo-RL loop doubles without and with colo-shim, print one JSON line.

A fresh interpreter per call because the three NeMo-RL layouts use the same module names and
because activation (COLO_SHIM + the bootstrap on PYTHONPATH) happens at interpreter start.
Usage: python tests/discard/vllm_scenarios.py '{"loops": ["grpo"], "runs": ["baseline", "shim"], ...}'
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _vllm_support as sup  # noqa: E402

LOOP_KW = {
    "grpo": {},
    "grpo_plain": {"plain": True},
    "grpo_async": {"async_engine": True},
    "dapo": {"dapo": True},
    "spec": {"speculative": True},
    "lora": {"lora": True},
    "ep": {"ep": 2},
    "distillation": {"algo": "distillation"},
    "ppo": {"algo": "ppo", "warmup": 3},
    "ppo_dapo": {"algo": "ppo", "warmup": 3, "dapo": True},
    "grpo_sync": {},
    "grpo_sync_dapo": {"dapo": True},
    "noncolocated": {"colocated": False},
}


def _stats(pg):
    from nemo_rl.distributed.worker_groups import get

    return get(pg.worker_group.run_all_workers_single_data("engine_stats"))


def typed(mc, algo: str):
    """On layouts whose algorithm module has a pydantic MasterConfig (main), the job's config is
    `MasterConfig(**config)`, as examples/run_grpo.py and run_ppo.py build it."""
    import importlib

    try:
        module = importlib.import_module(f"nemo_rl.algorithms.{algo}")
    except ModuleNotFoundError:
        return mc
    cls = getattr(module, "MasterConfig", None)
    return cls(**mc) if cls is not None else mc


def run_loop(loop: str, steps: int, val_period: int, inline: bool, refit_path: str) -> dict:
    from nemo_rl.algorithms import grpo
    from nemo_rl.distributed.virtual_cluster import RayVirtualCluster

    kw = dict(LOOP_KW[loop])
    algo = kw.pop("algo", "grpo")
    mc = typed(sup.master_config(algo=algo, steps=steps, val_period=val_period, **kw), algo)
    env, logger = sup.EnvDouble(), sup.Logger()
    policy = sup.PolicyDouble(refit_path, plain=kw.get("plain", False))
    pg = grpo.setup(mc, RayVirtualCluster([1], inline=inline))
    data = sup.batches(steps * (3 if kw.get("dapo") else 1))
    val = sup.batches(1, seed=99)
    state = {"current_step": 0, "total_steps": 0}
    tasks = {"math": env}
    extra = []
    if algo == "grpo" and not loop.startswith("grpo_sync"):
        grpo.grpo_train(policy, pg, data, val, None, None, tasks, tasks, logger, None, state, mc)
    elif loop.startswith("grpo_sync"):
        import ray

        from nemo_rl.algorithms.grpo_sync import grpo_train_sync

        grpo_train_sync(policy, pg, data, val, None, None, tasks, tasks, logger, None, state, mc)
        actor = state.pop("rollout_actor")
        extra = ray.get(actor.task_env.remote())["math"].outputs
        state["actor_shim"] = ray.get(actor.shim_status.remote())
        ray.kill(actor)
    elif algo == "distillation":
        from nemo_rl.algorithms.distillation import distillation_train

        distillation_train(policy, sup.PolicyDouble(refit_path + ".teacher"), pg, data, val, None, None, tasks,
                           tasks, logger, None, state, mc)
    elif algo == "ppo":
        from nemo_rl.algorithms.ppo import ppo_train

        ppo_train(policy, pg, sup.ValueDouble(refit_path + ".critic"), data, val, None, None, None, tasks, tasks,
                  logger, None, state, mc)
    stats = _stats(pg)
    pg.shutdown()
    return {"outputs": env.outputs + extra, "stats": stats, "train_calls": policy.train_calls,
            "actor_shim": state.get("actor_shim"), "policy_calls": policy.calls, "config_type": type(mc).__name__,
            "section_type": type(getattr(mc, algo)).__name__}


def driver_report():
    shim = sys.modules.get("colo_shim")
    if shim is None:
        return None
    return [s for s in shim.status() if s["name"] == "vllm"][0]["details"]


def main():
    args = json.loads(sys.argv[1])
    os.environ.setdefault("NRL_DOUBLE_REFIT_PATH", tempfile.mktemp(prefix="refit-"))
    if args.get("ray"):
        import ray

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    results = {}
    for run in args.get("runs", ["baseline", "shim"]):
        import colo_shim
        from colo_shim.discard import policy as discard_policy

        if run == "baseline":
            colo_shim.uninstall()
        else:
            colo_shim.install(["vllm"])
        os.environ["COLO_SHIM_DISCARD"] = args.get("mode", "auto") if run != "baseline" else "never"
        os.environ["COLO_SHIM"] = "vllm" if run != "baseline" else "0"  # what Ray actors inherit
        for loop in args["loops"]:
            discard_policy.reset()
            inline = not args.get("ray")
            out = run_loop(loop, args.get("steps", 20), args.get("val_period", 5), inline,
                           os.environ["NRL_DOUBLE_REFIT_PATH"])
            out["driver"] = driver_report() if run != "baseline" else None
            results[f"{run}:{loop}"] = out
    print("RESULT " + json.dumps(results))


if __name__ == "__main__":
    main()
