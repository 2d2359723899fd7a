"""Scenarios for saves that hold no GPU memory and for the release checks (issues 8.6-8.8, 11).

`python host_only.py NAME '{json}'`, real NVRx (the version on PYTHONPATH), real spawned worker,
gloo, CPU tensors. The worker-side write of a "gated" save waits until the trainer creates a
file, so what happens while a save is in flight is ordered by the test, not by timing.
The last stdout line is the JSON result.
"""

import logging
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _setup(opts):
    import colo_shim

    if opts.get("shim", True):
        colo_shim.install(["nvrx", "megatron"])
    from colo_shim.cli import saver

    saver.init_single_rank()
    return saver


def _live(seed):
    import torch

    torch.manual_seed(seed)
    return {"w": torch.randn(512), "m": torch.randn(64, 8), "v": torch.rand(64, 8)}


def _gated(cs, q, live, path, gate):
    import gated_io

    return q.schedule_async_request(gated_io.gated(cs.request(live, path, cached=True, shm=True), gate))


def _same(cs, path, expected):
    import torch

    got = cs.load(path, expected)
    return all(torch.equal(got[k], expected[k]) for k in expected)


def left_writing(opts):
    """A host-only save in flight: the fence returns without it; training changes the tensors;
    the job's own finalize completes it, and it holds the values of the moment it was scheduled."""
    cs = _setup(opts)
    import colo_shim

    root = tempfile.mkdtemp()
    q = cs.make_queue(shm=True)
    live = _live(1)
    cs.async_save(q, live, f"{root}/warm", cached=True, shm=True)  # first save: cache keys, worker boot
    cs.finalize(q)
    gate = f"{root}/gate"
    _gated(cs, q, live, f"{root}/s", gate)
    at_schedule = {k: v.clone() for k, v in live.items()}
    out = {}
    if opts.get("open_first"):  # NVRx < 0.6: the fence waits for it, so the write must be able to run
        open(gate, "w").close()
    if opts.get("shim", True):
        from colo_shim.checkpoint import state

        before = state.totals()
        out["report"] = colo_shim.fence("offload").as_dict()
        after = state.totals()
        out["fence_s_added"] = after["fence_s"] - before["fence_s"]
        out["fence_max_s"] = after["fence_max_s"]
        caller = q.persistent_caller  # a write the fence waited for: its completion, handed back to NVRx
        out["written_at_fence_return"] = (caller.cur_item is not None) + len(state._handed_back.get(caller, ()))
        from colo_shim.core import ledger

        out["writer_noted"] = ledger.mine("writer")  # the offload budget counts the writer's host copies
    out["pending_after_fence"] = q.get_num_unfinalized_calls()
    for v in live.values():  # the next training step, while the write is still waiting on the gate
        v.mul_(-3.0).add_(1.0)
    if not opts.get("open_first"):
        open(gate, "w").close()
    out["finalized_by_job"] = len(cs.finalize(q))
    out["equal_to_schedule_time"] = _same(cs, f"{root}/s", at_schedule)
    q.close()
    return out


def release_check(opts):
    """inplace release: what the worker-side drop reports, and the fallback when it does not match."""
    logging.basicConfig(level=logging.WARNING)
    cs = _setup(opts)
    import colo_shim
    from colo_shim.checkpoint import state

    root = tempfile.mkdtemp()
    q = cs.make_queue(shm=True)
    live = _live(3)
    out = {"released": [], "equal": []}
    fallbacks = state.totals()["release_fallbacks"]  # this process's count: the case's are the new ones
    for i in range(2):
        cs.async_save(q, live, f"{root}/r{i}", cached=True, shm=True)
        state.note_cuda_sent(q)  # CPU machine: play a writer that was sent CUDA tensors
        out["released"].append(colo_shim.fence(f"r{i}").as_dict()["released"])
        live["w"].add_(1)
        at = {k: v.clone() for k, v in live.items()}
        cs.async_save(q, live, f"{root}/after{i}", cached=True, shm=True)
        cs.finalize(q)
        out["equal"].append(_same(cs, f"{root}/after{i}", at))
    out["fallbacks"] = state.totals()["release_fallbacks"] - fallbacks
    q.close()
    return out


def drop_report(opts):
    """The drop's own report, read directly, through the side door and down the queue."""
    cs = _setup(opts)
    from colo_shim.checkpoint import door, fence, release

    root = tempfile.mkdtemp()
    q = cs.make_queue(shm=True)
    out = {}
    for i, how in enumerate(("door", "queued")):
        cs.async_save(q, _live(4), f"{root}/d{i}", cached=True, shm=True)
        cs.finalize(q)
        out[how] = (door.knock(q.persistent_caller, fence.Wait()) if how == "door"
                    else release._drop_queued(q.persistent_caller, fence.Wait()))
        release.clear_training_caches(keep_shm=True)  # as release() does after a drop
    q.close()
    return out


