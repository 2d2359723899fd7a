"""What tests/discard/test_vllm_*.py read from a scenario's run (harness/vllm_runs.py runs it)."""

from __future__ import annotations


def sleeps(events: list[dict]) -> list[tuple[int, str]]:
    """(level, what came next) for every sleep: 'refit' (wake weights only), 'wake' (full) or 'end'."""
    out = []
    for i, ev in enumerate(events):
        if ev["event"] != "sleep":
            continue
        nxt = next((e for e in events[i + 1:] if e["event"] == "wake_up"), None)
        kind = "end" if nxt is None else ("refit" if nxt["tags"] == ["weights"] else "wake")
        out.append((ev["level"], kind))
    return out
