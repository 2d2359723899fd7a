"""Staged saves with and without page-locked /dev/shm buffers (COLO_SHIM_STAGE_PIN=1 vs 0).

Per setting, in a fresh process on one GPU: a GPU state dict of --gib GiB (per group: a bf16
param, its fp32 main copy and two fp32 Adam moments, as a mixed-precision optimizer keeps them),
saved through the real NVRx FileSystemWriterAsync(use_cached_data_structure=True) on a persistent
AsyncCallsQueue, the job asking for CUDA IPC and colo-shim's stage strategy staging into /dev/shm
(the way tests/nvrx_scenarios drive NVRx). The D2H staging copy happens while the save is
scheduled, so each save's schedule time (plan + stage + queue) is what is timed; every write is
finalized outside the timed part. Save 1 allocates the buffers (a new worker's restart callback
drops them), save 2 allocates again, save 3 is the first reuse (with pinning on, it registers the
buffers), saves 4.. are the steady state. The staged buffers are compared with the GPU tensors
after the last save. Page-locked bytes are per rank: a node pins ranks x that.

    python bench/bench_stage_pin.py [--nvrx DIR] [--gib 15.8] [--steady 2] [--out DIR]

Needs a CUDA GPU. Writes bench/results/stage_pin.json (and --out DIR/stage_pin.json), prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = float(1 << 30)
BYTES_PER_GROUP_ELEM = 2 + 4 + 4 + 4  # bf16 param, fp32 main param, fp32 exp_avg, fp32 exp_avg_sq


def _state(gib: float, groups: int):
    import torch

    n = max(1, int(gib * GIB / BYTES_PER_GROUP_ELEM / groups))
    state = {}
    for g in range(groups):
        state[f"layer{g}.param"] = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        state[f"layer{g}.main"] = torch.randn(n, device="cuda")
        state[f"layer{g}.exp_avg"] = torch.randn(n, device="cuda")
        state[f"layer{g}.exp_avg_sq"] = torch.rand(n, device="cuda")
    return state


def child(args) -> dict:
    import torch

    os.environ["COLO_SHIM_NVRX_RELEASE"] = "stage"
    import colo_shim

    colo_shim.install(["nvrx"])
    from colo_shim.checkpoint import pinning
    from colo_shim.cli import saver as cs
    from nvidia_resiliency_ext.checkpointing.async_ckpt import filesystem_async

    torch.cuda.set_device(0)
    cs.init_single_rank()
    state = _state(args.gib, args.groups)
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    root = tempfile.mkdtemp(dir=args.ckpt_dir)
    q = cs.make_queue(shm=False)  # the job asks for CUDA IPC; stage switches it to /dev/shm
    times = []
    for i in range(3 + args.steady):
        for t in state.values():
            t.add_(1)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        cs.async_save(q, state, f"{root}/s{i}", cached=True, shm=False)
        times.append(time.perf_counter() - t0)
        cs.finalize(q)
        shutil.rmtree(f"{root}/s{i}", ignore_errors=True)
    cache = filesystem_async.FileSystemWriterAsync._shm_tensor_cache
    pairs = [(state[item.index.fqn], t) for items, ts in cache.values() for item, t in zip(items, ts)]
    equal = len(pairs) == len(state) and all(torch.equal(t.to("cuda"), g.view(t.shape)) for g, t in pairs)
    report = pinning.report()
    steady = sorted(times[3:])
    out = {"pin": os.environ.get(pinning.ENV, "1"), "gib": nbytes / GIB, "tensors": len(state),
           "save1_s": times[0], "save2_s": times[1], "first_reuse_s": times[2],
           "steady_s": steady[len(steady) // 2] if steady else None, "all_s": times,
           "steady_gb_per_s": (nbytes / 1e9 / steady[len(steady) // 2]) if steady else None,
           "staged_equal_gpu": equal, "pinned_bytes": report["pinned_bytes"],
           "pinned_gib": report["pinned_bytes"] / GIB, "pin_registrations": report["pin_registrations"],
           "pin_seconds": report["pin_seconds"], "pin_failures": report["pin_failures"],
           "ckpt_dir": args.ckpt_dir}
    q.close()
    shutil.rmtree(root, ignore_errors=True)
    return out


def run_child(args, pin: str) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLO_SHIM_STAGE_PIN=pin)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [REPO, args.nvrx, env.get("PYTHONPATH", "")] if p)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--gib", str(args.gib), "--groups",
           str(args.groups), "--steady", str(args.steady), "--ckpt-dir", args.ckpt_dir]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.per_run_s,
                              start_new_session=True)
    except subprocess.TimeoutExpired:
        return {"pin": pin, "error": f"timed out after {args.per_run_s:.0f}s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        return {"pin": pin, "error": proc.stderr[-2000:]}
    return json.loads(lines[-1])


COLUMNS = (("pin", "pin", "%s"), ("GiB", "gib", "%.2f"), ("save 1 s", "save1_s", "%.3f"),
           ("save 2 s", "save2_s", "%.3f"), ("first reuse s", "first_reuse_s", "%.3f"),
           ("steady s", "steady_s", "%.3f"), ("steady GB/s", "steady_gb_per_s", "%.1f"),
           ("pinned GiB", "pinned_gib", "%.2f"), ("registrations", "pin_registrations", "%d"),
           ("register s", "pin_seconds", "%.3f"), ("staged == GPU", "staged_equal_gpu", "%s"))


def table(rows) -> str:
    lines = [" | ".join(c[0] for c in COLUMNS), " | ".join("---" for _ in COLUMNS)]
    for r in rows:
        if "error" in r:
            last = r["error"].strip().splitlines()[-1] if r["error"].strip() else ""
            lines.append(f"{r['pin']} | error: {last}")
        else:
            lines.append(" | ".join("-" if r.get(key) is None else fmt % r[key] for _, key, fmt in COLUMNS))
    return "\n".join(lines)


def _default_nvrx() -> str:
    for part in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        if part and os.path.isdir(os.path.join(part, "nvidia_resiliency_ext")):
            return part
    return ""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--nvrx", default=_default_nvrx(), help="directory holding NVRx 0.7.0 (default: from PYTHONPATH)")
    p.add_argument("--gib", type=float, default=15.8, help="GiB of GPU tensors saved per rank")
    p.add_argument("--groups", type=int, default=64, help="param groups (4 tensors each)")
    p.add_argument("--steady", type=int, default=2, help="steady saves after the first reuse")
    p.add_argument("--ckpt-dir", default=None, help="where checkpoints are written (default /dev/shm if it has room)")
    p.add_argument("--per-run-s", type=float, default=150.0, help="limit for each fresh process")
    p.add_argument("--out", default=None, help="also write stage_pin.json into this directory")
    args = p.parse_args(argv)
    if args.ckpt_dir is None:
        room = shutil.disk_usage("/dev/shm").free if os.path.isdir("/dev/shm") else 0
        args.ckpt_dir = "/dev/shm" if room > 2.5 * args.gib * GIB else tempfile.gettempdir()
    import torch

    if not torch.cuda.is_available():
        print("bench_stage_pin: needs a CUDA GPU (it times device-to-host staging copies into /dev/shm "
              "with and without cudaHostRegister); none is visible here.", file=sys.stderr)
        return 2
    if args.child:
        print(json.dumps(child(args)), flush=True)
        return 0
    rows = [run_child(args, pin) for pin in ("0", "1")]
    text = table(rows)
    print(text)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _common

    payload = {"bench": "stage_pin", "gib": args.gib, "nvrx": args.nvrx, "rows": rows, "table": text,
               "gpu": torch.cuda.get_device_name(0)}
    path = _common.save("stage_pin", payload)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "stage_pin.json"), "w") as fh:
            json.dump(payload, fh, indent=2)
    print(f"saved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
