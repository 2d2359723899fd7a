"""Checkpoint fence on the real path: megatron-core GPTModel + DDP + distributed optimizer, NVRx saves.

Per release strategy (COLO_SHIM_NVRX_RELEASE) and NVRx version, in a fresh process on one GPU
(torch.distributed single rank, NCCL): a GPTModel (default 16 layers x 2048 hidden, 0.94B params)
in megatron-core's DDP with the distributed optimizer; `dist_checkpointing.save(...,
async_sharded_save=True)` with the NVRx strategy and cached structure, scheduled on a persistent
NVRx AsyncCallsQueue; the offload through the real entry points in NeMo-RL's order (each DDP
buffer's offload_to_cpu, then optimizer.offload_to_cpu()), with no explicit fence() call: the
shim's megatron/nvrx families do everything. The job itself, and what each number of its row
means, is fence_megatron_job.py (run here as `--child`); this file runs it per strategy and
version, each in a fresh process group, and renders the rows.
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
import json
import os
import shutil
import signal
import subprocess
import sys
import time

from fence_megatron_job import child, derive  # a sibling: the script's folder is on sys.path

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORDER = (("stage", "0.7.0"), ("inplace", "0.7.0"), ("stage", "0.6.0"), ("inplace", "0.6.0"),
         ("restart", "0.7.0"), ("restart", "0.6.0"))  # the table's order; stage rows are old results
RUNS = tuple(run for run in ORDER if run[0] != "stage")


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
                runs[(row["strategy"], row["nvrx"])] = dict(derive(row), source=os.path.basename(os.path.dirname(
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
