"""Run specs of the e2e harness, `mode@nvrx:steps[:key=value...]`: parsed and named apart from the
orchestrator so every spec of an invocation is checked before its first run spends device time."""

from __future__ import annotations

from bench.e2e.driver import MODES


def parse(spec: str):
    """`mode@nvrx:steps[:key=value...]` -> mode, nvrx, steps, options (kvdelta, order, ckpt, offload,
    ranks: trainer ranks and engine workers, one per GPU, default 1)."""
    mode, _, rest = spec.partition("@")
    nvrx, *parts = rest.split(":")
    steps = parts.pop(0) if parts else ""
    opts = dict(part.split("=", 1) for part in parts if part)
    unknown = set(opts) - {"kvdelta", "order", "ckpt", "offload", "ranks"}
    if (unknown or opts.get("order", "before") not in ("before", "after") or opts.get("ckpt", "disk") != "disk"
            or opts.get("offload", "on") not in ("on", "off") or not opts.get("ranks", "1").isdigit()
            or int(opts.get("ranks", "1")) < 1):
        raise SystemExit(f"bad run spec {spec!r}: options are kvdelta=N, order=before|after, ckpt=disk, offload=on|off, "
                         "ranks=N (N >= 1)")
    if opts.get("offload") and not MODES[mode][0]:
        raise SystemExit(f"bad run spec {spec!r}: offload= needs a colo-shim mode")
    opts["kvdelta"] = float(opts.get("kvdelta", 0.0))
    opts["ranks"] = int(opts.get("ranks", 1))
    return mode, nvrx or "0.7.0", int(steps or 4), opts


def name(mode, nvrx, opts) -> str:
    extra = [f"kv{opts['kvdelta']:+g}"] if opts["kvdelta"] else []
    extra += [f"order={opts['order']}"] if opts.get("order") else []
    extra += ["disk"] if opts.get("ckpt") else []
    extra += [f"offload={opts['offload']}"] if opts.get("offload") else []
    extra += [f"ranks={opts['ranks']}"] if opts.get("ranks", 1) > 1 else []  # one rank: the names runs always had
    return f"{mode}@{nvrx}" + "".join(" " + e for e in extra)
