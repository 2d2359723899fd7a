"""Child: a fault injected into colo-shim's own step inside the offload family's wrappers (issue 32 item 3),
on real megatron-core (a GPTModel in DDP with the distributed optimizer, gloo, one rank; fake_cuda moves
the tensors, a PageLocks recorder stands in for page-locking), family `offload` installed.

For each fault one colo-shim internal is swapped for one that raises, then an entry point runs:
ChainedOptimizer.offload_to_cpu / restore_from_cpu, NeMo-RL's move_optimizer (the worker double's), or a
DDP buffer's first offload_to_cpu. Recorded: what the call returned or raised, how often megatron-core's own
MegatronOptimizer body ran (its "[OFFLOAD]" / "[RESTORE]" log line, one per chained optimizer and call),
whether every tensor ended where the body puts it with its values, the family's status row and
mirrors' fallbacks. Each fault once more under COLO_SHIM_STRICT=1. Prints one JSON line.
"""

import json
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from mcore_child import build, init, move, same, slots  # noqa: E402

from harness.fake_cuda import FakeCuda, PageLocks, on_device  # noqa: E402

# fault -> (module under colo_shim.offload, attribute, exception it raises, direction it fires in)
FAULTS = {"none": (None, None, None, True), "settle": ("ahead", "settle", RuntimeError, True),
          "bug_in_copy": ("mirrors", "_sweep", TypeError, True), "restore": ("mirrors", "restore", RuntimeError, False),
          "buffer_mirror": ("mirrors", "buffer_mirror", RuntimeError, True)}
# entry point -> the faults injected there (ChainedOptimizer's under their plain names)
ENTRIES = {"chained": ("none", "settle", "bug_in_copy", "restore"), "nemo_rl": ("settle", "bug_in_copy", "restore"),
           "buffer": ("buffer_mirror",)}


class Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def shim_errors(colo_shim) -> dict:
    rows = [r for r in colo_shim.status() if r["name"] == "offload"]
    return rows[0]["details"].get("shim_errors", {})


def upstream_runs(st, entry, to_host, lines, events) -> int | None:
    """How often the entry's own body ran: megatron-core's log line per chained optimizer, the NeMo-RL
    worker double's event; None for the buffer (its body logs nothing: where its tensors end up tells)."""
    if entry == "chained":
        return sum(line.startswith("[OFFLOAD]" if to_host else "[RESTORE]") for line in lines.lines)
    if entry == "nemo_rl":
        return st.worker.events[events:].count(f"move_optimizer({'cpu' if to_host else 'cuda'})")
    return None


def moved(st, entry, to_host) -> list:
    """The tensors as the body leaves them: the buffer's offload keeps its values in param_data_cpu."""
    if entry == "buffer" and to_host:
        return [buf.param_data_cpu for buf in st.buffers]
    return slots(st, entry)


def one(st, entry, fault, strict, lines) -> dict:
    import colo_shim
    from colo_shim.offload import ahead, mirrors

    module, name, exc, to_host = FAULTS[fault]
    where = {"ahead": ahead, "mirrors": mirrors}.get(module)
    original = getattr(where, name) if where else None

    def boom(*args, **kwargs):
        raise exc("injected fault in colo-shim's own step")

    with FakeCuda():
        if not to_host:
            move(st, entry, True)  # the fault is in the reload: offload first, as the job does
        if entry == "buffer":
            for buf in st.buffers:
                buf.param_data_cpu = None  # each case is the buffer's first offload, the one colo-shim joins
        before = [t.clone() for t in slots(st, entry)]
        events = len(st.worker.events)
        errors, fallbacks, escaped, result = shim_errors(colo_shim), mirrors.stats["fallbacks"], None, None
        lines.lines.clear()
        if where:
            setattr(where, name, boom)
        if strict:
            os.environ["COLO_SHIM_STRICT"] = "1"
        try:
            result = move(st, entry, to_host)
        except Exception as e:  # noqa: BLE001 - what reached the host, for the test to judge
            escaped = {"type": type(e).__name__, "message": str(e)}
        finally:
            os.environ.pop("COLO_SHIM_STRICT", None)
            if where:
                setattr(where, name, original)
        after = moved(st, entry, to_host)
        whole = all(t is not None for t in after)  # a strict-mode raise can leave the buffer without its copy
        seen = {"result": result, "escaped": escaped, "equal": whole and same(before, after),
                "where_upstream_puts_them": whole and all(on_device(t) != to_host for t in after),
                "upstream_runs": upstream_runs(st, entry, to_host, lines, events),
                "chained": len(st.opt.chained_optimizers), "buffers": len(st.buffers), "fallbacks": mirrors.stats["fallbacks"] - fallbacks,
                "shim_errors": {k: n - errors.get(k, 0) for k, n in shim_errors(colo_shim).items()
                                if n != errors.get(k, 0)}}
        del before, after
        move(st, entry, False)  # back on the device for the next fault (moves nothing where already there)
    return seen


def main():
    init()
    import colo_shim
    from colo_shim.offload import pages

    colo_shim.install(["offload"])
    pages.host = PageLocks()
    lines = Lines()
    log = logging.getLogger("megatron.core.optimizer")
    log.addHandler(lines)
    log.setLevel(logging.INFO)
    st = build()
    out = {}
    for entry, faults in ENTRIES.items():
        prefix = "" if entry == "chained" else f"{entry}:"
        out.update({f"{prefix}{fault}": one(st, entry, fault, False, lines) for fault in faults})
        out.update({f"{prefix}{fault}_strict": one(st, entry, fault, True, lines) for fault in faults if fault != "none"})
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
