"""Checkpoint fence on the real path: megatron-core GPTModel + DDP + distributed optimizer, NVRx saves.

Per release strategy (COLO_SHIM_NVRX_RELEASE) and NVRx version, in a fresh process on one GPU
(torch.distributed single rank, NCCL): a GPTModel (default 16 layers x 2048 hidden, 0.94B params)
in megatron-core's DDP with the distributed optimizer; `dist_checkpointing.save(...,
async_sharded_save=True)` with the NVRx strategy and cached structure, scheduled on a persistent
NVRx AsyncCallsQueue; the offload through the real entry points in NeMo-RL's order (each DDP
buffer's offload_to_cpu, then optimizer.offload_to_cpu()), with no explicit fence() call: the
shim's megatron/nvrx families do everything. Sequence:

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
Strategy "off" runs the same job without the shim (the control). bench/results holds "stage" rows
from before that strategy was retired (issue 22); a run named stage now measures the default
release it is an alias of, so it is no longer among the default runs.

    python bench/bench_fence_megatron.py --site DIR [--runs inplace@0.7.0,...] [--per-run-s 200]
    python bench/bench_fence_megatron.py --merge A.json B.json ...   # one table from device calls

DIR holds one --target install per library: DIR/mcore, DIR/nvrx060, DIR/nvrx070. Writes
bench/results/fence_megatron.json (and --out DIR/) and prints a table. Needs a CUDA GPU; --merge
does not (it re-renders saved runs, later files winning per strategy and version).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = float(1 << 30)
ORDER = (("stage", "0.7.0"), ("inplace", "0.7.0"), ("stage", "0.6.0"), ("inplace", "0.6.0"),
         ("restart", "0.7.0"), ("restart", "0.6.0"))  # the table's order; stage rows are old results
RUNS = tuple(run for run in ORDER if run[0] != "stage")


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


def _fingerprints(sharded) -> dict:
    """Per checkpoint key: float64 sum and squared norm of the local data (exact enough to see a step)."""
    import torch
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    keys, vals = [], []

    def walk(obj):
        if isinstance(obj, ShardedTensor):
            t = obj.data.detach().reshape(-1)
            keys.append(obj.key)
            vals.append(torch.stack([t.sum(dtype=torch.float64),
                                     torch.linalg.vector_norm(t, 2, dtype=torch.float64) ** 2]))
        elif isinstance(obj, dict):
            for v in obj.values():
                walk(v)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                walk(v)

    walk(sharded)
    out = {}
    for key, (s, q) in zip(keys, torch.stack(vals).tolist()):
        a, b = out.get(key, (0.0, 0.0))
        out[key] = (a + s, b + q)
    return out


def _compare(path: str, want: dict) -> dict:
    """Read every tensor of the checkpoint back and compare it with the fingerprints at schedule time."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = dcp.FileSystemReader(path)
    meta = reader.read_metadata().state_dict_metadata
    keys = [k for k in want if isinstance(meta.get(k), TensorStorageMetadata)]
    missing = len(want) - len(keys)
    bad, t0 = [], time.perf_counter()
    for i in range(0, len(keys), 64):
        chunk = {k: torch.empty(tuple(meta[k].size), dtype=meta[k].properties.dtype) for k in keys[i:i + 64]}
        dcp.load(chunk, storage_reader=dcp.FileSystemReader(path), no_dist=True)
        for k, t in chunk.items():
            t = t.reshape(-1)
            got = (t.sum(dtype=torch.float64).item(), (torch.linalg.vector_norm(t, 2, dtype=torch.float64) ** 2).item())
            exp = want[k]
            if any(abs(g - e) > 1e-6 * max(1.0, abs(e)) for g, e in zip(got, exp)):
                bad.append(k)
        del chunk
    return {"equal": not bad and len(keys) > 0, "tensors": len(keys), "missing": missing,
            "mismatched": len(bad), "first_mismatch": bad[:3], "compare_s": round(time.perf_counter() - t0, 2)}


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
    ddp = DistributedDataParallel(cfg, DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                                                     use_distributed_optimizer=True), module=model)
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
        want = _fingerprints(sd)
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
    out["ckpt_inflight"] = _compare(b, want_b)
    out.mark("B compared")
    shutil.rmtree(b, ignore_errors=True)
    c, want_c, out["schedule_after_reload_s"] = save("c")
    out["finalize_after_reload_s"] = job_finalize()
    out.mark("save C written")
    out["ckpt_after_reload"] = _compare(c, want_c)
    out.mark("C compared")
    shutil.rmtree(c, ignore_errors=True)
    out["offload_idle_s"] = offload("idle")
    out["held_idle_gib"] = round((_used() - used0) / GIB, 2)
    reload()
    _derive(out)


def _derive(row: dict) -> dict:
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


