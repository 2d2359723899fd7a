"""Functions the compat run executes inside Ray worker processes (and the driver's status rows).

They live on PYTHONPATH (tests/compat/site) so that Ray ships them by reference, as it ships a
NeMo-RL worker's own code, instead of pickling them by value out of the child's __main__.
"""

from __future__ import annotations

import os
import sys


def rows(names=("vllm", "megatron")) -> list[dict]:
    import colo_shim

    rows = []
    for row in colo_shim.status():
        if row["name"] not in names:
            continue
        module = row["target"].split(":")[0]
        mod = sys.modules.get(module)
        rows.append({"name": row["name"], "target": row["target"], "status": row["status"],
                     "reason": row["reason"], "calls": row["calls"],
                     "standin": bool(mod is not None and getattr(mod, "__colo_shim_compat_standin__", False))})
    return rows


def megatron_probe(desc: tuple, exported: bool, calls: list) -> dict:
    """Runs in a Ray worker process: load the actor class through Ray's own loader, call its executors.

    FunctionActorManager.load_actor_class is what an actor process runs for the actor's class
    (unpickle from GCS, re-inject tracing, one executor per method, colo-shim's hook included);
    each method is then called through the executor Ray built for it, as Ray's task loop does.
    Only __init__ is skipped (it builds a Megatron model on a GPU): the instance is bare.
    exported=False: the driver could not serialize the class here, so Ray's load-from-local path
    (the module's ActorClass, as with a code search path) is taken instead.
    """
    from ray._private import worker as ray_worker
    from ray._raylet import PythonFunctionDescriptor

    w = ray_worker.global_worker
    fm = w.function_actor_manager
    module_name, class_name, function_name, function_hash = desc
    creation = PythonFunctionDescriptor(module_name, function_name, class_name, function_hash)
    saved = w._load_code_from_local
    w._load_code_from_local = not exported
    try:
        cls = fm.load_actor_class(w.current_job_id, creation)
    finally:
        w._load_code_from_local = saved
    inst = object.__new__(cls)
    errors = {}
    for name, args in calls:
        info = fm._function_execution_info[PythonFunctionDescriptor(module_name, name, class_name).function_id]
        try:
            info.function(inst, *args)
            errors[name] = None
        except Exception as exc:  # the body needs a real model; the wrapper runs before it
            errors[name] = type(exc).__name__
    from colo_shim.checkpoint import state

    return {"pid": os.getpid(), "rows": rows(("megatron",)), "fence": state.totals(), "errors": errors,
            "class_module": cls.__module__, "class_qualname": cls.__qualname__}


def attach_engine(worker, model, refit_path, speculative=False):
    """Runs in the worker actor (__ray_call__): give the non-owner worker the engine double."""
    os.environ["NRL_DOUBLE_REFIT_PATH"] = refit_path
    import vllm

    spec = {"method": "draft_model", "num_speculative_tokens": 1} if speculative else None
    worker.llm = vllm.LLM(model, seed=0, enable_sleep_mode=True, speculative_config=spec,
                          worker_extension_cls="compat_extension.CompatWorkerExtension")
    worker.vllm_device_ids = worker.llm.collective_rpc("report_device_id")  # what post_init reports
    return type(worker).__mro__[1].__module__


def engine_report(worker):
    import colo_shim

    core = worker.llm.core
    return {"events": core.events, "nan_generations": core.nan_generations, "pid": os.getpid(),
            "rows": rows(("vllm",)), "engine": [r for r in colo_shim.status() if r["name"] == "vllm"][0]["details"]}


def weights_check(worker):
    """After a refit: no tensor left NaN by a discard, and derived tensors recomputed from the new weights."""
    import torch

    runner = worker.llm.core.worker.model_runner
    model = runner.model
    tensors = dict(model.named_parameters())
    tensors.update(model.named_buffers())
    drafter = getattr(getattr(runner, "drafter", None), "model", None)  # where vLLM keeps a draft model
    if drafter is not None:
        tensors.update({f"drafter.model.{n}": t for n, t in drafter.named_parameters()})
        tensors.update({f"drafter.model.{n}": t for n, t in drafter.named_buffers()})
    nan = sorted(n for n, t in tensors.items() if torch.isnan(t).any())
    stale = []
    for i, layer in enumerate(model.model.layers):
        scale = getattr(layer, "qkv_scale", None)
        if scale is not None and not torch.equal(scale, layer.qkv_proj.weight.abs().amax(dim=1)):
            stale.append(f"model.layers.{i}.qkv_scale")
    return {"nan": nan, "stale_derived": stale, "drafter": drafter is not None}
