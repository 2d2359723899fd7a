"""Shared by the benchmarks: the repo root on sys.path (for harness/, which the tests use too) and a results
writer."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
if REPO not in sys.path:  # harness.envs builds the venvs the activation tests use too
    sys.path.insert(0, REPO)


def summarize(samples_s) -> dict:
    ordered = sorted(samples_s)
    return {"n": len(ordered), "median_ms": statistics.median(ordered) * 1e3,
            "p90_ms": ordered[int(0.9 * (len(ordered) - 1))] * 1e3, "min_ms": ordered[0] * 1e3}


def save(name: str, payload: dict) -> str:
    payload = {"machine": {"python": sys.version.split()[0], "platform": platform.platform(),
                           "cpus": os.cpu_count()}, **payload}
    os.makedirs(os.path.join(BENCH, "results"), exist_ok=True)
    path = os.path.join(BENCH, "results", f"{name}.json")
    with open(path, "w") as fh:
        json.dump(payload, fh, indent=2)
    return path
