"""What the recorder makes of several trainer ranks and engine workers (issue 25): pure functions,
so the merging that decides a step's figures can be tested without starting a run.

A step's fields keep their one-rank meaning as the worst rank's value (held: the most any rank's
writer kept; free after the offload: the least; waits: the longest; equal: every rank equal),
and with more than one rank the step also carries `per_rank`, one row per rank. Records written
before ranks existed have no `ranks`: they read as one rank.
"""

from __future__ import annotations


def of(run: dict) -> int:
    """How many ranks a recorded run had (older records: 1)."""
    return int(run.get("ranks") or 1)


def rows(step: dict, n: int) -> list:
    """The step's per-rank rows, made on first use; none for one rank (its record stays as it was)."""
    if n <= 1:
        return []
    return step.setdefault("per_rank", [{"rank": r} for r in range(n)])


def merge_saves(saved) -> dict:
    """The ranks' save_checkpoint returns as one: the step waited for its slowest rank; each rank's
    fingerprints stay its own (the verifier checks every rank against the checkpoint)."""
    saved = [saved] if isinstance(saved, dict) else list(saved)
    out = dict(saved[0], fingerprints=[s["fingerprints"] for s in saved])
    for key in ("schedule_s", "fingerprint_s", "finalize_prev_s"):
        if key in out:
            out[key] = max(s[key] for s in saved)
    return out


def offload_wait(now: dict, base: dict) -> float:
    """One rank's offload wait since `base`: colo-shim's fence plus main's finalize inside the
    offloads, less the fence that ran inside that finalize (counted once)."""
    return round(now["fence"].get("fence_s", 0.0) - base["fence"].get("fence_s", 0.0) + now["finalize_in_offload_s"]
                 - base["finalize_in_offload_s"] - (now.get("fence_in_finalize_s", 0.0) - base.get("fence_in_finalize_s", 0.0)), 3)


def offload_parts(now: list, base: list) -> dict:
    """Seconds per offload part since `base`, the slowest rank's per part."""
    out = {}
    for p, b in zip(now, base):
        for k, v in p.get("offload_parts", {}).items():
            out[k] = max(out.get(k, float("-inf")), round(v - b.get("offload_parts", {}).get(k, 0.0), 3))
    return out


def _worst(sent: dict, got: dict) -> float:
    worst = 0.0
    for name, (s, q) in sent.items():
        g = got.get(name)
        if g is None:
            return float("inf")
        worst = max(worst, abs(g[0] - s) / max(1.0, abs(s)), abs(g[1] - q) / max(1.0, abs(q)))
    return worst


def refit_check(sent: list, held: list) -> tuple:
    """Each engine worker's weights against what the trainer rank on its GPU sent: (equal per
    worker, worst relative difference, uncovered names). Workers that each hold a tensor-parallel
    part (`tp` > 1) are checked together: their parts add up to the full tensors' digests."""
    if len(held) > 1 and held[0].get("tp", 1) > 1:
        total = {}
        for h in held:
            for name, (s, q) in h["digests"].items():
                a, b = total.get(name, (0.0, 0.0))
                total[name] = (a + s, b + q)
        held = [dict(held[0], digests=total)] * len(held)
    equal, worst, uncovered = [], 0.0, []
    for s, h in zip(sent if len(sent) == len(held) else [sent[0]] * len(held), held):
        w = _worst(s["digests"], h["digests"])
        worst = max(worst, w)
        uncovered += [u for u in h["uncovered"] if u not in uncovered]
        equal.append(w <= 1e-9 and not h["uncovered"] and set(h["digests"]) == set(s["digests"]))
    return equal, worst, uncovered

