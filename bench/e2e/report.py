"""Tables from the e2e harness's JSON (bench/e2e/results/e2e_h200.json).

    python bench/e2e/report.py [--markdown | --readme | --sweep [--pair machine] | --svg OUT.svg] [--only REGEX] [FILE]

One row per run: steps finished, wake-ups OOM, what the writer held after the offload (max over
steps, and as a share of the offloaded state), host peak, pinned host memory after rollout
finishes vs the level-1 backup, checkpoints and refits equal, median step time and offload wait
(steps with a save in flight, and those without a validation), save scheduling (save 1 starts NVRx's
worker; save 2 stages again, because the new worker's restart callback dropped save 1's buffers;
median of saves 3 on, the cached buffers reused), colo-shim's page-locked staging bytes (runs of
the stage release before its retirement; 0 since), and
whether the generated ids match the no-shim/first run's at each common step (same weights in,
same ids out: a cross-run reference).
"""

from __future__ import annotations

import json
import os
import statistics
import sys

sys.path[:0] = [p for p in (os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),)
                if p not in sys.path]
from bench.e2e import chart, compare  # noqa: E402

DEFAULT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "e2e_h200.json")


def _med(xs):
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 2) if xs else None


def _fmt(v):
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.2f}"
    return str(v)


def runs_of(report) -> list:
    """The results file is a list of runs (issue 17's schema); older call files were {"meta", "runs"}."""
    return report if isinstance(report, list) else report["runs"]


def _runs(report) -> list:
    return compare.expand([r for r in runs_of(report) if "skipped" not in r])


def rows(report: dict) -> list[dict]:
    return table(report)[0]


def table(report, pair: str = "call") -> tuple:
    """(one row per run, the runs they come from): runs with a no-save phase split in two (compare.py)."""
    runs = _runs(report)
    ref = {}
    for r in runs:  # reference ids per step: the first run that has them
        for s in r["steps"]:
            if s.get("ids_digest") and s["step"] not in ref:
                ref[s["step"]] = (r["name"], s["ids_digest"])
    out = []
    for r in runs:
        steps = r["steps"]
        done = [s for s in steps if s.get("step_s") is not None]
        held = [s["held_gib"] for s in steps if s.get("held_gib") is not None]
        off = [s["offloaded_gib"] for s in steps if s.get("offloaded_gib")]
        # steps whose refit offload met the previous step's save: every step after the run's (or its
        # saving phase's) first, async or not; shim fences finalize it, so pending counts lie
        inflight = [s for s in done if s["step"] >= r.get("first_step", 1) + 1]
        ck = [s["ckpt_equal"] for s in steps if s.get("ckpt_equal") is not None]
        rf = [s["refit_equal"] for s in steps if s.get("refit_equal") is not None]
        sched = [s.get("save_schedule_s") for s in steps if s.get("save_schedule_s") is not None]
        registered = [s["stage_registered_gib"] for s in steps if s.get("stage_registered_gib") is not None]
        pinned = [s["pinned_after_finish_gib"] for s in steps if s.get("pinned_after_finish_gib") is not None]
        discarded = [s for s in steps if s.get("discarded")]
        ids = [s for s in steps if s.get("ids_digest") and s["step"] in ref]
        same = [s["ids_digest"] == ref[s["step"]][1] for s in ids]
        oom = [s for s in steps if s.get("wake_ok") is False]
        share = round(100 * max(held) / max(off), 1) if held and off else None
        out.append({
            "run": r["name"], "shim": r.get("shim"), "release": r.get("release"), "vllm": r.get("vllm"),
            "steps": len(done), "oom": len(oom), "ranks": int(r.get("ranks") or 1),  # older records: one rank
            "oom_detail": (f"step {oom[0]['step']} wake_up: {oom[0].get('wake_error', '?')[:80]} "
                           f"(free {oom[0].get('wake_free_gib')} GiB < asked {oom[0].get('wake_requested_gib')} GiB)"
                           if oom else None),
            "held_gib": max(held) if held else None, "held_pct": share, "offloaded_gib": max(off) if off else None,
            "host_peak_gib": max((s["host_peak_gib"] for s in done if s.get("host_peak_gib") is not None), default=None),
            "pinned_after_finish_gib": max(pinned) if pinned else None, "level1_backup_gib": r.get("level1_backup_gib"),
            "discarded": f"{len(discarded)}/{len(pinned)}",
            "ckpt_equal": f"{sum(ck)}/{len(ck)}" if ck else "-", "refit_equal": f"{sum(rf)}/{len(rf)}" if rf else "-",
            "ids_match_ref": f"{sum(same)}/{len(same)}" if same else "-",
            "step_s": _med([s["step_s"] for s in done]),
            "step_inflight_s": _med([s["step_s"] for s in inflight]),
            "step_plain_s": _med([s["step_s"] for s in inflight if "validation" not in (s.get("times") or {})]),
            "offload_wait_s": _med([s.get("offload_wait_s") for s in inflight]),
            "main_finalize_s": _med([s.get("main_finalize_s") for s in inflight]),
            "finalize_s": _med([s.get("save_finalize_prev_s") for s in inflight]),
            "ckpt_medium": r.get("ckpt_medium") or "shm",
            "save_first_s": sched[0] if sched else None, "save_second_s": sched[1] if len(sched) > 1 else None,
            "save_steady_s": _med(sched[2:]),
            "registered_gib": max(registered) if registered else None,
            "kv_cache_gib": r.get("kv_cache_gib"),
            "error": _short(r.get("error")),
        })
    compare.ratios(out, runs, pair)
    return out, runs


