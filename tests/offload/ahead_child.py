"""Child: mirrors made ahead of the first offload (ahead.py) on real megatron-core, in a colocated job's order.

A GPTModel in megatron DDP with the distributed optimizer (mcore_child.py's, on the CPU stand-in for
CUDA) starts without optimizer state, as a job's first refit finds it. Each round is a colocated
step: the refit's offload (ChainedOptimizer.offload_to_cpu), the reload, a train step. Phase
`plain` runs three rounds without colo-shim; phase `shim` the same three with families offload +
megatron and mcore_child's page-locking recorder, then the cases where the mirrors being made
ahead meet an offload: still being registered (the offload waits), not ready when the offload
stops waiting (it makes its own; theirs are given back), over the budget, and failing. Each case
changes the state tensors first (as a checkpoint load would), so the next step's hook has mirrors
to make. Prints one JSON line.
"""

import json
import logging
import logging.handlers
import os
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("COLO_SHIM_OFFLOAD", "on")

from mcore_child import build, final_values, init, move, same, slots, step  # noqa: E402

from harness.fake_cuda import FakeCuda, PageLocks, on_device  # noqa: E402


def state_tensors(st) -> list:
    return [v for inner in st.opt.chained_optimizers for s in inner.optimizer.state.values() for v in s.values()
            if v.dim() > 0]


def job_round(st, n, offload_in=None) -> dict:
    """A colocated step: offload (in thread `offload_in` when given), reload, train step n."""
    from colo_shim.offload import mirrors

    with FakeCuda():
        before = [t.clone() for t in slots(st, "chained")]
    count = dict(mirrors.stats)
    calls = len(SEAM.calls)
    if offload_in is None:
        with FakeCuda():
            move(st, "chained", True)
    else:
        offload_in(lambda: move(st, "chained", True))
    with FakeCuda():
        hosts = slots(st, "chained")
        seen = {"equal_after_offload": same(before, hosts), "on_host": not any(on_device(t) for t in hosts),
                "inline_registrations": sum(c["main"] for c in SEAM.calls[calls:])}
        del hosts
        move(st, "chained", False)
        seen["equal_after_reload"] = same(before, slots(st, "chained"))
    seen.update({k: mirrors.stats[k] - count[k] for k in ("fresh", "reused", "ahead_used", "fallbacks")})
    step(st, n)
    return seen


def quiet(timeout=120) -> bool:
    """Wait until no mirror is being made ahead (a safety-net timeout: the answer is the state)."""
    from colo_shim.offload import ahead

    with ahead._cv:
        return ahead._cv.wait_for(lambda: not ahead._todo and not ahead._state["busy"], timeout)


def rebuild(st):
    """New device tensors for every state entry (a checkpoint load): no mirror is linked to them."""
    with FakeCuda():
        for inner in st.opt.chained_optimizers:
            for s in inner.optimizer.state.values():
                for k, v in list(s.items()):
                    if v.dim() > 0:
                        s[k] = v.to("cuda", copy=True)


def in_thread(fn):
    """Run an offload in another thread (the stand-in is per thread) and return it, started."""
    def body():
        with FakeCuda():
            fn()

    thread = threading.Thread(target=body)
    thread.start()
    return thread