def _site(args, version: str) -> str:
    parts = [REPO, os.path.join(args.site, "mcore"), os.path.join(args.site, "nvrx" + version.replace(".", ""))]
    return os.pathsep.join(parts + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--strategy", default="inplace")
    ap.add_argument("--runs", default=",".join(f"{s}@{v}" for s, v in RUNS))
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--site", default=os.path.join(REPO, ".site"))
    ap.add_argument("--ckpt-dir", default="/dev/shm/colo_bench")
    ap.add_argument("--budget-s", type=float, default=480)
    ap.add_argument("--per-run-s", type=float, default=150)
    ap.add_argument("--out", default=None)
    ap.add_argument("--progress", default=None)
    ap.add_argument("--progress-dir", default="/tmp")
    ap.add_argument("--merge", nargs="+", default=None)
    args = ap.parse_args()
    if args.merge:
        return _merge(args.merge)
    if args.child:
        print(json.dumps(child(args), default=str), flush=True)
        return 0
    start, results = time.monotonic(), []
    for run in args.runs.split(","):
        strat, version = run.split("@")
        left = args.budget_s - (time.monotonic() - start)
        if left < 60:
            results.append({"strategy": strat, "nvrx": version, "skipped": f"budget: {left:.0f}s left"})
            continue
        env = dict(os.environ, PYTHONPATH=_site(args, version), PYTHONUNBUFFERED="1")
        shutil.rmtree(args.ckpt_dir, ignore_errors=True)
        os.makedirs(args.ckpt_dir, exist_ok=True)
        t0 = time.monotonic()
        progress = os.path.join(args.progress_dir, f"progress-{strat}-{version}.json")
        if os.path.exists(progress):
            os.remove(progress)
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "--strategy", strat, "--layers", str(args.layers),
               "--hidden", str(args.hidden), "--vocab", str(args.vocab), "--ckpt-dir", args.ckpt_dir,
               "--progress", progress]
        # Its own session, so that a run past its limit is killed with its NVRx writer and leaves
        # neither GPU memory nor /dev/shm behind for the next run.
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            stdout, stderr = proc.communicate(timeout=min(args.per_run_s, left))
            lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
            row = json.loads(lines[-1]) if lines else _partial(progress, error=stderr[-1500:])
        except subprocess.TimeoutExpired as exc:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            row = _partial(progress, error=f"timeout after {exc.timeout:.0f}s", stderr=stderr[-1500:])
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # a writer left behind by a child that exited
        except ProcessLookupError:
            pass
        row.update(strategy=strat, nvrx=version, wall_s=round(time.monotonic() - t0, 1))
        results.append(row)
        print(json.dumps(row, default=str)[:600], flush=True)
    import torch

    report = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "megatron_core": "0.19.2",
              "model": f"GPTModel {args.layers}x{args.hidden}, vocab {args.vocab}, DDP + distributed optimizer",
              "ckpt_dir": args.ckpt_dir, "runs": results}
    _write(report, [os.path.join(REPO, "bench", "results"), args.out])
    return 0


def _write(report: dict, targets) -> None:
    table = _table(report["runs"])
    print(table)
    for target in filter(None, targets):
        os.makedirs(target, exist_ok=True)
        with open(os.path.join(target, "fence_megatron.json"), "w") as f:
            json.dump(report, f, indent=1, default=str)
        with open(os.path.join(target, "fence_megatron.txt"), "w") as f:
            f.write(table + "\n")


def _merge(paths) -> int:
    """One report from several device calls (one call's 10 minutes hold about four runs)."""
    report, runs = None, {}
    for path in paths:
        with open(path) as f:
            part = json.load(f)
        report = report or {k: v for k, v in part.items() if k != "runs"}
        for row in part["runs"]:
            if "skipped" not in row:
                runs[(row["strategy"], row["nvrx"])] = dict(_derive(row), source=os.path.basename(os.path.dirname(
                    os.path.abspath(path))) + "/" + os.path.basename(path))
    order = {k: i for i, k in enumerate(ORDER + (("off", "0.7.0"), ("off", "0.6.0")))}
    report["runs"] = sorted(runs.values(), key=lambda r: order.get((r["strategy"], r["nvrx"]), 99))
    _write(report, [os.path.join(REPO, "bench", "results")])
    return 0


def _partial(path: str, **why) -> dict:
    """What a child that did not finish had measured, from its progress file, with why it stopped."""
    row = {}
    if os.path.exists(path):
        with open(path) as f:
            row = json.load(f)
    row.update(why)
    return row


def _table(rows) -> str:
    cols = ("strategy", "nvrx", "held_gib", "trainer_reserved_inflight_gib", "blocked_s", "offload_inflight_s",
            "offload_work_inflight_s", "offload_idle_s", "schedule_warm_s", "schedule_after_reload_s",
            "finalize_after_reload_s", "trainer_rss_gib", "worker_rss_gib", "shm_used_gib", "ckpt_files_gib", "equal")
    lines = [" | ".join(cols)]
    for r in rows:
        eq = [r.get(k, {}).get("equal") for k in ("ckpt_inflight", "ckpt_after_reload")]
        vals = [r.get(c, "") for c in cols[:-1]] + [eq if "equal" not in r else r["equal"]]
        if "skipped" in r:
            vals = [r["strategy"], r["nvrx"], r["skipped"]]
        elif "error" in r:
            last = list(r.get("phases", {}))[-1:] or ["start"]
            vals += [f"stopped after {last[0]!r}: {str(r['error']).strip().splitlines()[-1][:160]}"]
        lines.append(" | ".join(str(v) for v in vals))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