def _short(error):
    if not error:
        return None
    text = str(error)
    if "engine not awake" in text:
        return "the run ended at the next generate (the engine could not wake)"
    if text.startswith("EOFError"):
        return "an actor process died without a Python error (EOFError on the driver's pipe)"
    return (text.strip().splitlines() or [""])[0][:140]


COLS = [("run", "run"), ("vllm", "vLLM"), ("steps", "steps"), ("oom", "wake OOM"), ("ranks", "ranks"), ("held_gib", "held GiB"),
        ("held_pct", "held % of offloaded"),
        ("offloaded_gib", "offloaded GiB"), ("host_peak_gib", "host peak GiB"),
        ("pinned_after_finish_gib", "pinned after finish GiB"), ("level1_backup_gib", "level-1 backup GiB"),
        ("discarded", "finishes discarded"), ("ckpt_equal", "ckpt equal"), ("refit_equal", "refit equal"),
        ("ids_match_ref", "ids = ref"), ("step_s", "step s (median)"), ("step_inflight_s", "step s, steps >= 2"),
        ("step_plain_s", "step s, steps >= 2 w/o validation"),
        ("offload_wait_s", "offload wait s, steps >= 2"), ("main_finalize_s", "main's checkpointer wait s"),
        ("finalize_s", "save's finalize wait s"), ("vs_nosave", "vs no-save"), ("vs_sync", "vs sync saves"),
        ("ckpt_medium", "ckpt on"), ("save_first_s", "save sched. 1st s"),
        ("save_second_s", "save sched. 2nd s"), ("save_steady_s", "save sched. 3rd on s (median)"),
        ("registered_gib", "page-locked staging GiB"), ("kv_cache_gib", "KV GiB")]


SHORT = [("run", "run"), ("vllm", "vLLM"), ("steps", "steps"), ("oom", "wake OOM"), ("ranks", "ranks"), ("held_pct", "held %"),
         ("ckpt_equal", "ckpt equal"), ("step_plain_s", "step s, save in flight"),
         ("offload_wait_s", "offload wait s"), ("host_peak_gib", "host peak GiB"), ("vs_nosave", "vs no-save")]


def markdown(report: dict, cols=None) -> str:
    cols = cols or COLS
    lines = ["| " + " | ".join(h for _, h in cols) + " |", "|" + "---|" * len(cols)]
    notes = []
    for row in rows(report):
        lines.append("| " + " | ".join(_fmt(row[k]) for k, _ in cols) + " |")
        if row["oom_detail"] or row["error"]:
            notes.append(f"- {row['run']} (vLLM {row['vllm']}): " + "; ".join(x for x in (row["oom_detail"], row["error"]) if x))
    skipped = [r for r in runs_of(report) if "skipped" in r]
    notes += [f"- {r['name']}: not run ({r['skipped']})" for r in skipped]
    return "\n".join(lines + ([""] + notes if notes else []))


SPLIT = ("offload_before_refit", "weight_transfer", "offload_after_refit", "wake_kv_cache", "generation",
         "finish_generation", "logprobs", "train", "validation", "save_checkpoint")


def split_markdown(report: dict) -> str:
    """Median seconds per phase over steps >= 2 (a save of the previous step exists), per run.
    save_checkpoint includes waiting for the verifier before a third checkpoint may be written;
    step_s excludes it (instrument_s)."""
    lines = ["Median seconds per phase and step over steps >= 2, summed over the step's refits (a validation "
             "step refits twice); save_checkpoint includes waiting for the verifier, which step_s leaves out "
             "(instrument s).", "",
             "| run | vLLM | " + " | ".join(SPLIT) + " | instrument s |", "|" + "---|" * (len(SPLIT) + 3)]
    for r in _runs(report):
        steps = [s for s in r.get("steps", []) if s["step"] > r.get("first_step", 1) and s.get("times")]
        if not steps:
            continue
        cells = [_fmt(_med([s["times"].get(k) for s in steps])) for k in SPLIT]
        lines.append(f"| {r['name']} | {r.get('vllm')} | " + " | ".join(cells) + f" | {_fmt(_med([s.get('instrument_s') for s in steps]))} |")
    return "\n".join(lines)


