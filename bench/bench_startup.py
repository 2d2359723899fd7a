"""Interpreter start-up (`python -c pass`) with the wheel's activator installed.

The activator sits in every interpreter of a job, so its inactive cost is paid by every process,
and its active cost by every process even if it never imports a target. Conditions are run
interleaved, round after round, so drift on a shared machine hits them all alike.
Goals: <= 1 ms added inactive, <= 5 ms added active (COLO_SHIM=1, no target imported).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time

from _common import save, summarize

from harness import envs
from harness.procs import clean_env


def conditions(venv: str, plain: str, bundle: str):
    """(name, python, extra env, whether the wheel's colo_shim.pth is present, baseline name)."""
    py, plain_py = envs.venv_python(venv), envs.venv_python(plain)
    bootstrap = os.path.join(envs.site_packages(venv), "colo_shim", "bootstrap")  # pip compiled it
    return [
        ("no activator (.pth removed)", py, {}, False, None),
        (".pth, COLO_SHIM unset", py, {}, True, "no activator (.pth removed)"),
        (".pth, COLO_SHIM=1", py, {"COLO_SHIM": "1"}, True, "no activator (.pth removed)"),
        ("run bootstrap, COLO_SHIM unset", py, {"PYTHONPATH": bootstrap}, False, "no activator (.pth removed)"),
        ("run bootstrap, COLO_SHIM=1", py, {"PYTHONPATH": bootstrap, "COLO_SHIM": "1"}, False,
         "no activator (.pth removed)"),
        ("plain venv (no colo-shim, no wrapt)", plain_py, {}, False, None),
        ("plain venv + bundle, unset", plain_py, {"PYTHONPATH": bundle}, False, "plain venv (no colo-shim, no wrapt)"),
        ("plain venv + bundle, COLO_SHIM=1", plain_py, {"PYTHONPATH": bundle, "COLO_SHIM": "1"}, False,
         "plain venv (no colo-shim, no wrapt)"),
    ]


def importtime_breakdown(python: str, runs: int = 7) -> dict:
    """Median cumulative import time (us) of what COLO_SHIM=1 loads at start, from -X importtime."""
    import statistics

    watch = ("colo_shim", "colo_shim.core.config", "colo_shim.core.registry", "colo_shim.core.wrapping", "wrapt",
             "logging", "dataclasses", "colo_shim.checkpoint.nvrx", "colo_shim.checkpoint.megatron",
             "colo_shim.discard.vllm")
    seen = {m: [] for m in watch}
    count = []
    for _ in range(runs):
        proc = subprocess.run([python, "-X", "importtime", "-c", "pass"], env=clean_env(COLO_SHIM="1"),
                              capture_output=True, text=True, timeout=30, cwd="/")
        lines = [line.split("|") for line in proc.stderr.splitlines() if line.startswith("import time:")][1:]
        count.append(len(lines))
        for _, cumulative, name in lines:
            if name.strip() in seen:
                seen[name.strip()].append(int(cumulative))
    out = {m: statistics.median(v) for m, v in seen.items() if v}
    out["modules_imported"] = statistics.median(count)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=100)
    args = parser.parse_args()
    venv = envs.wheel_venv("venv-bench-312", probe=False)
    plain = envs.plain_venv()
    bundle = os.path.join(envs.cache_root(), "bench-bundle")
    subprocess.run([os.path.join(venv, "bin", "colo-shim"), "bundle", bundle], check=True, timeout=120,
                   env=clean_env(), stdout=subprocess.DEVNULL)
    conds = conditions(venv, plain, bundle)
    pth = os.path.join(envs.site_packages(venv), "colo_shim.pth")
    off = pth + ".off"
    if os.path.exists(off):  # an interrupted earlier run
        os.replace(off, pth)
    samples = {c[0]: [] for c in conds}
    try:
        for _ in range(args.rounds):
            for name, python, extra, with_pth, _ in conds:
                if with_pth != os.path.exists(pth):
                    os.replace(*((off, pth) if with_pth else (pth, off)))
                env = clean_env(**extra)
                start = time.perf_counter()
                subprocess.run([python, "-c", "pass"], env=env, check=True, timeout=30, cwd="/",
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                samples[name].append(time.perf_counter() - start)
    finally:
        if os.path.exists(off):
            os.replace(off, pth)
    stats = {name: summarize(v) for name, v in samples.items()}
    rows = []
    print(f"python -c pass, {args.rounds} interleaved rounds (PYTHONDONTWRITEBYTECODE="
          f"{os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r}), Python 3.12 venvs")
    print(f"{'condition':38s} {'median ms':>10s} {'p90 ms':>8s} {'added ms':>9s}")
    for name, _, _, _, base in conds:
        s = dict(stats[name])
        s["added_median_ms"] = s["median_ms"] - stats[base]["median_ms"] if base else 0.0
        rows.append({"condition": name, "baseline": base, **s})
        added = f"{s['added_median_ms']:+9.2f}" if base else f"{'(base)':>9s}"
        print(f"{name:38s} {s['median_ms']:10.2f} {s['p90_ms']:8.2f} {added}")
    breakdown = importtime_breakdown(envs.venv_python(venv))
    print("COLO_SHIM=1 -X importtime, median cumulative us: " +
          ", ".join(f"{k} {v:.0f}" for k, v in breakdown.items()))
    print("goals: <= 1 ms added inactive, <= 5 ms added active (no target imported)")
    print("wrote", save("startup", {"rounds": args.rounds, "rows": rows, "importtime_us": breakdown,
                                    "goals_ms": {"inactive": 1.0, "active": 5.0}}))


if __name__ == "__main__":
    main()
