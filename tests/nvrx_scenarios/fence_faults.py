"""Scenarios for a fence that fails half way and for what a released worker still holds (issue 32).

`python fence_faults.py NAME '{json}'`: real NVRx (the version on PYTHONPATH), real spawned worker,
gloo, CPU tensors. A fault is injected into colo-shim's own fence steps (never into NVRx): the
step raises after the worker was asked to drop its cache, as an answer past the opt-in deadline or
any error after the knock would. The last stdout line is the JSON result.
"""

import contextlib
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from host_only import _gated, _live, _same, _setup  # noqa: E402


@contextlib.contextmanager
def _workdir():
    root = tempfile.mkdtemp()
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _warm(cs, root, seed):
    """A shm queue whose worker already holds one cached save, and the live tensors it saved."""
    q = cs.make_queue(shm=True)
    live = _live(seed)
    cs.async_save(q, live, f"{root}/warm", cached=True, shm=True)
    cs.finalize(q)
    return q, live


def _alive(q):
    proc = getattr(q.persistent_caller, "process", None)
    return proc is not None and proc.is_alive()


def _shim_errors() -> dict:
    import colo_shim

    return {k: v for r in colo_shim.status() for k, v in r["details"].get("shim_errors", {}).items()}


@contextlib.contextmanager
def _break_after_knock(where):
    """Make one fence step raise once, after the worker has already dropped its cache (put back at
    the end in any case: the next case in this process fences with the real steps)."""
    from colo_shim.checkpoint import door, release, state

    real = {"knock": door.knock, "mismatch": release._mismatch, "collect": release.collect_cuda}

    def knock_then_timeout(caller, wait):
        real["knock"](caller, wait)  # the worker dropped its cache; its answer came "too late"
        door.knock = real["knock"]
        raise state.FenceTimeout("injected: the writer answered after COLO_SHIM_FENCE_TIMEOUT")

    def mismatch_raises(queue, caller, freed):
        release._mismatch = real["mismatch"]
        raise RuntimeError("injected fault after the knock")

    def collect_raises():
        release.collect_cuda = real["collect"]
        raise RuntimeError("injected fault in the CUDA collection")

    if where == "timeout":
        door.knock = knock_then_timeout
    elif where == "after_knock":
        release._mismatch = mismatch_raises
    elif where == "collect":
        release.collect_cuda = collect_raises
    try:
        yield
    finally:
        door.knock, release._mismatch, release.collect_cuda = real["knock"], real["mismatch"], real["collect"]


def half_fence(opts):
    """Cached saves, then a fence that raises after the knock; the next cached save must re-send
    its data and complete (before the fix the worker died on a cache miss and the trainer hung in
    preload_q.join()), and equal the state it saved."""
    cs = _setup(opts)
    from colo_shim.checkpoint import fence, state

    errors_before = _shim_errors()  # contained errors are counted per process; this case's are the new ones
    with _workdir() as root:
        q, live = _warm(cs, root, 7)
        state.note_cuda_sent(q)  # CPU machine: play a writer that was sent CUDA tensors
        out = {"raised": None}
        with _break_after_knock(opts["where"]):
            try:  # as every wrapper runs it before an offload
                fence.guarded("offload")
            except Exception as exc:
                out["raised"] = type(exc).__name__
        out["worker_alive_after_fence"] = _alive(q)
        live["w"].add_(1)
        at = {k: v.clone() for k, v in live.items()}
        cs.async_save(q, live, f"{root}/next", cached=True, shm=True)
        out["finalized"] = len(cs.finalize(q))
        out["equal"] = _same(cs, f"{root}/next", at)
        out["worker_alive_after_save"] = _alive(q)
        errors = _shim_errors()
        out["shim_errors"] = {k: n - errors_before.get(k, 0) for k, n in errors.items() if n > errors_before.get(k, 0)}
        q.close()
        return out


def requests_hold(opts):
    """NVRx < 0.6: what the worker's requests still reference once its save was copied, in the
    worker's own view (the door's answer). `gated`: asked while the write is still held (0.5.0
    holds its request until the write ends); else after the save was finalized (0.4.1's loop keeps
    its last request while idle)."""
    cs = _setup(opts)
    from colo_shim.checkpoint import door, fence

    with _workdir() as root:
        q = cs.make_queue()
        live = _live(8)
        out = {}
        if opts.get("gated"):
            gate = f"{root}/gate"
            _gated(cs, q, live, f"{root}/s", gate)
            out["answer"] = door.knock(q.persistent_caller, fence.Wait())
            open(gate, "w").close()
        else:
            cs.async_save(q, live, f"{root}/s", cached=False)
            cs.finalize(q)
            out["answer"] = door.knock(q.persistent_caller, fence.Wait())
        cs.finalize(q)
        out["equal"] = _same(cs, f"{root}/s", live)
        q.close()
        return out


def dead_before_report(opts):
    """The worker dies while a save is pending (killed mid-write); the job's blocking finalize
    must end in a clear error and must not count the save as finalized, with or without a drop
    marker of ours still owed (a queued drop that timed out)."""
    cs = _setup(opts)
    import signal

    from colo_shim.checkpoint import release, state

    with _workdir() as root:
        q, live = _warm(cs, root, 9)
        caller = q.persistent_caller
        _gated(cs, q, live, f"{root}/s", f"{root}/never")  # its write waits on a gate never opened
        if opts.get("marker_owed"):
            from colo_shim.checkpoint import fence

            try:
                release._drop_queued(caller, fence.Wait(timeout=0.2))  # queued behind the held write
            except state.FenceTimeout:
                pass
        out = {"owed": state._owed.get(caller, 0)}
        os.kill(caller.process.pid, signal.SIGKILL)
        caller.process.join()
        try:
            out["finalized"] = q.maybe_finalize_async_calls(blocking=True, no_dist=True)
            out["raised"] = None
        except state.CheckpointWorkerDied as exc:
            out["raised"], out["message"] = type(exc).__name__, str(exc)
        out["pending"] = q.get_num_unfinalized_calls()
        out["metadata_written"] = os.path.exists(f"{root}/s/.metadata")
        q.close()
        out["pending_after_close"] = q.get_num_unfinalized_calls()
        return out


if __name__ == "__main__":
    import entry

    entry.main(globals())
