"""Run specs of the e2e harness, `mode@nvrx:steps[:key=value...]`: parsed and named apart from the
orchestrator so every spec of an invocation is checked before its first run spends device time."""

from __future__ import annotations

from bench.e2e.driver import MODES, SIZES

OPTIONS = "kvdelta=N, order=before|after, ckpt=disk, offload=on|off, ranks=N, size=NAME, verify=off, nosave=K, limit=S, threads=N"


def parse(spec: str):
    """`mode@nvrx:steps[:key=value...]` -> mode, nvrx, steps, options: kvdelta=N (that run's KV cache N GiB
    bigger), order=before|after (main-worker modes: main's checkpointer call reaches the trainer right
    after the save or right after the next offload), ckpt=disk (--disk-dir instead of /dev/shm),
    offload=on|off (COLO_SHIM_OFFLOAD, shim modes), ranks=N (trainer ranks and engine workers, one per
    GPU), size=NAME (a model of driver.SIZES instead of --size), verify=off (no checkpoint read back,
    one kept: a verifier's wait would hide part of the write in flight), nosave=K (the first K steps
    without checkpoints, in the same processes: report.py splits the run in two rows), limit=S (that
    run's wall seconds instead of --per-run-s), threads=N (the save strategy's thread_count: NVRx's
    writer threads; megatron's default is 1, so the write speed a job sees depends on it)."""
    mode, _, rest = spec.partition("@")
    nvrx, *parts = rest.split(":")
    steps = parts.pop(0) if parts else ""
    opts = dict(part.split("=", 1) for part in parts if part)
    unknown = set(opts) - {"kvdelta", "order", "ckpt", "offload", "ranks", "size", "verify", "nosave", "limit", "threads"}
    if (mode not in MODES or unknown or opts.get("order", "before") not in ("before", "after")
            or opts.get("ckpt", "disk") != "disk" or opts.get("offload", "on") not in ("on", "off")
            or not opts.get("ranks", "1").isdigit() or int(opts.get("ranks", "1")) < 1
            or opts.get("size", "full") not in SIZES or opts.get("verify", "off") != "off"
            or not opts.get("nosave", "0").isdigit() or not opts.get("limit", "1").replace(".", "", 1).isdigit()
            or not opts.get("threads", "1").isdigit() or int(opts.get("threads", "1")) < 1):
        raise SystemExit(f"bad run spec {spec!r}: modes are {', '.join(MODES)}; options are {OPTIONS} (N >= 1)")
    if opts.get("offload") and not MODES[mode][0]:
        raise SystemExit(f"bad run spec {spec!r}: offload= needs a colo-shim mode")
    if MODES[mode][3] is None and (opts.get("nosave") or opts.get("verify") or opts.get("ckpt") or opts.get("threads")):
        raise SystemExit(f"bad run spec {spec!r}: {mode} saves no checkpoint (nosave=, verify=, ckpt=, threads= mean nothing)")
    if int(steps or 4) <= int(opts.get("nosave", 0)):
        raise SystemExit(f"bad run spec {spec!r}: nosave=K needs more than K steps")
    opts["kvdelta"] = float(opts.get("kvdelta", 0.0))
    opts["ranks"] = int(opts.get("ranks", 1))
    opts["nosave"] = int(opts.get("nosave", 0))
    opts["limit"] = float(opts["limit"]) if opts.get("limit") else None
    opts["threads"] = int(opts.get("threads", 1))
    return mode, nvrx or "0.7.0", int(steps or 4), opts


def name(mode, nvrx, opts) -> str:
    extra = [f"kv{opts['kvdelta']:+g}"] if opts["kvdelta"] else []
    extra += [f"order={opts['order']}"] if opts.get("order") else []
    extra += ["disk"] if opts.get("ckpt") else []
    extra += [f"offload={opts['offload']}"] if opts.get("offload") else []
    extra += [f"ranks={opts['ranks']}"] if opts.get("ranks", 1) > 1 else []  # one rank: the names runs always had
    extra += [f"size={opts['size']}"] if opts.get("size") else []
    extra += [f"nosave={opts['nosave']}"] if opts.get("nosave") else []
    extra += ["verify=off"] if opts.get("verify") else []
    extra += [f"threads={opts['threads']}"] if opts.get("threads", 1) > 1 else []
    return f"{mode}@{nvrx}" + "".join(" " + e for e in extra)
