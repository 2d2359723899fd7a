"""The job bench_fence_megatron.py measures, run in its child process (`--child`): one strategy, one
NVRx version, one fresh process, so a run's CUDA context, NVRx writer and /dev/shm go with it.

Sequence:

  step, save A (first; worker boot), job finalize A | step, save B (warm) and at once the offload
  with B in flight (timed) | reload, step | job finalize B (what it still waited for), compare B
  with the state when it was scheduled | save C (first after reload), finalize, compare C |
  offload again with nothing pending (timed: the offload's own cost)

"blocked" = the time the shim's fences took inside the offload with the save in flight (the
colo_shim.checkpoint.state totals, read around the offload): that is all the offload waits for.
The first-offload-vs-idle difference is no measure of it, since the first offload also pins the
DDP buffers' host copies. "held" = device memory in use after the offload minus in use before the
model was built, so a writer's own CUDA context counts; blocks a writer maps through CUDA IPC stay
in the trainer's allocator (trainer_reserved). Host: trainer and worker RSS, /dev/shm in use.

Apart from the orchestrator because the two are read for different things: this file for what a
row's numbers mean, that one for which runs happen and how rows become the table. The checkpoint
read-back is bench/ckpt_compare.py, shared with bench/e2e.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import sys
import time

from ckpt_compare import compare, fingerprints  # a sibling: the script's folder is on sys.path

GIB = float(1 << 30)


def _used() -> int:
    import torch

    free, total = torch.cuda.mem_get_info()
    return total - free


def _shm_used() -> int:
    st = os.statvfs("/dev/shm")
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def _rss(pid=None) -> tuple:
    import psutil

    me = psutil.Process(pid)
    kids = me.children(recursive=True)
    return me.memory_info().rss, sum(k.memory_info().rss for k in kids)


def _du(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


class Progress(dict):
    """The child's row, rewritten to a file after every phase, so a run that dies or hits its time
    limit still says how far it got and what it measured up to there."""

    def __init__(self, path, **kw):
        super().__init__(kw, phases={})
        self.path, self.t0 = path, time.perf_counter()

    def mark(self, phase: str) -> None:
        self["phases"][phase] = round(time.perf_counter() - self.t0, 1)
        print(f"[bench] {self['phases'][phase]:7.1f}s {phase}", file=sys.stderr, flush=True)
        if self.path:
            with open(self.path + ".tmp", "w") as f:
                json.dump(self, f, default=str)
            os.replace(self.path + ".tmp", self.path)


def child(args) -> dict:
    """One run: colo-shim installed (or not, for "off") before torch and megatron are imported, as a
    user's job would have it; returns the row, which Progress has kept on disk as it grew."""
    out = Progress(args.progress, strategy=args.strategy)
    import colo_shim

    if args.strategy != "off":  # "off": the same job without the shim, the control
        os.environ["COLO_SHIM_NVRX_RELEASE"] = args.strategy
        colo_shim.install(["nvrx", "megatron"])
    import torch
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1)
    dist.all_reduce(torch.ones(1, device="cuda"))  # NCCL's own buffers belong to the baseline
    torch.cuda.synchronize()
    used0 = _used()
    out.mark("cuda up")
    from megatron.core import dist_checkpointing, parallel_state, tensor_parallel
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.dist_checkpointing.strategies.torch import TorchDistSaveShardedStrategy
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer.transformer_config import TransformerConfig
    from nvidia_resiliency_ext.checkpointing.async_ckpt.core import AsyncCallsQueue

    parallel_state.initialize_model_parallel(1, 1)
    tensor_parallel.model_parallel_cuda_manual_seed(1234)
    cfg = TransformerConfig(num_layers=args.layers, hidden_size=args.hidden, num_attention_heads=args.hidden // 128,
                            bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16)
    model = GPTModel(config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=args.vocab,
                     max_sequence_length=512, share_embeddings_and_output_weights=False).cuda()
    # torch's LayerNorm (the local spec without apex/TE) is built in fp32; fp32 params would be
    # views of the DDP param buffer in the distributed optimizer, so offloading the buffer first and
    # then the optimizer copies freed storage (CUDA invalid argument, seen on the H200). With
    # TE/apex every param is bf16, as here after the cast.
    model = model.to(torch.bfloat16)
    ddp = DistributedDataParallel(cfg, DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=True), module=model)
    opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-2, bf16=True, params_dtype=torch.bfloat16,
                                                 use_distributed_optimizer=True), [ddp])
    buffers = list(ddp.buffers) + list(getattr(ddp, "expert_parallel_buffers", []))
    out["params"] = sum(p.numel() for p in model.parameters())
    out.mark("model built")

    def step(seed):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        for buf in buffers:
            buf.grad_data.normal_(0.0, 1e-3, generator=gen)
        ddp.finish_grad_sync()
        opt.step()
        torch.cuda.synchronize()

    strategy = TorchDistSaveShardedStrategy("torch_dist", 1, cached_metadata=True)
    queue = AsyncCallsQueue(persistent=True)
    root = args.ckpt_dir

    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    def optimizer_state():
        """The distributed optimizer's own storage (fp32 main params, Adam moments), one ShardedTensor
        per tensor, referencing the live buffers as Megatron's dp_reshardable format does (that
        helper asserts with torch's Adam, the fallback when neither TE nor apex is installed)."""
        found = {}
        for ci, inner_opt in enumerate(getattr(opt, "chained_optimizers", [opt])):
            inner = inner_opt.optimizer
            for gi, group in enumerate(inner.param_groups):
                for pi, p in enumerate(group["params"]):
                    base = f"optimizer.c{ci}.g{gi}.p{pi}"
                    found[base + ".main"] = ShardedTensor.from_rank_offsets(base + ".main", p.data, replica_id=0)
                    for k, v in inner.state[p].items():
                        if torch.is_tensor(v) and v.numel() == p.numel():
                            found[f"{base}.{k}"] = ShardedTensor.from_rank_offsets(f"{base}.{k}", v, replica_id=0)
        return found

    def sharded():
        return {"model": model.sharded_state_dict(), "optimizer": optimizer_state()}

    def save(name):
        path = os.path.join(root, name)
        os.makedirs(path, exist_ok=True)
        sd = sharded()
        want = fingerprints(sd)
        t0 = time.perf_counter()
        req = dist_checkpointing.save(sd, path, sharded_strategy=strategy, async_sharded_save=True,
                                      async_strategy="nvrx")
        queue.schedule_async_request(req)
        return path, want, round(time.perf_counter() - t0, 3)

    save.queue = queue

    def job_finalize():
        t0 = time.perf_counter()
        queue.maybe_finalize_async_calls(blocking=True, no_dist=False)
        return round(time.perf_counter() - t0, 3)

    from colo_shim.checkpoint import state as fence_state

    def offload(tag):
        """The offload in NeMo-RL's order, timed in parts; fence_s is what the shim's fences took of it."""
        f0, t0 = fence_state.totals()["fence_s"], time.perf_counter()
        for buf in buffers:
            buf.offload_to_cpu(move_params=True, move_grads=True)
        t1 = time.perf_counter()
        opt.offload_to_cpu()
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        out[f"offload_{tag}_buffers_s"] = round(t1 - t0, 3)
        out[f"offload_{tag}_optimizer_s"] = round(t2 - t1, 3)
        out[f"fence_{tag}_s"] = round(fence_state.totals()["fence_s"] - f0, 4)
        out[f"trainer_reserved_{tag}_gib"] = round(torch.cuda.memory_reserved() / GIB, 2)
        return round(t2 - t0, 3)

    def reload():
        for buf in buffers:
            buf.reload_from_cpu(move_params=True, move_grads=True)
        opt.restore_from_cpu()
        torch.cuda.synchronize()

    try:
        _sequence(out, step, save, job_finalize, offload, reload, used0, torch)
    except Exception as exc:  # keep what was measured so far
        import traceback

        out["error"] = traceback.format_exc()[-1500:]
    rec = {r["target"].split(":")[1]: [r["status"], r["calls"]] for r in colo_shim.status() if r["calls"]}
    out["shim_calls"] = rec
    out["shim"] = {r["name"]: r.get("details") for r in colo_shim.status() if r.get("details")}
    out.mark("done")
    queue.close()
    dist.destroy_process_group()
    return out


