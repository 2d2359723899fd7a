"""Merge the scenario results of bench/real_vllm/scenarios.py into discard_real_vllm.json; print a table.

    python bench/real_vllm/report.py DIR [OUT_JSON]

The bound checked (issue 9): after every finish that discards, the shim run holds no more pinned
host memory (engine process, torch.cuda.host_memory_stats) and no more process-tree RSS than the
level-2-only run at the same point of the same sequence, plus 1%. Holding less passes: the
release also returns pinned staging blocks that the level-2-only run keeps cached. For pinned
memory, whose level-2 value is near zero, 1% of the level-1 backup is the floor of the allowance.
"""

from __future__ import annotations

import json
import os
import sys

GiB = 1 << 30


def _load(d: str) -> dict:
    out = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".json") and not f.startswith("discard_real_vllm"):
            with open(os.path.join(d, f)) as fh:
                out[f[:-5]] = json.load(fh)
    return out


def _tokens(run: dict) -> list:
    return [(g["kind"], g["step"], g["tokens"]) for g in run.get("generations", [])]


def _same_tokens(a: dict | None, b: dict | None):
    if not a or not b or a.get("error") or b.get("error") or not _tokens(a):
        return None
    return _tokens(a) == _tokens(b)


def _same_drafter(a: dict | None, b: dict | None):
    if not a or not b or a.get("error") or b.get("error"):
        return None
    da = [g.get("drafter") for g in a.get("generations", [])]
    db = [g.get("drafter") for g in b.get("generations", [])]
    if not any(da):
        return None
    start = a.get("drafter_at_start")
    return da == db and all(d == start for d in da)


def _gib(x) -> str:
    return "-" if x is None else f"{x / GiB:6.2f}"


def build(runs: dict) -> dict:
    l1, l2, shim = runs.get("main_l1", {}), runs.get("main_l2", {}), runs.get("main_shim", {})
    base = (l1.get("pinned_at_start") or {}).get("held")
    backup = None
    if l1.get("finishes") and base is not None and l1["finishes"][0].get("pinned_host_bytes") is not None:
        backup = l1["finishes"][0]["pinned_host_bytes"] - base
    floor = 0.01 * (backup or 0)
    finishes = []
    for i, row in enumerate(shim.get("finishes", [])):
        ref = (l2.get("finishes") or [{}] * (i + 1))[i] if i < len(l2.get("finishes", [])) else {}
        rel = (l1.get("finishes") or [])[i] if i < len(l1.get("finishes", [])) else {}
        item = {"kind": row["kind"], "level": row.get("level"), "pinned_host_bytes": row.get("pinned_host_bytes"),
                "rss_tree_bytes": row.get("rss_tree_bytes"), "sleep_s": row.get("sleep_s"),
                "reason": row.get("reason"),
                "host_release": row.get("host_release") if (row.get("level") or 0) >= 2 else None,
                "l2_only_pinned_host_bytes": ref.get("pinned_host_bytes"), "l2_only_rss_tree_bytes": ref.get("rss_tree_bytes"),
                "l1_only_pinned_host_bytes": rel.get("pinned_host_bytes"), "l1_only_rss_tree_bytes": rel.get("rss_tree_bytes")}
        if (row.get("level") or 0) >= 2 and ref.get("pinned_host_bytes") is not None and row.get("pinned_host_bytes") is not None:
            dp = row["pinned_host_bytes"] - ref["pinned_host_bytes"]
            dr = row["rss_tree_bytes"] - ref["rss_tree_bytes"]
            item.update(pinned_minus_l2_only=dp, rss_minus_l2_only=dr)
            item["within_1pct"] = dp <= max(0.01 * ref["pinned_host_bytes"], floor) and dr <= 0.01 * ref["rss_tree_bytes"]
        if i >= len(l2.get("finishes", [])):
            item["note"] = "the guard check's discarding finish (a full wake-up and a generate must raise next)"
        finishes.append(item)
    released = [f["host_release"] for f in finishes if isinstance(f.get("host_release"), dict)]
    checks = {
        "tokens_llm": _same_tokens(shim, l1),
        "tokens_async_llm": _same_tokens(runs.get("async_shim"), l1),
        "tokens_fp8": _same_tokens(runs.get("fp8_shim"), runs.get("fp8_l1")),
        "tokens_drafter": _same_tokens(runs.get("draft_shim"), runs.get("draft_l1")),
        "drafter_intact": _same_drafter(runs.get("draft_shim"), runs.get("draft_l1")),
        "guard_llm": (shim.get("guard") or {}).get("raised"),
        "guard_async_llm": (runs.get("async_shim", {}).get("guard") or {}).get("raised"),
        "host_bound_every_discard": (all(f.get("within_1pct") for f in finishes if "within_1pct" in f)
                                     if any("within_1pct" in f for f in finishes) else None),
    }
    token_checks = [v for k, v in checks.items() if k.startswith("tokens")]
    return {
        "vllm_version": next((r.get("vllm_version") for r in runs.values() if r.get("vllm_version")), None),
        "gpu": os.environ.get("BENCH_GPU") or next((r.get("gpu") for r in runs.values() if r.get("gpu")), None),
        "model": os.environ.get("BENCH_MODEL_DESC"),
        "level1_pinned_host_bytes": backup,
        "pinned_host_bytes_at_start": base,
        "tokens_identical": all(v is True for v in token_checks) if token_checks else None,
        "checks": checks,
        "bound": "after each discarding finish: shim <= level-2-only + 1% (pinned: floor 1% of the level-1 backup)",
        "release_total_bytes": sum(r.get("released", 0) for r in released),
        "release_total_s": round(sum(r.get("seconds", 0.0) for r in released), 4),
        "finishes": finishes,
        "scenarios": {k: {kk: vv for kk, vv in v.items() if kk not in ("generations",)} for k, v in runs.items()},
        "generations": {k: v.get("generations") for k, v in runs.items()},
    }


