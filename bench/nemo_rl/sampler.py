#!/usr/bin/env python3
"""Process and GPU samples beside main's job, for what main does not log: NVRx checkpoint-worker restarts (distinct
pids of the policy actor's spawned children), host RSS, per-process GPU memory. One JSON line per sample.

    python3 sampler.py OUT.jsonl DRIVER_PID [--every 2]
"""
import json
import os
import subprocess
import sys
import time

import psutil


def gpu_apps():
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
        return {int(p): float(m) for p, m in (line.split(",") for line in out.splitlines() if line.strip())}
    except Exception:
        return {}


def main() -> None:
    out, driver = sys.argv[1], int(sys.argv[2])
    every = float(sys.argv[4]) if len(sys.argv) > 4 else 2.0
    with open(out, "a") as fh:
        while psutil.pid_exists(driver):
            procs = []
            for p in psutil.process_iter(["pid", "ppid", "cmdline", "memory_info"]):
                info = p.info
                cmd = " ".join(info["cmdline"] or [])[:200]
                if not cmd or info["memory_info"] is None:
                    continue
                procs.append([info["pid"], info["ppid"], cmd, info["memory_info"].rss])
            fh.write(json.dumps({"t": time.time(), "procs": procs, "gpu_mib": gpu_apps()}) + "\n")
            fh.flush()
            time.sleep(every)


if __name__ == "__main__":
    main()
