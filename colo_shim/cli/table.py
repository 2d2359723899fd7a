"""How doctor's records read on a terminal: rows that fit 160 columns, and the counts of its first line.

A full listing ran to 76 lines up to 400 columns wide, most of them targets of libraries this
machine does not have: nobody reads that. So by default the targets that are not installed (and
the families not enabled) fold to one row per family, a long target loses its head (the attribute
at its tail is what tells two apart) and a long reason wraps within its column; -v prints every
row and cell in full on one line, as --json does.
"""

from __future__ import annotations

import json
import textwrap

from colo_shim.core import targets as registry

COLUMNS = ("name", "target", "status", "installed_version", "supported", "calls", "reason")
SHORT = ("name", "target", "status", "installed_version", "calls", "reason")
WIDTH = 160
# shrunk in this order, down to these widths: a target keeps its class and attribute, a reason wraps
_MIN = {"target": 52, "reason": 40}
_SHOWN = {"installed_version": "version"}  # a header no wider than its values, where width counts
# what a job gets from a target in each status: the first line's counts
OUTCOME = {registry.APPLIED: "applied", registry.PENDING: "waiting", registry.NOT_NEEDED: "skipped",
           registry.MISSING: "skipped", registry.UNSUPPORTED: "skipped", registry.DISABLED: "skipped",
           registry.FAILED: "failed", registry.SHADOWED: "failed"}


def outcome(record: dict) -> str:
    """applied, waiting, skipped or failed: what a job with COLO_SHIM set gets from this target."""
    return OUTCOME.get(record.get("if_enabled", record["status"]), "failed")


def counts(records: list[dict]) -> str:
    tally = {word: 0 for word in ("applied", "waiting", "skipped", "failed")}
    for record in records:
        tally[outcome(record)] += 1
    return ", ".join(f"{n} {word}" for word, n in tally.items())


def fold(records: list[dict], enable: str) -> list[dict]:
    """One row per family for its targets that are not installed, or that its family leaves off."""
    families: dict[str, list] = {}
    for record in records:
        families.setdefault(record["name"], []).append(record)
    out = []
    for name, rows in families.items():
        groups: dict[tuple, list] = {}
        for r in rows:
            kind = r.get("if_enabled", r["status"])
            if kind in (registry.MISSING, registry.DISABLED):
                groups.setdefault((r["status"], kind), []).append(r)
            else:
                out.append(r)
        for (status, kind), members in groups.items():
            where = sorted({".".join(r["target"].split(":")[0].split(".")[:2]) for r in members})
            why = "not installed here" if kind == registry.MISSING else members[0]["reason"]
            if kind != status:  # the environment leaves the shim off: say what it would do
                why = f"with {enable}=1: {kind}: {why}"
            out.append(dict(name=name, target=f"{len(members)} targets in {', '.join(where)}", status=status,
                            reason=f"{why}; -v lists each"))
    return out


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else "..." + text[-(width - 3):]


def format_table(records: list[dict], verbose: bool = False) -> str:
    """The records as aligned columns; unless verbose, within WIDTH columns (details wrapped)."""
    columns = COLUMNS if verbose else [c for c in SHORT if c in ("name", "target", "status", "reason")
                                       or any(r.get(c) is not None for r in records)]  # not all "-"
    header = {c: c if verbose else _SHOWN.get(c, c) for c in columns}
    rows = [[str(r.get(c) if r.get(c) is not None else "-") for c in columns] for r in records]
    widths = {c: max([len(header[c])] + [len(row[i]) for row in rows]) for i, c in enumerate(columns)}
    for column, least in _MIN.items():
        over = sum(widths.values()) + 2 * (len(columns) - 1) - WIDTH
        if not verbose and over > 0:
            widths[column] = max(min(least, widths[column]), widths[column] - over)
    lines = ["  ".join(header[c].ljust(widths[c]) for c in columns).rstrip()]
    indent = " " * (sum(widths.values()) - widths["reason"] + 2 * (len(columns) - 1))
    for row in rows:  # reason is the last column: its continuation lines start under it
        *cells, reason = [v if verbose or c != "target" else _clip(v, widths[c]) for c, v in zip(columns, row)]
        parts = [reason] if verbose else textwrap.wrap(reason, widths["reason"], break_on_hyphens=False) or [""]
        lines.append("  ".join([v.ljust(widths[c]) for c, v in zip(columns, cells)] + [parts[0]]).rstrip())
        lines += [indent + part for part in parts[1:]]
    for name, details in {r["name"]: r["details"] for r in records if r.get("details")}.items():
        text = f"{name}: {json.dumps(details, default=str, sort_keys=True)}"
        lines += [text] if verbose else textwrap.wrap(text, WIDTH, subsequent_indent="  ", break_on_hyphens=False)
    return "\n".join(lines)
