"""One compat check against one real NeMo-RL tree, in a fresh interpreter (run by test_compat_nemo_rl.py).

The interpreter is started the zero-code way: colo-shim's bootstrap first on PYTHONPATH and
COLO_SHIM=1, then tests/compat/site (stand-ins for uninstallable third-party packages, see
site/compat_standins.py), then the real tree. vLLM itself is the engine double
(tests/doubles/vllm_engine) with the release's pinned version in its dist-info. Prints one line
`RESULT <json>`.

checks:
  targets  import every NeMo-RL module colo-shim targets in this release; report every status row.
  ray      a local Ray cluster: (2) the real worker classes as Ray runs them reach the wrappers,
           (3) the finish/refit/guard sequence on the real VllmGeneration with a real Ray actor of
           the real VllmGenerationWorker, driven by the real grpo.refit_policy_generation.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
import types

from compat_probes import attach_engine, engine_report, megatron_probe, rows, weights_check

MODULES = (
    "nemo_rl.models.generation.vllm",
    "nemo_rl.models.generation.vllm.vllm_generation",
    "nemo_rl.models.generation.vllm.vllm_worker",
    "nemo_rl.models.generation.vllm.vllm_worker_async",
    "nemo_rl.models.policy.megatron_policy_worker",
    "nemo_rl.models.policy.workers.megatron_policy_worker",
    "nemo_rl.algorithms.grpo",
    "nemo_rl.algorithms.distillation",
    "nemo_rl.algorithms.ppo",
    "nemo_rl.algorithms.grpo_sync",
    "nemo_rl.distributed.worker_groups",
    "nemo_rl.models.policy.lm_policy",
)


def _exists(name: str) -> bool:
    tree = os.environ["COLO_SHIM_COMPAT_TREE"]  # the release root (holds nemo_rl/)
    base = os.path.join(tree, *name.split("."))
    return os.path.isfile(base + ".py") or os.path.isfile(os.path.join(base, "__init__.py"))


def _import_all() -> dict:
    out = {}
    for name in MODULES:
        if not _exists(name):
            out[name] = "absent"
            continue
        try:
            importlib.import_module(name)
            out[name] = "ok"
        except Exception as exc:
            out[name] = f"error: {type(exc).__name__}: {exc} | " + traceback.format_exc().splitlines()[-3].strip()
    return out


def check_targets() -> dict:
    import compat_standins

    imports = _import_all()
    return {"imports": imports, "rows": rows(), "standins": compat_standins.created()}


# ----------------------------------------------------------------------------- ray

MEGATRON_CALLS = [("offload_before_refit", ()), ("offload_after_refit", ()), ("move_optimizer", ("cpu",)),
                  ("prepare_for_lp_inference", ()), ("prepare_for_training", ())]


def _check_megatron(ray) -> dict:
    module = None
    for name in ("nemo_rl.models.policy.workers.megatron_policy_worker", "nemo_rl.models.policy.megatron_policy_worker"):
        if _exists(name):
            module = importlib.import_module(name)
            break
    actor_cls = module.MegatronPolicyWorker
    meta = actor_cls.__ray_metadata__
    modified = meta.modified_class
    creation = meta.actor_creation_function_descriptor
    export_error = None
    try:  # exactly what ActorClass._remote() does before creating the actor
        ray._private.worker.global_worker.function_actor_manager.export_actor_class(
            modified, creation, meta.method_meta.methods.keys())
    except Exception as exc:
        export_error = f"{type(exc).__name__}"
        for line in str(exc).splitlines():
            if "FAIL" in line and "serialization" in line:
                export_error += ": " + line.split("serialization:", 1)[-1].strip()
                break
    calls = [(n, a) for n, a in MEGATRON_CALLS if hasattr(modified, n)]
    probe = ray.remote(megatron_probe)
    desc = (creation.module_name, creation.class_name, creation.function_name, creation.function_hash)
    res = ray.get(probe.remote(desc, export_error is None, calls), timeout=180)
    res["loaded_by"] = "Ray loader, from GCS (exported class)" if export_error is None else "Ray loader, local code"
    res["export_error"] = export_error
    res["module"] = module.__name__
    res["methods"] = [n for n, _ in calls]
    return res


class _WorkerGroup:
    """Stands in for RayWorkerGroup: the same call signatures, real actor handles, real ObjectRefs."""

    def __init__(self, actors):
        self.workers = actors

    def run_all_workers_single_data(self, method_name, *args, run_rank_0_only_axes=None, **kwargs):
        return [getattr(w, method_name).remote(*args, **kwargs) for w in self.workers]

    def run_all_workers_multiple_data(self, method_name, *args, run_rank_0_only_axes=None, common_kwargs=None, **kwargs):
        futures = []
        for i, w in enumerate(self.workers):
            a = [arg[i] for arg in args]
            kw = {k: v[i] for k, v in kwargs.items()}
            kw.update(common_kwargs or {})
            futures.append(getattr(w, method_name).remote(*a, **kw))
        return futures


def _sleeps(events):
    out = []
    for i, ev in enumerate(events):
        if ev["event"] != "sleep":
            continue
        nxt = next((e for e in events[i + 1:] if e["event"] == "wake_up"), None)
        out.append([ev["level"], "end" if nxt is None else ("refit" if nxt["tags"] == ["weights"] else "wake")])
    return out


REPLAY = '''
def setup(policy_generation):
    policy_generation.finish_generation()

def grpo_train(policy, policy_generation, master_config, phase, probe=None):
    policy.train(None, None)  # the training step: every refit below sends new weights
    if phase == "rollout":
        refit_policy_generation(policy, policy_generation, True)
        if probe is not None:
            probe()
        policy_generation.finish_generation()
    elif phase == "validation":
        refit_policy_generation(policy, policy_generation, True)
        validate(policy_generation, None, None, None, 0, master_config)
        policy_generation.finish_generation()
    elif phase == "unrefitted_wake":
        refit_policy_generation(policy, policy_generation, True)
        policy_generation.finish_generation()
        policy_generation.prepare_for_generation()
    elif phase == "double_finish":
        refit_policy_generation(policy, policy_generation, True)
        policy_generation.finish_generation()
        policy_generation.finish_generation()
        policy_generation.prepare_for_generation()
    elif phase == "release_gpu":
        refit_policy_generation(policy, policy_generation, True)
        policy_generation.finish_generation(release_gpu=False)
'''


def _replay_functions(grpo):
    """The loop's call sites, compiled into grpo's own module namespace (not stored in it).

    colo-shim recognises the loop from the caller frames (module + function name + master_config),
    and the loop bodies need a dataset, a policy and a cluster. So the sequence of engine calls at
    each call site of grpo.setup / grpo.grpo_train is replayed by functions whose globals ARE the
    real grpo module: refit_policy_generation and validate resolve to the real (patched) ones.
    """
    scratch: dict = {}
    exec(compile(REPLAY, f"<compat replay of {grpo.__file__}>", "exec"), scratch)
    return {name: types.FunctionType(fn.__code__, grpo.__dict__, name, fn.__defaults__)
            for name, fn in scratch.items() if isinstance(fn, types.FunctionType)}


def _master_config(grpo, dapo: bool):
    """A master_config of this release's own types: TypedDict dicts (v0.3-v0.6), a pydantic
    MasterConfig over dict sections (v0.7), pydantic sections too on main (PR #2518)."""
    section = {"use_dynamic_sampling": dapo, "val_period": 0, "val_at_start": False}
    sections = {"policy": {"generation": {"colocated": {"enabled": True}}}, "dpo": {"val_period": 0}}
    grpo_model, master_model = getattr(grpo, "GRPOConfig", None), getattr(grpo, "MasterConfig", None)
    kinds = []
    if hasattr(grpo_model, "model_construct"):
        sections["grpo"] = grpo_model.model_construct(**section)
        kinds.append("grpo=" + type(sections["grpo"]).__name__)
    else:
        sections["grpo"] = section
        kinds.append("grpo=dict")
    if hasattr(master_model, "model_construct"):
        kinds.append("master=" + master_model.__name__)
        return master_model.model_construct(**sections), ",".join(kinds)
    return sections, ",".join(kinds + ["master=dict"])


def _check_sequence(ray, tmp: str) -> dict:
    gen_mod_name = ("nemo_rl.models.generation.vllm.vllm_generation"
                    if _exists("nemo_rl.models.generation.vllm.vllm_generation") else "nemo_rl.models.generation.vllm")
    worker_mod_name = ("nemo_rl.models.generation.vllm.vllm_worker"
                       if _exists("nemo_rl.models.generation.vllm.vllm_worker") else "nemo_rl.models.generation.vllm")
    gen_mod = importlib.import_module(gen_mod_name)
    worker_mod = importlib.import_module(worker_mod_name)
    grpo = importlib.import_module("nemo_rl.algorithms.grpo")
    from colo_shim.discard.guard import ColoShimDiscardError

    vllm_cfg = {"async_engine": False, "tensor_parallel_size": 1, "pipeline_parallel_size": 1,
                "expert_parallel_size": 1, "gpu_memory_utilization": 0.5, "precision": "bfloat16",
                "max_model_len": 64, "enforce_eager": True, "skip_tokenizer_init": True}
    cfg = {"model_name": "tiny-0", "colocated": {"enabled": True}, "vllm_cfg": vllm_cfg, "vllm_kwargs": {}}
    actor = worker_mod.VllmGenerationWorker.options(num_cpus=0).remote(cfg, bundle_indices=None)
    refit_path = os.path.join(tmp, "refit.pt")
    base = ray.get(actor.__ray_call__.remote(attach_engine, "tiny-0", refit_path), timeout=180)

    gen = object.__new__(gen_mod.VllmGeneration)  # __init__ builds a placement-group cluster: not here
    gen.cfg = cfg
    gen.worker_group = _WorkerGroup([actor])
    gen.device_uuids = [["cpu-0"]]  # v0.3 update_weights_from_ipc_handles groups handles by it
    from _vllm_support import PolicyDouble

    policy = PolicyDouble(refit_path)
    f = _replay_functions(grpo)
    mc, cfg_type = _master_config(grpo, dapo=False)
    mc_dapo, _ = _master_config(grpo, dapo=True)
    out = {"worker_base_module": base, "config_type": cfg_type, "steps": {}}

    def step(name, fn):
        before = len(ray.get(actor.__ray_call__.remote(lambda w: w.llm.core.events)))
        try:
            fn()
            err = None
        except ColoShimDiscardError as exc:
            err = f"ColoShimDiscardError: {str(exc)[:160]}"
        except Exception as exc:
            err = f"{type(exc).__name__}: {exc}"[:300]
        events = ray.get(actor.__ray_call__.remote(lambda w: w.llm.core.events))
        out["steps"][name] = {"error": err, "sleeps": _sleeps(events[before:]),
                              "events": [e["event"] + str(e.get("level", e.get("tags", ""))) for e in events[before:]]}

    step("setup", lambda: f["setup"](gen))
    step("rollout", lambda: f["grpo_train"](policy, gen, mc, "rollout"))
    probes = []
    step("rollout2", lambda: f["grpo_train"](policy, gen, mc, "rollout", probe=lambda: probes.append(
        ray.get(actor.__ray_call__.remote(weights_check), timeout=60))))
    out["after_refit_from_level2"] = probes[0] if probes else None
    step("validation", lambda: f["grpo_train"](policy, gen, mc, "validation"))
    if "dynamic_sampling" in grpo.__dict__:
        step("dapo", lambda: f["grpo_train"](policy, gen, mc_dapo, "rollout"))
    step("release_gpu", lambda: f["grpo_train"](policy, gen, mc, "release_gpu"))
    step("unrefitted_wake", lambda: f["grpo_train"](policy, gen, mc, "unrefitted_wake"))
    step("double_finish", lambda: f["grpo_train"](policy, gen, mc, "double_finish"))
    spec_actor = worker_mod.VllmGenerationWorker.options(num_cpus=0).remote(cfg, bundle_indices=None)
    ray.get(spec_actor.__ray_call__.remote(attach_engine, "tiny-0", refit_path, True), timeout=180)
    spec = object.__new__(gen_mod.VllmGeneration)  # a speculative-decoding engine: the drafter is never refit
    spec.cfg, spec.worker_group, spec.device_uuids = cfg, _WorkerGroup([spec_actor]), [["cpu-0"]]
    spec_probe = []
    f["setup"](spec)
    f["grpo_train"](policy, spec, mc, "rollout")
    f["grpo_train"](policy, spec, mc, "rollout", probe=lambda: spec_probe.append(
        ray.get(spec_actor.__ray_call__.remote(weights_check), timeout=60)))
    events = ray.get(spec_actor.__ray_call__.remote(lambda w: w.llm.core.events))
    out["speculative"] = {"sleeps": _sleeps(events), "after_refit": spec_probe[0] if spec_probe else None}
    import colo_shim

    out["driver"] = [r for r in colo_shim.status() if r["name"] == "vllm"][0]["details"].get("recent", [])
    out["driver"] = [{k: d[k] for k in ("level", "reason", "loop")} for d in out["driver"]]
    out["worker"] = ray.get(actor.__ray_call__.remote(engine_report), timeout=60)
    out["worker"].pop("events", None)
    return out


def check_ray() -> dict:
    import tempfile

    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        out = {}
        try:
            out["megatron"] = _check_megatron(ray)
        except Exception as exc:
            out["megatron"] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-1500:]}
        with tempfile.TemporaryDirectory() as tmp:
            try:
                out["sequence"] = _check_sequence(ray, tmp)
            except Exception as exc:
                out["sequence"] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2500:]}
        import compat_standins

        out["standins"] = compat_standins.created()
        return out
    finally:
        ray.shutdown()


if __name__ == "__main__":
    which = sys.argv[1]
    result = {"targets": check_targets, "ray": check_ray}[which]()
    print("RESULT " + json.dumps(result, default=str))
