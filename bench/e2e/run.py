"""Colocated GRPO on one GPU, end to end: a megatron-core trainer and a vLLM engine time-share it.

    python bench/e2e/run.py --runs shim@0.7.0:10,noshim@0.7.0:3 --site DIR --out DIR [--size full]
    python bench/e2e/run.py --merge A.json B.json ... --out bench/e2e/results/e2e_h200.json

Each run is a fresh driver process in its own session (killed with everything it started: the
trainer, the engine, NVRx's writer): the driver runs the site package's `grpo_train`
(bench/e2e/site/nemo_rl, NeMo-RL main's module layout) and spawns the two actors (rpc.py). Modes:

  noshim          no colo-shim, NVRx async cached saves left in flight (NeMo-RL main's loop)
  shim            COLO_SHIM=1 (default release: the writer lets go while its write goes on, issue 22)
  sync_save       workaround: synchronous saves, no shim (NeMo-RL v0.3-v0.7's async_save=False)
  main3322        workaround: NeMo-RL main's worker (PR #3322 blocking finalize at offload), no shim
  main3322_shim   main's worker with COLO_SHIM=1 and the default release (issue 22)
  nosave          the same loop without checkpoints, no colo-shim (issue 34's baseline)
  nosave_shim     without checkpoints, COLO_SHIM=1 (the offload family's mirrors, no save to fence)
  stage, stage_nopin, main3322_stage
                  measured the stage release (page-locked /dev/shm staging; stage_nopin without the
                  page-locking) before it was retired; they still run, as shim / main3322_shim with
                  COLO_SHIM_NVRX_RELEASE=stage (the deprecated alias of the default), recorded as
                  release "stage (retired: runs as inplace)"

Run options follow the steps, colon-separated (specs.py says what each does): kvdelta=N,
order=before|after (main-worker modes), ckpt=disk, offload=on|off (shim modes), ranks=N (issue 25),
size=NAME (driver.SIZES), verify=off, nosave=K, limit=S, threads=N (issue 34). E.g.
`main3322_shim@0.7.0:4:order=after`, `shim@0.7.0:10:ranks=2`, `shim@0.7.0:7:size=2.1b:nosave=3:verify=off`.

Sizing (KV cache): `--kv auto` sets vLLM's kv_cache_memory_bytes to F - margin, F = free device
memory right after offload_after_refit in the last colo-shim run of this invocation (or
--kv-free-gib), margin --kv-margin-gib (3): a job tuned to the GPU with the shim fits, without it
the writer's memory must be free at wake-up and is not. A run spec `mode@nvrx:steps:kvdelta=-16`
shrinks the KV cache of that run (to see what a no-shim job that fits writes). F is per model size:
a size not measured yet takes another size's F less its extra engine weights (--kv-free-size names
the size --kv-free-gib was measured at).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SITE = os.path.join(HERE, "site")
GIB = float(1 << 30)
sys.path[:0] = [p for p in (REPO, SITE) if p not in sys.path]
from bench.e2e.driver import MODES, SIZES, params_of, platform as driver_platform  # noqa: E402
from bench.e2e.specs import name as _name, parse as _parse  # noqa: E402
from colo_shim.cli import groups  # noqa: E402


def _site_path(args, nvrx: str) -> list:
    parts = [REPO, SITE]
    if args.site:
        parts += [os.path.join(args.site, "mcore"), os.path.join(args.site, "nvrx" + nvrx.replace(".", ""))]
    return parts


def _free_gib(measured: list, size: str, ranks: int) -> tuple:
    """F for a run of `size`: the last measurement of that size, else the last of another size less the
    engine's extra weights (2 bytes a parameter per GPU: what the trainer's offload leaves free does
    not depend on its size), else None."""
    same = [f for s, f in measured if s == size]
    if same:
        return same[-1], "measured"
    if measured:
        ref, free = measured[-1]
        return free - 2 * (params_of(size) - params_of(ref)) / ranks / GIB, f"measured at size {ref}, less the weights"
    return None, None


def orchestrate(args) -> int:
    results = []
    measured_free = [(args.kv_free_size or args.size, f) for f in args.kv_free_gib or []]
    start = time.monotonic()
    call = time.strftime("%Y%m%dT%H%M%S") + f"-{os.getpid()}"  # pairs rows of this call (report.py's ratios)
    os.makedirs(args.out, exist_ok=True)
    for mode, nvrx, steps, opts in [_parse(spec) for spec in args.runs.split(",")]:  # all checked first
        kvdelta, name = opts["kvdelta"], _name(mode, nvrx, opts)
        size = opts.get("size") or args.size
        ckpt_dir = args.disk_dir if opts.get("ckpt") else args.ckpt_dir
        tag = name.split("@", 1)[1].replace(" ", "-").replace("=", "")
        left = args.budget_s - (time.monotonic() - start)
        if left < 45:
            results.append({"name": name, "mode": mode, "nvrx": nvrx, "skipped": f"budget: {left:.0f}s left", "steps": []})
            continue
        kv, rule = None, None
        if not args.fake_engine:
            if args.kv == "auto":
                free, how = _free_gib(measured_free, size, opts["ranks"])
                free = args.kv_default_gib + args.kv_margin_gib if free is None else free
                kv = int((free - args.kv_margin_gib + kvdelta) * GIB)
                rule = (f"F - {args.kv_margin_gib:g} GiB{kvdelta:+g} GiB, F = {free:.2f} GiB free after offload_after_refit "
                        + (f"in a shim run ({how})" if how else "(default, not measured yet)"))
            else:
                kv, rule = int(float(args.kv) * GIB), "fixed"
        shim, release, layout, _, extra = MODES[mode]
        env = {k: v for k, v in os.environ.items() if not k.startswith("COLO_SHIM")}
        paths = ([os.path.join(REPO, "colo_shim", "bootstrap")] if shim else []) + _site_path(args, nvrx)
        env.update(PYTHONPATH=os.pathsep.join(paths + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])),
                   PYTHONUNBUFFERED="1", E2E_WORKER=layout, VLLM_ENABLE_V1_MULTIPROCESSING="0",
                   VLLM_ALLOW_INSECURE_SERIALIZATION="1", NCCL_NVLS_ENABLE="0", **extra)
        if args.fake_engine:
            env["E2E_FAKE_ENGINE"] = "1"
        if opts.get("threads", 1) > 1:
            env["E2E_SAVE_THREADS"] = str(opts["threads"])
        if shim:
            env["COLO_SHIM"] = "1"
            if release:
                env["COLO_SHIM_NVRX_RELEASE"] = release
            if opts.get("offload"):
                env["COLO_SHIM_OFFLOAD"] = opts["offload"]
        progress = os.path.join(args.out, f"progress-{mode}-{tag}.json")
        work = os.path.join(args.work, f"{mode}-{tag}")
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
        if os.path.exists(progress):
            os.remove(progress)
        cmd = [sys.executable, os.path.abspath(__file__), "--driver", "--mode", mode, "--name", name, "--nvrx", nvrx,
               "--steps", str(steps), "--size", size, "--val-period", str(args.val_period), "--progress", progress,
               "--nosave-steps", str(opts["nosave"]), "--verify", "0" if opts.get("verify") else "1",
               "--work", work, "--ckpt-dir", ckpt_dir, "--kv-bytes", str(kv or 0), "--kv-rule", str(rule),
               "--ckpt-medium", "disk" if opts.get("ckpt") else "shm", "--ranks", str(opts["ranks"])] + (
                   ["--order", opts["order"]] if opts.get("order") else [])
        shm_before = set(os.listdir("/dev/shm"))
        t0 = time.monotonic()
        log_path = os.path.join(args.out, f"log-{mode}-{tag}.txt")
        os.makedirs(ckpt_dir, exist_ok=True)
        log = open(log_path, "w")
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO)
        limit = min(opts["limit"] or args.per_run_s, left)
        try:
            rc = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            rc = "timeout"
        end_run(proc)
        log.close()
        # A driver killed at its limit cannot remove its checkpoints, nor NVRx its shared-memory
        # buffers: whatever this run left in /dev/shm would fill the next run's host memory.
        # Its checkpoints always go; other new /dev/shm entries (NVRx's shm path) only with
        # --clean-shm, on a machine this harness has to itself (the GPU lease), never on a shared one.
        shutil.rmtree(os.path.join(ckpt_dir, f"e2e_{proc.pid}"), ignore_errors=True)
        leftover = sorted(set(os.listdir("/dev/shm")) - shm_before)
        for entry in leftover if args.clean_shm else ():
            path = os.path.join("/dev/shm", entry)
            shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else _unlink(path)
        row = json.load(open(progress)) if os.path.exists(progress) else {"name": name, "mode": mode, "nvrx": nvrx,
                                                                            "steps": []}
        if rc == "timeout" and "error" not in row:
            row["error"] = f"run limit {limit:.0f}s reached after {len(row['steps'])} steps"
        elif rc != 0 and "error" not in row:
            row["error"] = f"driver exit {rc}; see log"
        row.setdefault("ranks", opts["ranks"])  # a driver that died before its first record
        row["wall_s"] = round(time.monotonic() - t0, 1)
        row["shm_left_behind"] = len(leftover)
        row["log_tail"] = open(log_path).read()[-1500:] if row.get("error") else None
        if shim and row.get("free_after_offload_gib"):
            measured_free.append((size, min(row["free_after_offload_gib"])))
        results.append(row)
        print(f"[e2e] {name}: {len(row['steps'])} steps, {row['wall_s']}s, error={str(row.get('error'))[:300]}", flush=True)
    platforms = [row.pop("platform") for row in results if row.get("platform")]
    meta = dict(_meta(args, platforms[0] if platforms else None), call=call)
    report = [dict(row, meta=meta) for row in results]
    with open(os.path.join(args.out, "e2e.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
    from bench.e2e import report as rep

    print(rep.markdown(report))
    return 0


def end_run(proc) -> None:
    """Kill a run's session (the driver if still there, trainer, engine, NVRx writer, verifier) but
    not multiprocessing's resource tracker, which then unlinks what their queues left in /dev/shm."""
    groups.end(proc.pid)  # a killpg took the tracker too: 6 sem.mp-* of a driver's queues stayed
    proc.wait()