def shim_phase() -> dict:
    import colo_shim
    from colo_shim.offload import ahead, mirrors, pages

    colo_shim.install(["offload", "megatron"])
    pages.host = SEAM
    st = build(seed=0, steps=0)
    out = {"first": job_round(st, 1)}  # main params only; its step makes Adam's state and the hook fires
    out["quiet"] = quiet()
    state = state_tensors(st)
    background = [c for c in SEAM.calls if not c["main"]]
    out["before_second"] = {"state_tensors": len(state), "made_ahead": ahead.stats["prepared"],
                            "background_registrations": len(background),
                            "background_devices": sorted({str(c["device"]) for c in background}),
                            "linked": sum(not mirrors.wanted(t) for t in state), "on_device": all(map(on_device, state))}
    del state
    out["second"] = job_round(st, 2)
    out["third"] = job_round(st, 3)
    out["identical_to_plain"] = same(PLAIN, final_values(st))  # bit for bit, after the same three steps

    rebuild(st)
    SEAM.gate = threading.Event()
    requested = ahead.stats["requested"]
    step(st, 4)  # the hook queues the rebuilt tensors; their registrations wait at the gate
    n = len(state_tensors(st))
    started = {"queued": ahead.stats["requested"] - requested}

    def offload_then_look(fn):
        with SEAM.cv:  # a background registration has begun and waits at the gate (when any was queued)
            started["registering"] = SEAM.cv.wait_for(lambda: SEAM.blocked > 0, 120 if started["queued"] else 0)
        thread = in_thread(fn)
        with ahead._cv:  # the offload waits for it
            started["waiting"] = ahead._cv.wait_for(lambda: ahead._state["waiting"] > 0,
                                                    120 if started["registering"] else 0)
        with FakeCuda():
            started["still_on_device"] = all(map(on_device, state_tensors(st)))
        started["visible"] = sum(not mirrors.wanted(t) for t in state_tensors(st))
        started["offloads"], started["blocked"] = mirrors.stats["offloads"], SEAM.blocked
        SEAM.gate.set()
        thread.join(120)
        started["joined"] = not thread.is_alive()

    offloads = mirrors.stats["offloads"]
    out["racing"] = dict(job_round(st, 5, offload_in=offload_then_look), tensors=n)
    out["racing"].update(started, offloads_before=offloads)

    rebuild(st)
    SEAM.gate = threading.Event()
    step(st, 6)
    discarded, unlocked = mirrors.stats["ahead_discarded"], SEAM.unregistrations
    ahead.SETTLE_S = 0.0  # the offload stops waiting at once: it makes every mirror itself
    late = job_round(st, 7)
    ahead.SETTLE_S = 300.0
    SEAM.gate.set()
    late.update(quiet=quiet(), tensors=n, discarded=mirrors.stats["ahead_discarded"] - discarded,
                unlocked=SEAM.unregistrations - unlocked, locked=len(SEAM.locked), mirrors=len(mirrors._mirrors))
    out["not_ready"] = late
    SEAM.gate = None

    from colo_shim.core import ledger
    from colo_shim.offload import budget

    mirrors.drop_all()  # a process that holds no mirror yet, alone on a node whose budget is tiny (a
    budget.settle(mirrors.held(), mirrors.held("buffer"))  # ledger's budget is fixed by its first process)
    ledger.leave()
    os.environ["COLO_SHIM_OFFLOAD_HOST_GIB"] = "0.000001"
    rebuild(st)
    requested = ahead.stats["requested"]
    step(st, 8)
    over = job_round(st, 9)
    out["over_budget"] = dict(over, requested=ahead.stats["requested"] - requested)
    del os.environ["COLO_SHIM_OFFLOAD_HOST_GIB"]
    ledger.leave()
    job_round(st, 10)  # mirrors again, made at the offload

    SEAM.fail_background = True
    rebuild(st)
    step(st, 11)
    out["failing"] = dict(quiet=quiet(), mode=mirrors.mode(), mirrors=len(mirrors._mirrors), locked=len(SEAM.locked))
    out["failing"].update(job_round(st, 12), again=job_round(st, 13))
    out["report"] = ahead.report()
    return out


def main():
    init()
    log = logging.handlers.BufferingHandler(10_000)
    log.setLevel(logging.WARNING)
    logging.getLogger("colo_shim").addHandler(log)
    plain = build(seed=0, steps=0)
    for n in (1, 2, 3):
        job_round(plain, n)
    PLAIN.extend(final_values(plain))
    out = shim_phase()
    out["warnings"] = [r.getMessage() for r in log.buffer]
    print(json.dumps(out, default=str))


SEAM = PageLocks()  # the page-locking seam colo-shim calls (the plain phase: none)
PLAIN = []  # the plain phase's values after its three steps

if __name__ == "__main__":
    main()