def table(doc: dict) -> str:
    lines = [f"vLLM {doc['vllm_version']} on {doc['gpu']}; level-1 backup {_gib(doc['level1_pinned_host_bytes'])} GiB",
             "finish       lvl  pinned GiB: shim   l1-only  l2-only | RSS GiB: shim  l2-only | released GiB  s    ok"]
    for f in doc["finishes"]:
        hr = f.get("host_release") or {}
        lines.append(f"{f['kind']:<12} {f.get('level')!s:>3}  {_gib(f['pinned_host_bytes'])}   {_gib(f['l1_only_pinned_host_bytes'])}"
                     f"   {_gib(f['l2_only_pinned_host_bytes'])} |   {_gib(f['rss_tree_bytes'])}  {_gib(f['l2_only_rss_tree_bytes'])} |"
                     f"  {_gib(hr.get('released'))}  {hr.get('seconds', '-')!s:>6}  {f.get('within_1pct', '')}")
    lines.append("checks: " + ", ".join(f"{k}={v}" for k, v in doc["checks"].items()))
    for name, sc in doc["scenarios"].items():
        if sc.get("error"):
            lines.append(f"ERROR {name}: {sc['error'][:300]}")
        else:
            lines.append(f"{name}: start {sc.get('engine_start_s')}s, levels {[f.get('level') for f in sc.get('finishes', [])]}"
                         f", derived {sc.get('derived')}, guard {sc.get('guard', {}).get('raised') if sc.get('guard') else '-'}")
    return "\n".join(lines)


def main(d: str, out: str | None = None) -> dict:
    doc = build(_load(d))
    out = out or os.path.join(os.environ.get("OUT", d), "discard_real_vllm.json")
    with open(out, "w") as fh:
        json.dump(doc, fh, indent=1)
    print(table(doc), flush=True)
    return doc


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