PARTS = ("fence", "grads", "optimizer", "empty_cache")


def parts_markdown(report: dict) -> str:
    """offload_before_refit split (issue 22 item 6): median seconds per part over steps >= 2."""
    lines = ["offload_before_refit in parts, median seconds over steps >= 2. fence: the step's offload wait "
             "(colo-shim's fence, which on the v0.7-layout worker runs in its wrapper around the method, or NeMo-RL "
             "main's finalize_async_save with whatever it runs); grads: the DDP grad buffers (params stay on the GPU "
             "for the refit); optimizer: the optimizer state; empty_cache: gc + empty_cache.", "",
             "| run | vLLM | " + " | ".join(PARTS) + " |", "|" + "---|" * (len(PARTS) + 2)]
    for r in _runs(report):
        steps = [s for s in r.get("steps", []) if s["step"] > r.get("first_step", 1) and s.get("offload_parts")]
        if steps:
            cells = [_fmt(_med([s.get("offload_wait_s") if k == "fence" else s["offload_parts"].get(f"before.{k}")
                                for s in steps])) for k in PARTS]
            lines.append(f"| {r['name']} | {r.get('vllm')} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


RANK_COLS = [("rank", "rank"), ("held_gib", "held GiB"), ("held_pct", "held % of offloaded"), ("ckpt_equal", "ckpt equal"),
             ("refit_equal", "refit equal"), ("pinned_after_finish_gib", "pinned after finish GiB"),
             ("offload_wait_s", "offload wait s, steps >= 2")]


def per_rank(run: dict) -> list:
    """Per rank over a run's steps (issue 25's `per_rank`): max held GiB and % of that rank's offloaded
    state, checkpoints and refits equal, max pinned after a rollout finish, median offload wait over
    steps >= 2. Runs of one rank have no per-rank rows (their step fields are that rank's)."""
    out = []
    for r in range(int(run.get("ranks") or 1) if any(s.get("per_rank") for s in run.get("steps", [])) else 0):
        got = [(s, s["per_rank"][r]) for s in run["steps"] if len(s.get("per_rank") or []) > r]
        vals = [[x[k] for _, x in got if x.get(k) is not None] for k, _ in RANK_COLS[1:]]
        held, pct, ck, rf, pinned, _ = vals
        waits = [x["offload_wait_s"] for s, x in got if s["step"] >= 2 and x.get("offload_wait_s") is not None]
        out.append({"rank": r, "held_gib": max(held, default=None), "held_pct": max(pct, default=None),
                    "ckpt_equal": f"{sum(ck)}/{len(ck)}" if ck else "-", "refit_equal": f"{sum(rf)}/{len(rf)}" if rf else "-",
                    "pinned_after_finish_gib": max(pinned, default=None), "offload_wait_s": _med(waits)})
    return out


def ranks_markdown(report) -> str:
    """One table of every rank of the runs with more than one rank (empty when there are none)."""
    lines = ["| run | " + " | ".join(h for _, h in RANK_COLS) + " |", "|" + "---|" * (len(RANK_COLS) + 1)]
    body = [f"| {r['name']} | " + " | ".join(_fmt(row[k]) for k, _ in RANK_COLS) + " |"
            for r in runs_of(report) if "skipped" not in r for row in per_rank(r)]
    return "\n".join(["Per rank (runs with ranks > 1):", ""] + lines + body) if body else ""


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    md = "--markdown" in argv
    target = argv[argv.index("--svg") + 1] if "--svg" in argv else None
    only_arg = argv[argv.index("--only") + 1] if "--only" in argv else None
    paths = [a for a in argv if not a.startswith("--") and a not in (target, only_arg)] or [DEFAULT]
    report = json.load(open(paths[0]))
    only = argv[argv.index("--only") + 1] if "--only" in argv else None
    if only:  # a regular expression on run names: e.g. the runs of one device call
        import re

        paths = [a for a in paths if a != only] or [DEFAULT]
        report = [r for r in runs_of(json.load(open(paths[0]))) if re.search(only, r["name"])]
    if target:
        with open(target, "w") as f:
            gpus = sorted({(r.get("meta") or {}).get("gpu") or "GPU" for r in runs_of(report)})
            f.write(chart.svg(rows(report), f"colocated GRPO on one {' / '.join(gpus)} (bench/e2e)",
                              os.path.basename(paths[0])))
    elif "--readme" in argv:
        print(markdown(report, SHORT))
    elif "--sweep" in argv:  # --pair machine: ratios across the calls of one machine and boot
        print(compare.sweep_markdown(*table(report, argv[argv.index("--pair") + 1] if "--pair" in argv else "call")))
    elif md:
        print(markdown(report))
        print()
        print(split_markdown(report))
        print()
        print(parts_markdown(report))
        if ranks_markdown(report):
            print()
            print(ranks_markdown(report))
    else:
        for row in rows(report):
            print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
