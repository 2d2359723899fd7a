#!/usr/bin/env python3
"""Turn one run of main's GRPO (device.sh run X) into a JSON record, and records into a table.

    python3 report.py --run a --rc 0 --wall-s 600 --dir RUN_DIR > run_a.json
    python3 report.py --table run_a.json run_b.json run_c.json

Everything comes from main's own output (driver.log, where Ray forwards every actor's prints) except three things
main does not log: NVRx writer restarts and host RSS (sampler.py), each actor's colo-shim state (actor_status.py),
checkpoint read-back (ckpt_check.py). The patterns are main's print formats (grpo.py's Timing block and
Training Results, megatron_policy_worker.py's GPU Memory lines) and vLLM 0.25's CuMemAllocator sleep line.
"""
import argparse
import json
import os
import re

STEP = re.compile(r"• Total step time: ([\d.]+)s")
TIMER = re.compile(r"• ([\w/]+): ([\d.]+)s \(([\d.]+)%\)")
KL = re.compile(r"• Generation KL Error: ([-\d.naif]+)")
REWARD = re.compile(r"• Avg Reward: ([-\d.naif]+)")
GPU = re.compile(r"GPU Memory (after optimizer offload|after refit complete|before optimizer offload): "
                 r"([\d.]+)GB allocated, ([\d.]+)GB reserved")
SLEEP = re.compile(r"CuMemAllocator: sleep freed ([\d.]+) GiB memory in total, "
                   r"of which ([\d.]+) GiB is backed up in CPU")
SAVE = re.compile(r"Saving checkpoint for step (\d+)")
OOM = re.compile(r"out of memory|OutOfMemoryError")
WAKE = re.compile(r"to wake up tags \[([^\]]*)\]")
UTIL = re.compile(r"'gpu_memory_utilization': ([\d.]+)")  # vLLM's own "non-default args" line: the share it got
ERR = re.compile(rf"Traceback|{OOM.pattern}|CheckpointWorkerDied|ColoShimDiscardError")


def parse_log(text: str) -> dict:
    steps, cur = [], {"gpu": {}, "sleep_backup_gib": []}
    saves, errors, sleeps = [], 0, []
    timing, oom, wake, util = None, None, None, None
    for line in text.splitlines():
        if util is None and "non-default args" in line and (m := UTIL.search(line)):
            util = float(m.group(1))
        if oom is None and OOM.search(line):  # the first, and the last wake-up vLLM finished before it
            oom = {"line": line.strip()[:400], "after_wake": wake, "in_step": len(steps) + 1}
        if m := WAKE.search(line):
            wake = m.group(1)
        if m := STEP.search(line):
            timing = dict(cur, total_step_time=float(m.group(1)), timers={})
            steps.append(timing)
            cur = {"gpu": {}, "sleep_backup_gib": []}
            continue
        if timing is not None and (m := TIMER.search(line)):
            timing["timers"][m.group(1)] = float(m.group(2))
            continue
        timing = None if line.strip() and "•" not in line else timing
        if m := KL.search(line):
            cur["gen_kl_error"] = float(m.group(1))
        elif m := REWARD.search(line):
            cur["avg_reward"] = float(m.group(1))
        elif m := GPU.search(line):
            mem = {"allocated_gb": float(m.group(2)), "reserved_gb": float(m.group(3))}
            cur["gpu"][m.group(1).replace(" ", "_")] = mem
        elif m := SLEEP.search(line):
            cur["sleep_backup_gib"].append(float(m.group(2)))
            sleeps.append(float(m.group(2)))
        elif m := SAVE.search(line):
            saves.append(int(m.group(1)))
        if ERR.search(line):
            errors += 1
    return {"steps": steps, "saves": saves, "error_lines": errors, "sleep_backup_gib": sleeps, "first_oom": oom,
            "vllm_gpu_memory_utilization": util}