def _sequence(out, step, save, job_finalize, offload, reload, used0, torch):
    queue = save.queue
    step(1)
    out["state_gib"] = round((_used() - used0) / GIB, 2)
    out.mark("step 1")
    alloc_before = torch.cuda.memory_allocated()
    a, _, out["schedule_first_s"] = save("a")
    out["finalize_first_s"] = job_finalize()
    out.mark("save A written")
    shutil.rmtree(a, ignore_errors=True)
    step(2)
    b, want_b, out["schedule_warm_s"] = save("b")
    out.mark("save B scheduled")
    out["offload_inflight_s"] = offload("inflight")
    out["pending_after_offload"] = queue.get_num_unfinalized_calls()
    out["offloaded_gib"] = round((alloc_before - torch.cuda.memory_allocated()) / GIB, 2)
    out["held_gib"] = round((_used() - used0) / GIB, 2)
    trainer, worker = _rss()
    out.update(trainer_rss_gib=round(trainer / GIB, 2), worker_rss_gib=round(worker / GIB, 2),
               shm_used_gib=round(_shm_used() / GIB, 2), ckpt_files_gib=round(_du(os.path.dirname(b)) / GIB, 2))
    out.mark("offloaded with B in flight")
    reload()
    step(3)
    out["job_finalize_after_s"] = job_finalize()
    out.mark("reloaded, B finalized")
    out["ckpt_inflight"] = compare(b, want_b)
    out.mark("B compared")
    shutil.rmtree(b, ignore_errors=True)
    c, want_c, out["schedule_after_reload_s"] = save("c")
    out["finalize_after_reload_s"] = job_finalize()
    out.mark("save C written")
    out["ckpt_after_reload"] = compare(c, want_c)
    out.mark("C compared")
    shutil.rmtree(c, ignore_errors=True)
    out["offload_idle_s"] = offload("idle")
    out["held_idle_gib"] = round((_used() - used0) / GIB, 2)
    reload()
    derive(out)


def derive(row: dict) -> dict:
    """What the save in flight cost the offload: the fences' own time (the offload waits for nothing
    else), and the offload's own work beside it."""
    for stale in ("held_outside_trainer_gib", "held_idle_outside_trainer_gib"):
        row.pop(stale, None)
    if "fence_inflight_s" in row:
        row["blocked_s"] = row["fence_inflight_s"]
        row["offload_work_inflight_s"] = round(row["offload_inflight_s"] - row["fence_inflight_s"], 3)
    else:
        row.pop("blocked_s", None)
    return row
