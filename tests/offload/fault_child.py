"""Child: a fault injected into colo-shim's own step inside the offload family's wrappers (issue 32 item 3),
on real megatron-core (a GPTModel in DDP with the distributed optimizer, gloo, one rank; fake_cuda moves
the tensors, a PageLocks recorder stands in for page-locking), family `offload` installed.

For each fault one colo-shim internal is swapped for one that raises, then ChainedOptimizer.offload_to_cpu
or restore_from_cpu runs. Recorded: what the call returned or raised, how often megatron-core's own
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
          "bug_in_copy": ("mirrors", "_sweep", TypeError, True), "restore": ("mirrors", "restore", RuntimeError, False)}


class Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def shim_errors(colo_shim) -> dict:
    rows = [r for r in colo_shim.status() if r["name"] == "offload"]
    return rows[0]["details"].get("shim_errors", {})


def one(st, fault, strict, lines) -> dict:
    import colo_shim
    from colo_shim.offload import ahead, mirrors

    module, name, exc, to_host = FAULTS[fault]
    where = {"ahead": ahead, "mirrors": mirrors}.get(module)
    original = getattr(where, name) if where else None

    def boom(*args, **kwargs):
        raise exc("injected fault in colo-shim's own step")

    with FakeCuda():
        if not to_host:
            move(st, "chained", True)  # the fault is in the reload: offload first, as the job does
        before = [t.clone() for t in slots(st, "chained")]
        errors, fallbacks, escaped, result = shim_errors(colo_shim), mirrors.stats["fallbacks"], None, None
        lines.lines.clear()
        if where:
            setattr(where, name, boom)
        if strict:
            os.environ["COLO_SHIM_STRICT"] = "1"
        try:
            result = move(st, "chained", to_host)
        except Exception as e:  # noqa: BLE001 - what reached the host, for the test to judge
            escaped = {"type": type(e).__name__, "message": str(e)}
        finally:
            os.environ.pop("COLO_SHIM_STRICT", None)
            if where:
                setattr(where, name, original)
        after = slots(st, "chained")
        seen = {"result": result, "escaped": escaped, "equal": same(before, after),
                "where_upstream_puts_them": all(on_device(t) != to_host for t in after),
                "upstream_runs": sum(line.startswith("[OFFLOAD]" if to_host else "[RESTORE]") for line in lines.lines),
                "chained": len(st.opt.chained_optimizers), "fallbacks": mirrors.stats["fallbacks"] - fallbacks,
                "shim_errors": {k: n - errors.get(k, 0) for k, n in shim_errors(colo_shim).items()
                                if n != errors.get(k, 0)}}
        del before, after
        move(st, "chained", False)  # back on the device for the next fault (moves nothing where already there)
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
    out = {fault: one(st, fault, False, lines) for fault in FAULTS}
    out.update({f"{fault}_strict": one(st, fault, True, lines) for fault in FAULTS if fault != "none"})
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