def parse_samples(path: str) -> dict:
    """Checkpoint-writer restarts from the policy actor's spawned children (multiprocessing's resource tracker aside):
    NVRx's persistent worker and its results-queue manager both live as long as the writer is kept warm, so a restart
    shows as children beyond the most seen at once. Host RSS summed over every process."""
    writers, peak, policy, most = set(), 0, set(), 0
    gpu = {"policy": 0.0, "writers": 0.0, "total": 0.0}  # MiB, nvidia-smi's per-process use (peak of each)
    if not os.path.exists(path):
        return {}
    with open(path) as fh:
        for line in fh:
            s = json.loads(line)
            for pid, _ppid, cmd, _rss in s["procs"]:
                if "MegatronPolicyWorker" in cmd or "ray::lm_policy" in cmd:  # not ray::vllm_policy
                    policy.add(pid)
            now = {pid for pid, ppid, cmd, _rss in s["procs"]
                   if ppid in policy and "spawn_main" in cmd and "resource_tracker" not in cmd}
            writers |= now
            most = max(most, len(now))
            peak = max(peak, sum(p[3] for p in s["procs"]))
            mib = {int(pid): m for pid, m in s.get("gpu_mib", {}).items()}
            gpu["policy"] = max(gpu["policy"], sum(m for pid, m in mib.items() if pid in policy))
            gpu["writers"] = max(gpu["writers"], sum(m for pid, m in mib.items() if pid in now))
            gpu["total"] = max(gpu["total"], sum(mib.values()))
    return {"nvrx_writer_pids": sorted(writers), "writer_restarts": max(len(writers) - most, 0),
            "host_rss_peak_gib": round(peak / 2**30, 2), "gpu_peak_mib": gpu}


def actor_shim(path: str) -> dict:
    if not os.path.exists(path):
        return {}
    out = {}
    for name, rec in json.load(open(path)).items():
        applied = [r["name"] for r in rec.get("status", []) if r.get("status") == "applied"]
        # the policy worker's own targets: main's refit offloads are not-needed where main finalizes in them (#3322)
        # and applied, with calls, where it does not (runs d0/d1)
        worker = {r["target"].split(":", 1)[1]: [r.get("status"), r.get("calls")] for r in rec.get("status", [])
                  if r.get("target", "").startswith(WORKER_TARGETS) and r.get("status") != "pending"}
        out[name] = {"COLO_SHIM": rec.get("COLO_SHIM"), "loaded": rec.get("colo_shim_loaded"), "applied": applied,
                     "error": rec.get("error") or rec.get("status_error"), **({"worker_targets": worker} if worker else {})}
    return out


WORKER_TARGETS = "nemo_rl.models.policy.workers.megatron_policy_worker:MegatronPolicyWorkerImpl."


PACKAGES = ("torch", "vllm", "nvidia-resiliency-ext", "transformer_engine", "transformer_engine_cu13", "ray",
            "transformers", "pydantic", "colo-shim")