def _unlink(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def _meta(args, platform: dict | None) -> dict:
    """platform: torch and the GPU as a driver of this call saw them; the orchestrator asks torch
    itself only when no driver got that far (importing it costs seconds of CPU for two values)."""
    from bench.e2e.hostmem import mem_total

    out = {"size": args.size, "sizes": SIZES[args.size], "val_period": args.val_period,
           "kv_margin_gib": args.kv_margin_gib, "mem_total_gib": round(mem_total() / GIB, 2), "boot": _boot()}
    try:
        out.update(platform or driver_platform())
    except Exception:
        pass
    return out


def _boot() -> str:
    """This machine and boot: rows of calls on one warm machine may be compared (report.py --pair machine)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f"{os.uname().nodename}/{f.read().strip()}"
    except OSError:
        return None


def _fill_failed_wake(row) -> None:
    """Runs recorded before the recorder also hooked failed calls lack the failing step's wake record;
    the engine's own record of it is in the run's error (RuntimeError: engine not awake: ... {...})."""
    import ast
    import re

    step = row["steps"][-1] if row.get("steps") else None
    match = re.search(r"the last wake_up failed \((\{'tags'.*?\})\)", str(row.get("error", "")))
    if step is None or step.get("wake_ok") is not None or match is None:
        return
    w = ast.literal_eval(match.group(1))
    step.update(wake_ok=False, wake_free_gib=round(w["free_before"] / GIB, 3), wake_error=w["error"],
                wake_requested_gib=round(w["requested"] / GIB, 3), wake_filled_from="error")
    step["wakes"].append({"tags": w["tags"], "ok": False, "free_gib": step["wake_free_gib"],
                          "requested_gib": step["wake_requested_gib"], "s": w["s"], "error": w["error"]})


def merge(paths, out) -> int:
    """One results file from several device calls; later files win per run name and engine version."""
    from bench.e2e import report as rep

    runs = {}
    for path in paths:
        part = json.load(open(path))
        for row in rep.runs_of(part):
            row.setdefault("meta", part.get("meta", {}) if isinstance(part, dict) else {})
            if "skipped" not in row:
                _fill_failed_wake(row)
                runs[(row["name"], row.get("vllm"))] = dict(row, source=os.path.relpath(path, REPO) if path.startswith(REPO) else path)
    order = {m: i for i, m in enumerate(("nosave", "nosave_shim", "noshim", "shim", "stage", "stage_nopin", "sync_save",
                                         "main3322", "main3322_shim", "main3322_stage"))}
    report = sorted(runs.values(), key=lambda r: (r.get("vllm") != "0.26.0", r.get("nvrx") != "0.7.0", order.get(r.get("mode"), 99), r["name"]))
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(report, f, indent=1, default=str)
    print(rep.markdown(report))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--driver", action="store_true")
    ap.add_argument("--mode", default="shim")
    ap.add_argument("--name", default="")
    ap.add_argument("--nvrx", default="0.7.0")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--runs", default="shim@0.7.0:2")
    ap.add_argument("--size", default="full", choices=sorted(SIZES))
    ap.add_argument("--val-period", type=int, default=3)
    ap.add_argument("--site", default=None, help="DIR with mcore/, nvrx060/, nvrx070/ (--target installs)")
    ap.add_argument("--out", default="/tmp/colo_e2e_out")
    ap.add_argument("--work", default="/tmp/colo_e2e")
    ap.add_argument("--ckpt-dir", default="/dev/shm")
    ap.add_argument("--disk-dir", default="/var/tmp/colo_e2e_ckpt", help="checkpoints of runs with ckpt=disk")
    ap.add_argument("--ckpt-medium", default="shm")
    ap.add_argument("--order", default=None, choices=("before", "after"))
    ap.add_argument("--ranks", type=int, default=1, help="trainer ranks and engine workers (one per GPU)")
    ap.add_argument("--progress", default=None)
    ap.add_argument("--kv", default="auto")
    ap.add_argument("--kv-bytes", type=int, default=0)
    ap.add_argument("--kv-rule", default=None)
    ap.add_argument("--kv-free-gib", type=float, action="append", default=None)
    ap.add_argument("--kv-free-size", default=None, help="the size --kv-free-gib was measured at (default --size)")
    ap.add_argument("--nosave-steps", type=int, default=0, help="driver: steps before checkpointing starts")
    ap.add_argument("--verify", type=int, default=1, help="driver: read every checkpoint back (0: keep one, no check)")
    ap.add_argument("--kv-default-gib", type=float, default=100.0)
    ap.add_argument("--kv-margin-gib", type=float, default=3.0)
    ap.add_argument("--fake-engine", action="store_true")
    ap.add_argument("--clean-shm", action="store_true", help="remove what each run left in /dev/shm")
    ap.add_argument("--per-run-s", type=float, default=420)
    ap.add_argument("--budget-s", type=float, default=560)
    ap.add_argument("--merge", nargs="+", default=None)
    args = ap.parse_args()
    if args.merge:
        return merge(args.merge, args.out)
    if args.driver:
        from bench.e2e.driver import driver

        return driver(args)
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