def marker_order(opts):
    """A completion read while waiting for the drop marker is handed back; a marker that comes
    after an opt-in timeout is skipped, never taken for a save's completion."""
    cs = _setup(opts)
    from colo_shim.checkpoint import fence, release, state

    root = tempfile.mkdtemp()
    q = cs.make_queue(shm=True)
    cs.async_save(q, _live(5), f"{root}/w", cached=True, shm=True)
    cs.finalize(q)
    caller = q.persistent_caller
    out = {}
    # 1: a save still in the worker when the drop is sent; its completion arrives first
    gate = f"{root}/g1"
    idx = _gated(cs, q, _live(6), f"{root}/a", gate)
    threading.Timer(0.2, lambda: open(gate, "w").close()).start()
    release._drop_queued(caller, fence.Wait())
    release.clear_training_caches(keep_shm=True)  # as release() does after a drop
    out["handed_back"] = list(state._handed_back.get(caller, ()))
    out["finalized_nonblocking"] = len(q.maybe_finalize_async_calls(blocking=False, no_dist=True))
    out["expected"] = [idx]
    # 2: the drop times out (opt-in) while the worker is busy; its marker lands in comp_q later
    gate2 = f"{root}/g2"
    _gated(cs, q, _live(7), f"{root}/b", gate2)
    ticks = iter(range(10**6))
    try:
        release._drop_queued(caller, fence.Wait(timeout=5, warn_every=0, clock=lambda: float(next(ticks))))
        out["timed_out"] = False
    except state.FenceTimeout:
        out["timed_out"] = True
    out["owed_after_timeout"] = state._owed.get(caller, 0)
    release.clear_training_caches(keep_shm=True)  # the drop may still run: the next save re-sends
    open(gate2, "w").close()
    first = q.maybe_finalize_async_calls(blocking=True, no_dist=True)
    live3 = _live(8)
    cs.async_save(q, live3, f"{root}/c", cached=True, shm=True)
    second = q.maybe_finalize_async_calls(blocking=True, no_dist=True)
    out["finalized"] = [len(first), len(second)]
    out["pending_at_end"] = q.get_num_unfinalized_calls()
    out["owed_at_end"] = state._owed.get(caller, 0)
    out["c_equal"] = _same(cs, f"{root}/c", live3)
    try:
        out["comp_q_left"] = caller.comp_q.get(timeout=2)
    except Exception:
        out["comp_q_left"] = None
    q.close()
    return out


def fake_clock_wait(opts):
    """A healthy save slower than the old 600 s default, timed on a clock the test drives: each
    poll advances it `step` s; the write is let through after `open_after` polls, then time stops."""
    cs = _setup(opts)
    import colo_shim
    from colo_shim.checkpoint import fence, state

    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logging.getLogger("colo_shim.nvrx").addHandler(Keep(level=logging.WARNING))
    root = tempfile.mkdtemp()
    q = cs.make_queue(shm=True)
    live = _live(9)
    gate = f"{root}/gate"
    _gated(cs, q, live, f"{root}/s", gate)
    state.note_cuda_sent(q)  # CPU machine: play a writer holding GPU memory, which the fence must release
    from colo_shim.checkpoint import door

    door._TOKEN += "-elsewhere"  # ... and whose side door is not open: the fence waits for its write
    now, polls = [0.0], [0]

    def sleep(_seconds):
        polls[0] += 1
        if polls[0] < opts["open_after"]:
            now[0] += opts["step"]
        elif polls[0] == opts["open_after"]:
            now[0] += opts["step"]
            open(gate, "w").close()
        else:
            time.sleep(0.005)  # the fake clock stands still; only yield the CPU to the worker

    out = {}
    try:
        wait = fence.Wait(clock=lambda: now[0], sleep=sleep)
        out["report"] = fence.fence("slow write", wait=wait).as_dict()
        out["raised"] = None
    except state.FenceTimeout as exc:
        out["raised"], out["message"] = "FenceTimeout", str(exc)
        open(gate, "w").close()
    out["clock_at_end"] = now[0]
    out["warnings"] = [m for m in records if "still waiting" in m]
    cs.finalize(q)
    out["equal"] = _same(cs, f"{root}/s", live)
    q.close()
    return out


def finalize_race(opts):
    """A host thread finalizing in this process (NeMo-RL's background checkpoint finalizer calls
    the policy's finalize_async_save) while the fence runs: every save is finalized once, in order,
    and the fence returns only after the thread's finalize of the earlier save completed."""
    cs = _setup(opts)
    from colo_shim.checkpoint import fence, state

    root = tempfile.mkdtemp()
    q = cs.make_queue(shm=True)
    events, started, go = [], threading.Event(), threading.Event()

    def slow_finalize():
        events.append("f0 start")
        started.set()
        go.wait(60)
        events.append("f0 end")

    cs.async_save(q, _live(10), f"{root}/0", cached=True, shm=True)
    q.async_calls[-1].async_request.finalize_fns.append(slow_finalize)
    cs.async_save(q, _live(11), f"{root}/1", cached=True, shm=True)
    q.async_calls[-1].async_request.finalize_fns.append(lambda: events.append("f1"))
    state.note_cuda_sent(q)  # a writer holding GPU memory: the fence releases it, finalizing nothing
    host = threading.Thread(target=lambda: events.append(("host", q.maybe_finalize_async_calls(True, True))))
    host.start()
    started.wait(60)
    threading.Timer(2.0, go.set).start()
    report = fence.fence("race").as_dict()
    at_return = list(events)
    host.join(60)
    q.close()
    return {"at_fence_return": [e for e in at_return if isinstance(e, str)],
            "host_finalized": [e[1] for e in events if isinstance(e, tuple)],
            "fence_finalized": report["calls_finalized"], "fence_released": report["released"], "all": [e for e in events if isinstance(e, str)]}


if __name__ == "__main__":
    import entry

    entry.main(globals())
