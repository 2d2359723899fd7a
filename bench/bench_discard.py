"""Benchmark: CPU bytes a sleeping vLLM engine holds after each finish_generation, level 1 vs colo-shim.

Simulated 20-step GRPO (NeMo-RL v0.7 call order: setup, val_at_start, rollouts, training,
refit, validation every 5 steps) on the engine double with a real small torch model, in fresh
interpreters (tests/discard/vllm_scenarios.py, run by harness/vllm_runs.py). "held" = what the engine
copied to CPU at that sleep plus any CPU copy colo-shim itself keeps. Models:
  plain  - the refit covers every parameter (issue 4's case);
  scaled - layer scales the trainer does not export + a derived parameter (issue 5);
  spec   - scaled + a speculative-decoding drafter head (issue 5);
and vLLM 0.20 (colo-shim copies the uncovered rest) vs 0.31 (vLLM keeps it via
sleep_preserve_parameter_names). Prints tables; writes bench/results/discard*.json.
Run: .venv/bin/python bench/bench_discard.py                        (engine double, numbers labelled so)

Real-vLLM mode (issue 9), measured on the engine itself, writes bench/results/discard_real_vllm.json:
  python3 bench/bench_discard.py --real-vllm                    # on the GPU machine, vLLM installed
  python3 bench/bench_discard.py --real-vllm --from DIR [DIR ...]  # here: merge what came back
bench/real_vllm/device.sh has the device calls; bench/real_vllm/scenarios.py the scenarios.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the repo root: harness/

from harness.vllm_runs import dist_info, run_script  # noqa: E402

RESULTS = os.path.join(HERE, "results")
LOOPS = {"plain": "grpo_plain", "scaled": "grpo", "spec": "spec"}


def finishes(run: dict) -> list[dict]:
    """One row per finish_generation that slept: level used and CPU bytes held afterwards."""
    sleeps = [e for e in run["stats"][0]["events"] if e["event"] == "sleep"]
    history = (run["stats"][0].get("engine_shim") or {}).get("history") or [{}] * len(sleeps)
    return [{"level": e["level"], "held": e["cpu_bytes"] + h.get("shim_cpu_bytes", 0)}
            for e, h in zip(sleeps, history)]


def label(reason: str, step: int) -> str:
    if reason.startswith("setup"):
        return "setup"
    if "validate" in reason:
        return "validation" if step else "val_at_start"
    return f"rollout {step}"


def run(version: str, tmp: str) -> dict:
    return run_script("vllm_scenarios.py", "v0_7", dist_info(tmp, version),
                      {"loops": list(LOOPS.values()), "steps": 20, "val_period": 5}, timeout=600)


def main() -> None:
    os.makedirs(RESULTS, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="bench-discard-")
    res = {"0.20.0": run("0.20.0", tmp), "0.31.0": run("0.31.0", tmp)}

    # --- issue 4: per-finish table for the plain model on vLLM 0.20
    plain_b, plain_s = res["0.20.0"]["baseline:grpo_plain"], res["0.20.0"]["shim:grpo_plain"]
    decisions = plain_s["driver"]["recent"]
    base_rows, shim_rows = finishes(plain_b), finishes(plain_s)
    table, step = [], 0
    for i, (d, b, s) in enumerate(zip(decisions, base_rows, shim_rows)):
        if "rollout" in d["reason"]:
            step += 1
        table.append({"finish": i + 1, "call": label(d["reason"], step), "decision": d["reason"],
                      "requested_level": d["level"], "engine_level": s["level"],
                      "baseline_held_bytes": b["held"], "shim_held_bytes": s["held"]})
    print("Per-finish decisions, 20-step GRPO, validation every 5 steps (plain model, vLLM 0.20 double):")
    print(f"{'#':>3} {'call':<13} {'req':>3} {'used':>4} {'level-1 held B':>14} {'shim held B':>11}  decision")
    for r in table:
        print(f"{r['finish']:>3} {r['call']:<13} {r['requested_level']:>3} {r['engine_level']:>4} "
              f"{r['baseline_held_bytes']:>14} {r['shim_held_bytes']:>11}  {r['decision']}")
    identical = plain_b["outputs"] == plain_s["outputs"]
    weights = max(r["baseline_held_bytes"] for r in table)
    summary = {
        "finishes": len(table),
        "rollout_finishes_discarded": sum(r["engine_level"] == 2 for r in table if r["call"].startswith("rollout")),
        "rollout_finishes": sum(r["call"].startswith("rollout") for r in table),
        "weights_bytes": weights,
        "max_held_after_discard": max(r["shim_held_bytes"] for r in table if r["engine_level"] == 2),
        "tokens_identical_to_level1": identical,
        "nan_generations": plain_s["stats"][0]["nan_generations"],
    }
    print(json.dumps(summary))
    with open(os.path.join(RESULTS, "discard.json"), "w") as fh:
        json.dump({"rows": table, "summary": summary}, fh, indent=1)

    # --- issue 5: preserved bytes for models the refit does not fully cover
    rows = []
    for version, results in res.items():
        for model, loop in LOOPS.items():
            b, s = results[f"baseline:{loop}"], results[f"shim:{loop}"]
            eng = s["stats"][0].get("engine_shim") or {}
            rollout = [r for r, d in zip(finishes(s), s["driver"]["recent"]) if "rollout" in d["reason"]]
            after = [r["held"] for r in rollout if r["level"] == 2]
            level1 = max(r["held"] for r in finishes(b))
            rows.append({"vllm": version, "model": model, "level1_held_bytes": level1,
                         "shim_held_bytes_after_rollout": max(after) if after else None,
                         "preserved_names": len(eng.get("uncovered_names", [])),
                         "preserve_mode": next((h["preserve_mode"] for h in eng.get("history", [])
                                                if h["level"] == 2), None),
                         "ratio": round(max(after) / level1, 4) if after else None,
                         "tokens_identical": b["outputs"] == s["outputs"],
                         "nan_generations": s["stats"][0]["nan_generations"]})
    print("\nCPU bytes held after a rollout finish (refit follows): level 1 vs colo-shim with coverage preservation:")
    print(f"{'vLLM':<7} {'model':<7} {'level-1 B':>9} {'shim B':>7} {'ratio':>7} {'kept names':>10}  "
          f"{'mode':<37} identical")
    for r in rows:
        print(f"{r['vllm']:<7} {r['model']:<7} {r['level1_held_bytes']:>9} {r['shim_held_bytes_after_rollout']:>7} "
              f"{r['ratio']:>7} {r['preserved_names']:>10}  {str(r['preserve_mode']):<37} {r['tokens_identical']}")
    with open(os.path.join(RESULTS, "discard_preserve.json"), "w") as fh:
        json.dump(rows, fh, indent=1)


def real_vllm(argv: list[str]) -> None:
    """Scenarios on real vLLM (bench/real_vllm/), or merge the per-scenario JSON files from DIRs."""
    import shutil

    sys.path.insert(0, os.path.join(HERE, "real_vllm"))
    import report

    out = os.path.join(RESULTS, "discard_real_vllm.json")
    if argv[:1] == ["--from"]:
        merged = tempfile.mkdtemp(prefix="discard-real-")
        for d in argv[1:]:  # a later DIR's file of the same scenario wins
            for f in os.listdir(d):
                if f.endswith(".json") and not f.startswith("discard_real_vllm"):
                    shutil.copy(os.path.join(d, f), merged)
        report.main(merged, out)
        return
    import subprocess

    runs = tempfile.mkdtemp(prefix="discard-real-")
    subprocess.run([sys.executable, os.path.join(HERE, "real_vllm", "scenarios.py"), runs, *argv], check=True,
                   env=dict(os.environ, OUT=runs))
    report.main(runs, out)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--real-vllm"]:
        real_vllm(sys.argv[2:])
    else:
        main()
