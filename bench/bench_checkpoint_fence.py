"""Checkpoint fence benchmark: cached NVRx saves, then offload/reload, with and without the shim.

Per NVRx version and mode (no shim; shim with each release strategy), in a fresh process:
two cached async saves of params + Adam-like state (warm-up, then the warm save we time),
fence (shim only), offload (resize_(0) + gc + empty_cache), held bytes, reload to new storage
with changed values, an emulated training step, the first save after release (blocking seconds),
then the checkpoint read back and compared with the live tensors. Also the idle fence cost.

    python bench/bench_checkpoint_fence.py [--gib-params 8] [--versions 0.6.0,0.7.0] [--deps DIR]

Needs a CUDA GPU. NVRx versions come from DIR/nvrx-X (default .deps). Writes
bench/results/checkpoint_fence.json (and --out DIR/ if given) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 1 << 30


def child(args) -> dict:
    import torch

    shim = args.mode != "noshim"
    if shim:
        os.environ["COLO_SHIM_NVRX_RELEASE"] = args.mode
        import colo_shim

        colo_shim.install(["nvrx", "megatron"])
    from colo_shim.checkpoint import fence as checkpoint_fence
    from colo_shim.cli import saver as cs

    import shutil

    import torch.distributed as dist

    gpu = torch.cuda.is_available()  # CPU only for a smoke run of this script (NVRx shm path)
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    if world > 1:  # launched by torch.distributed.run: one GPU per rank, each with its own writer
        if gpu:
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("cuda:nccl,cpu:gloo" if gpu else "gloo")
    else:
        cs.init_single_rank()
    dev, shm = ("cuda", False) if gpu else ("cpu", True)
    reserved = torch.cuda.memory_reserved if gpu else (lambda: 0)
    n = int(args.gib_params * GIB / 4 / args.tensors)
    state = {}
    for i in range(args.tensors):  # fp32 params, Adam-like bf16 exp_avg and exp_avg_sq, one shard per rank
        state[f"r{rank}.p{i}"] = torch.randn(n, device=dev)
        state[f"r{rank}.m{i}"] = torch.randn(n, device=dev, dtype=torch.bfloat16)
        state[f"r{rank}.v{i}"] = torch.rand(n, device=dev, dtype=torch.bfloat16)
    cached = sum(t.numel() * t.element_size() for t in state.values())
    shm_free = shutil.disk_usage("/dev/shm").free if os.path.isdir("/dev/shm") else 0
    base = "/dev/shm" if shm_free > 2.5 * cached * world else args.ckpt_dir
    root = [tempfile.mkdtemp(dir=base) if rank == 0 else None]
    if world > 1:  # every rank writes into one checkpoint directory
        dist.broadcast_object_list(root, src=0)
    root = root[0]
    out_dir = root
    q = cs.make_queue(shm=shm)
    out = {"nvrx": args.nvrx_version, "mode": args.mode, "cached_gib": cached / GIB}

    def save(tag):
        if gpu:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        cs.async_save(q, state, f"{root}/{tag}", cached=True, shm=shm)
        blocking = time.perf_counter() - t0
        cs.finalize(q)
        return blocking, time.perf_counter() - t0

    out["ckpt_dir"] = os.path.dirname(out_dir)
    out["first_save_blocking_s"], _ = save("s0")
    for t in state.values():
        t.add_(1)
    shutil.rmtree(f"{root}/s0", ignore_errors=True)
    out["warm_save_blocking_s"], out["warm_save_total_s"] = save("s1")
    shutil.rmtree(f"{root}/s1", ignore_errors=True)
    reserved_before = reserved()
    if shim:
        report = colo_shim.fence("bench offload")
        out["release_s"], out["release"] = report.seconds, report.released
    cpu = cs.offload(state)
    out["held_gib"] = reserved() / GIB
    out["held_fraction"] = reserved() / cached
    out["freed_gib"] = (reserved_before - reserved()) / GIB
    state = {k: (v.to(dev) + 1) for k, v in cpu.items()}  # reload: new storage, new values
    del cpu
    if shim:
        checkpoint_fence.rewarm("bench reload")
    time.sleep(args.step_seconds)  # the training step between reload and the next save
    out["after_release_blocking_s"], out["after_release_total_s"] = save("s2")
    out["after_release_vs_warm"] = out["after_release_blocking_s"] / out["warm_save_blocking_s"]
    loaded = cs.load(f"{root}/s2", state)
    out["equal"] = all(torch.equal(loaded[k].to(dev), state[k]) for k in state)
    del loaded
    if shim:
        checkpoint_fence.fence("settle")
        times = []
        for _ in range(20000):
            t0 = time.perf_counter()
            colo_shim.fence("idle")
            times.append(time.perf_counter() - t0)
        times.sort()
        out["idle_fence_us_median"], out["idle_fence_us_p99"] = times[len(times) // 2] * 1e6, times[
            int(len(times) * 0.99)] * 1e6
    q.close()
    if world > 1:
        gathered = [None] * world if rank == 0 else None
        dist.gather_object(out, gathered, dst=0)
        dist.barrier()
        if rank != 0:
            return None
        out = dict(gathered[0], ranks=world, per_rank=gathered,
                   held_gib=max(r["held_gib"] for r in gathered), held_fraction=max(r["held_fraction"] for r in gathered),
                   equal=all(r["equal"] for r in gathered))
    shutil.rmtree(root, ignore_errors=True)
    return out


def run_child(args, version, mode, budget) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([REPO, os.path.join(args.deps, f"nvrx-{version}"), env.get("PYTHONPATH", "")])
    launcher = [sys.executable] if args.ranks == 1 else [sys.executable, "-m", "torch.distributed.run",
                                                         "--standalone", f"--nproc_per_node={args.ranks}"]
    cmd = [*launcher, __file__, "--child", "--mode", mode, "--nvrx-version", version,
           "--gib-params", str(args.gib_params), "--tensors", str(args.tensors), "--step-seconds",
           str(args.step_seconds), "--ckpt-dir", args.ckpt_dir]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=budget, start_new_session=True)
    except subprocess.TimeoutExpired:
        return {"nvrx": version, "mode": mode, "error": f"timed out after {budget:.0f}s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        return {"nvrx": version, "mode": mode, "error": proc.stderr[-1500:]}
    return json.loads(lines[-1])


def table(rows) -> str:
    head = ("NVRx", "mode", "cached GiB", "held GiB", "held %", "equal", "release s", "warm save s",
            "1st save after s", "ratio", "idle fence us")
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['nvrx']} | {r['mode']} | error: {r['error'].splitlines()[-1] if r['error'] else ''}")
            continue
        f = lambda key, fmt: (fmt % r[key]) if r.get(key) is not None else "-"  # noqa: E731
        lines.append(" | ".join([r["nvrx"], r["mode"], f("cached_gib", "%.1f"), f("held_gib", "%.3f"),
                                 "%.2f%%" % (100 * r["held_fraction"]), str(r["equal"]), f("release_s", "%.3f"),
                                 f("warm_save_blocking_s", "%.3f"), f("after_release_blocking_s", "%.3f"),
                                 f("after_release_vs_warm", "%.2fx"), f("idle_fence_us_median", "%.2f")]))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", default="noshim")
    p.add_argument("--nvrx-version", default="0.7.0")
    p.add_argument("--runs", default="0.6.0:noshim,0.6.0:inplace,0.7.0:noshim,0.7.0:inplace,0.7.0:restart,"
                                     "0.6.0:restart", help="NVRX:MODE,... in order (modes: noshim, inplace, restart)")
    p.add_argument("--gib-params", type=float, default=8.0, help="GiB of fp32 params (Adam-like state adds 1x)")
    p.add_argument("--tensors", type=int, default=8)
    p.add_argument("--ranks", type=int, default=1, help="ranks on this host (one GPU each), via torch.distributed.run")
    p.add_argument("--step-seconds", type=float, default=10.0, help="emulated training step before the next save")
    p.add_argument("--deps", default=os.environ.get("COLO_SHIM_TEST_DEPS", os.path.join(REPO, ".deps")))
    p.add_argument("--ckpt-dir", default=tempfile.gettempdir())
    p.add_argument("--budget", type=float, default=3600, help="seconds for the whole run")
    p.add_argument("--out", default=None, help="also copy the JSON here")
    args = p.parse_args(argv)
    if args.child:
        result = child(args)
        if result is not None:  # with several ranks only rank 0 reports
            print(json.dumps(result), flush=True)
        return 0
    import torch

    start, rows = time.monotonic(), []
    runs = [tuple(item.split(":")) for item in args.runs.split(",")]
    for i, (version, mode) in enumerate(runs):
        left = args.budget - (time.monotonic() - start)
        if left < 60:
            rows.append({"nvrx": version, "mode": mode, "error": "skipped: out of time budget"})
            continue
        rows.append(run_child(args, version, mode, left - 10))
        print(json.dumps(rows[-1]), flush=True)
    result = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
              "torch": torch.__version__, "step_seconds": args.step_seconds, "rows": rows}
    os.makedirs(os.path.join(REPO, "bench", "results"), exist_ok=True)
    for directory in filter(None, (os.path.join(REPO, "bench", "results"), args.out)):
        with open(os.path.join(directory, "checkpoint_fence.json"), "w") as f:
            json.dump(result, f, indent=1)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
