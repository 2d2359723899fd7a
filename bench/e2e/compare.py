"""What a checkpoint still costs (issue 34): no-save rows, same-call ratios, and the size sweep's table.

A run spec with `nosave=K` ran its first K steps without checkpoints in the same processes: it
reads as two rows, those steps (a no-save row) and the rest (its first step saves; steps after it
have a save in flight). Ratios pair rows of one device call (`meta.call`; merged rows of older
calls by their `source` file or the "· call N" of their name), or with `by="machine"` of one
machine and boot (`meta.boot`), and of one model size, rank count and validation period:
`vs_nosave` is a row's step with a save in flight (steps after its first, no validation) over the
no-save step of the same colo-shim setting (the same run's no-save steps when it has them);
`vs_sync` a colo-shim row's over the synchronous-save row's. The sweep table is one line per run.
"""

from __future__ import annotations

import re
import statistics

GIB = float(1 << 30)
NOSAVE = ("nosave", "nosave_shim")


def expand(runs: list) -> list:
    """Runs with a no-save phase as two rows; every other run as it is (`first_step` 1)."""
    out = []
    for r in runs:
        k = r.get("nosave_steps") or 0
        if not (k and r.get("checkpointing")):
            out.append(r)
            continue
        out.append(dict(r, name=f"{r['name']} · steps 1-{k}", mode="nosave_shim" if r.get("shim") else "nosave",
                        steps=[s for s in r["steps"] if s["step"] <= k], checkpointing=False, phase_of=r["name"]))
        out.append(dict(r, steps=[s for s in r["steps"] if s["step"] > k], first_step=k + 1))
    return out


def saves(run: dict) -> bool:
    """Whether a run saved checkpoints (records before issue 34 always did)."""
    return run.get("checkpointing", run.get("mode") not in NOSAVE)


def _key(run: dict, by: str):
    """What two rows must share to be compared: the device call (or, by "machine", the machine and its
    boot: calls on one warm machine), the model size, the ranks, the validation period."""
    meta = run.get("meta") or {}
    named = re.search(r"· call (\d+)", run.get("name", ""))  # merged rows the README names by their call
    call = meta.get("call") or run.get("source") or (f"call {named.group(1)}" if named else None)
    where = meta.get("boot") if by == "machine" else call
    return None if where is None else (where, run.get("size") or meta.get("size"), int(run.get("ranks") or 1),
                                       run.get("val_period"))


def ratios(rows: list, runs: list, by: str = "call") -> None:
    """Add vs_nosave and vs_sync to `rows` (one per run of `runs`, same order)."""
    for row, run in zip(rows, runs):
        row["vs_nosave"] = row["vs_sync"] = None
        key = _key(run, by)
        if key is None or not saves(run) or not row.get("step_plain_s"):
            continue
        pairs = [(o, r) for o, r in zip(rows, runs) if _key(r, by) == key and r is not run]
        base = ([o for o, r in pairs if r.get("phase_of") == run["name"]]
                or [o for o, r in pairs if not saves(r) and bool(r.get("shim")) == bool(run.get("shim"))])
        if base and base[0].get("step_plain_s"):
            row["vs_nosave"] = round(row["step_plain_s"] / base[0]["step_plain_s"], 2)
        sync = [o for o, r in pairs if r.get("mode") == "sync_save" and saves(r)]
        if run.get("shim") and sync and sync[0].get("step_plain_s"):
            row["vs_sync"] = round(row["step_plain_s"] / sync[0]["step_plain_s"], 2)


def _med(xs):
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 3) if xs else None


def offloads(run: dict) -> dict:
    """The optimizer's offload before the refit (offload_parts `before.optimizer`): step 1's (no state
    yet), step 2's (the first with the state: what making mirrors cost before issue 34), the median of
    the later steps without validation (one refit each), and its GB/s (bytes the optimizer moves)."""
    steps = run.get("steps") or []
    part = {s["step"]: (s.get("offload_parts") or {}).get("before.optimizer") for s in steps}
    later = [part[s["step"]] for s in steps if s["step"] >= 3 and "validation" not in (s.get("times") or {})]
    later_s = _med(later)
    # runs before issue 34 did not record it: fp32 main params and two Adam moments, 12 bytes a parameter
    opt = max((s.get("offloaded_opt_gib") or 0 for s in steps), default=0) or 12 * (run.get("params") or 0) / GIB
    return {"first_s": part.get(1), "with_state_s": part.get(2), "later_s": later_s,
            "gbps": round(opt * GIB / 1e9 / later_s, 1) if opt and later_s else None,
            "first_over_later": round(part[2] / later_s, 2) if part.get(2) and later_s else None}


def host(run: dict, first: int) -> dict:
    """Host figures of the steps after `first`: held while training (median), the tree's RSS peak,
    the node's peak use (MemTotal less the lowest MemAvailable), and the last step's parts."""
    steps = [s for s in run.get("steps") or [] if s["step"] > first and s.get("step_s") is not None]
    total = (run.get("meta") or {}).get("mem_total_gib")
    avail = [s["mem_available_min_gib"] for s in steps if s.get("mem_available_min_gib") is not None]
    parts = [s["host_rss_parts_gib"] for s in steps if s.get("host_rss_parts_gib")]
    return {"train_gib": _med([s.get("host_rss_train_gib") for s in steps]),
            "peak_gib": max((s["host_peak_gib"] for s in steps if s.get("host_peak_gib") is not None), default=None),
            "node_gib": round(total - min(avail), 2) if total and avail else None,
            "parts": parts[-1] if parts else None}


SWEEP = [("size", "size"), ("params_b", "params B"), ("offloaded_gib", "offloaded GiB"), ("run", "run"),
         ("step_plain_s", "step s"), ("vs_nosave", "vs no-save"), ("vs_sync", "vs sync saves"),
         ("offload_s", "optimizer offload s"), ("gbps", "GB/s"), ("first_s", "1st offload s"),
         ("with_state_s", "1st with state s"), ("first_over_later", "1st with state / later"),
         ("offload_wait_s", "fence wait s"), ("finalize_s", "save's finalize wait s"),
         ("host_train_gib", "host held while training GiB"),
         ("host_peak_gib", "host peak GiB"), ("node_gib", "node peak GiB"), ("writer_gib", "writer GiB")]


def sweep_rows(rows: list, runs: list) -> list:
    out = []
    for row, run in zip(rows, runs):
        o, h = offloads(run), host(run, (run.get("first_step") or 1))
        out.append(dict(row, size=run.get("size"), params_b=round((run.get("params") or 0) / 1e9, 2),
                        offload_s=o["later_s"], gbps=o["gbps"], first_s=o["first_s"], with_state_s=o["with_state_s"],
                        first_over_later=o["first_over_later"], host_train_gib=h["train_gib"], node_gib=h["node_gib"],
                        writer_gib=(h["parts"] or {}).get("writer")))
    return sorted(out, key=lambda r: (r["params_b"], r["run"]))


def sweep_markdown(rows: list, runs: list) -> str:
    """The sweep's table: per size, each run's step, ratios, offload, waits and host memory."""
    fmt = (lambda v: "-" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v))  # noqa: E731
    lines = ["| " + " | ".join(h for _, h in SWEEP) + " |", "|" + "---|" * len(SWEEP)]
    lines += ["| " + " | ".join(fmt(r.get(k)) for k, _ in SWEEP) + " |" for r in sweep_rows(rows, runs)]
    return "\n".join(lines)