def versions() -> dict:
    """What this job ran: the source trees main was exported with, and each installed package's version."""
    from importlib import metadata

    try:
        from runs import PRE_3322, SOURCES  # run as a script from bench/nemo_rl
    except ImportError:
        from bench.nemo_rl.runs import PRE_3322, SOURCES

    out = {f"{name} (git)": commit for name, commit in SOURCES.items()}
    if os.environ.get("NEMO_RL_TREE") == PRE_3322["NEMO_RL_TREE"]:  # runs d0/d1
        out["NeMo-RL (git)"] += " with PR #3322 (e4b8f3e5e) reversed"
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    try:
        import subprocess

        out["colo-shim (git)"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                                cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or None
        out["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                    text=True).stdout.strip() or None
    except OSError:
        pass
    return out


def driver_shim(d: str) -> dict:
    """The driver's own colo-shim rows (the status file it wrote at exit): which patches applied and the megatron
    family's counters, among them checkpoint/nemo_rl_driver.py's (asked, written_first, polls)."""
    import glob

    for path in glob.glob(os.path.join(d, "shim_status", "*.json")):
        rec = json.load(open(path))
        if "examples/run_grpo.py" in (rec.get("argv") or [""])[0]:
            rows = rec.get("records", [])
            applied = sorted({r["target"] for r in rows if r.get("status") == "applied" and r.get("calls")})
            details = next((r["details"] for r in rows if r.get("name") == "megatron" and r.get("details")), {})
            return {"applied_and_called": applied,
                    **{k: details[k] for k in ("nemo_rl_driver", "nemo_rl_main") if k in details}}
    return {}


def record(run: str, rc: int, wall: float, d: str) -> dict:
    log = parse_log(open(os.path.join(d, "driver.log"), errors="replace").read())
    return {"run": run, "rc": rc, "wall_s": wall, "versions": versions(), **log,
            # /tmp's free space before and after the run (device.sh): a full disk fails main's saves in odd ways
            "disk_free_gib": _json_or_empty(os.path.join(d, "disk_free_gib.json")),
            "samples": parse_samples(os.path.join(d, "samples.jsonl")),
            "actors": actor_shim(os.path.join(d, "actor_status.json")), "driver": driver_shim(d),
            "checkpoints": _json_or_empty(os.path.join(d, "ckpt_check.json"))}


def _json_or_empty(path: str) -> dict:
    """A helper that died or never ran leaves no file, or half of one: the record says so by an empty entry."""
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        return {}


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return round(sum(xs) / len(xs), 2) if xs else None


def row(r: dict) -> str:
    later = r["steps"][1:] or r["steps"]
    step_s = _mean([s["total_step_time"] for s in later])
    prep = _mean([s["timers"].get("prepare_for_generation/total") for s in later])
    ckpt = _mean([s["timers"].get("checkpointing") for s in later])
    after = _mean([s["gpu"].get("after_refit_complete", {}).get("reserved_gb") for s in later])
    sleeps = r["sleep_backup_gib"]  # the first is the engine's sleep at startup, before any rollout
    backup = f"{sleeps[0] if sleeps else None} / {max(sleeps[1:], default=None)}"
    ck = r.get("checkpoints") or {}
    valid = f"{ck.get('valid', '-')}/{len(ck.get('steps', {}))}" if ck else "-"
    trained = f"{ck.get('as_trained', '-')}/{ck.get('checked_against_previous', '-')}" if ck else "-"
    if "anchored_to_start" in ck:  # ckpt_check --initial: each step N against 0.99**N x the HF start
        trained += f"; = decayed start {ck['anchored_to_start']}/{len(ck.get('steps', {}))}"
    shim = sum(1 for a in r["actors"].values() if a.get("applied"))
    return (f"| {r['run']} | {r['rc']} | {len(r['steps'])} | {step_s} | {prep} | {ckpt} | {after} | {backup} | "
            f"{r['samples'].get('writer_restarts', '-')} | {valid} | {trained} | {shim}/{len(r['actors'])} "
            f"| {r['error_lines']} |")


HEADER = ("| run | rc | steps | step s (2nd on) | prepare_for_generation s | checkpointing s "
          "| GPU reserved after refit GB | pinned backup GiB: startup / after rollouts | writer restarts "
          "| ckpt new | ckpt = decayed previous | actors with shim applied | error lines |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run")
    ap.add_argument("--rc", type=int, default=0)
    ap.add_argument("--wall-s", type=float, default=0)
    ap.add_argument("--dir")
    ap.add_argument("--table", nargs="*")
    a = ap.parse_args()
    if a.table is not None:
        print(HEADER)
        for path in a.table:
            print(row(json.load(open(path))))
        return
    print(json.dumps(record(a.run, a.rc, a.wall_s, a.dir), indent=1))


if __name__ == "__main__":
    main()
