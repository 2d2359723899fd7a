"""Scenarios for the staged /dev/shm buffers (issue 16 items 1 and 7): `python stage_drain.py NAME '{json}'`.

Real NVRx (the version on PYTHONPATH), a real spawned persistent worker, gloo, CPU tensors: NVRx
0.7.0 stages CPU tensors through its shared-memory cache too, so the buffer reuse that a GPU job
does is the same code here. A "gated" write waits in the worker until the trainer creates a file,
so whether a write is still reading a buffer is ordered by the test, never by timing.
The last stdout line is the JSON result.
"""

import atexit
import functools
import json
import os
import signal
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _setup():
    import colo_shim

    colo_shim.install(["nvrx", "megatron"])
    from colo_shim.cli import saver

    saver.init_single_rank()
    return saver


def _values(step):
    import torch

    torch.manual_seed(1000 + step)
    return {"w": torch.randn(512), "m": torch.randn(64, 8), "v": torch.rand(64, 8)}


def _set(live, step):
    for k, v in _values(step).items():
        live[k].copy_(v)
    return {k: v.clone() for k, v in live.items()}


def _same(cs, path, expected):
    import torch

    got = cs.load(path, expected)
    return all(torch.equal(got[k], expected[k]) for k in expected)


def _writer():
    from nvidia_resiliency_ext.checkpointing.async_ckpt import filesystem_async

    return filesystem_async.FileSystemWriterAsync


def _close_like(q, how):
    """Each way a job, NeMo-RL or colo-shim itself ends (or loses) the writer of a queue."""
    import colo_shim
    from colo_shim.checkpoint import fence, stage, state

    out = {}
    if how == "close":  # megatron's maybe_finalize_async_save(terminate=True)
        q.close()
    elif how == "abort":  # NVRx abort_nvrx_checkpoint()
        q.close(abort=True)
    elif how == "nemo_rl_refit":  # NeMo-RL main at offload_before_refit
        q.close()
        _writer().cleanup_tensor_caches()
    elif how == "restart_release":  # colo-shim's restart release, then the re-warm at reload
        os.environ["COLO_SHIM_NVRX_RELEASE"], before = "restart", os.environ.get("COLO_SHIM_NVRX_RELEASE")
        state.note_cuda_sent(q)  # CPU machine: play a writer that was sent CUDA tensors
        out["released"] = colo_shim.fence("refit").as_dict()["released"]
        os.environ.pop("COLO_SHIM_NVRX_RELEASE")
        if before is not None:
            os.environ["COLO_SHIM_NVRX_RELEASE"] = before
        out["rewarmed"] = fence.rewarm("reload")
    elif how == "inplace_drop":  # stage's release of a writer sent CUDA: drop in place, keep the buffers
        state.note_cuda_sent(q)
        out["released"] = colo_shim.fence("drop").as_dict()["released"]
    elif how == "ipc_fallback":  # a save went through CUDA IPC on a shm worker (GPU only): restart with CUDA
        stage.before_schedule(q, True)
        out["closed"] = q.persistent_caller is None
    elif how == "dead_worker":  # the worker is killed; the job closes the queue and goes on
        proc = q.persistent_caller.process
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        q.close()
    return out


def reuse_after_close(opts):
    """Per closer: a save, the close, a save on the new worker, then saves 2 and 3 back to back.

    (NVRx's worker-restart callback drops the buffers of the first save on a new worker, so the
    first reuse after a restart is the save after that one.) The write of save 2 is held by a gate.
    Whatever drain NVRx calls before save 3 reuses save 2's buffers opens the gate, then drains;
    with no drain installed, the gate opens only after save 3 copied its values in (when its request
    is built, before it is queued), so checkpoint 2 then holds step 3's values."""
    cs = _setup()
    import gated_io

    writer = _writer()
    root = tempfile.mkdtemp()
    shm = opts.get("job_shm", False)
    q = cs.make_queue(shm=shm)
    live = _values(0)
    step, rounds = 0, []

    def save(tag, wrap=None):
        nonlocal step
        step += 1
        expected = _set(live, step)
        cs.async_save(q, live, f"{root}/{tag}", cached=True, shm=shm, wrap=wrap)
        return expected

    for n, how in enumerate(opts["closers"]):
        at_a = save(f"{n}a")
        cs.finalize(q)
        out = {"closer": how, "a_equal": _same(cs, f"{root}/{n}a", at_a)}
        out.update(_close_like(q, how))
        at_b = save(f"{n}b")
        cs.finalize(q)
        out["b_equal"] = _same(cs, f"{root}/{n}b", at_b)
        gate = f"{root}/{n}gate"
        expect2 = save(f"{n}s2", wrap=lambda fn: functools.partial(gated_io.wait_then_write, gate, fn))
        installed = writer._shm_drain_callback
        out["drain_installed_after_restart"] = installed is not None
        seen = []
        if installed is not None:
            def observe(installed=installed, gate=gate):
                seen.append(True)
                open(gate, "w").close()  # save 2 may write now; the drain must wait for it
                installed()
            writer._shm_drain_callback = observe

        def open_gate(fn, gate=gate):  # save 3's values are staged by now; its request is not queued yet
            if not os.path.exists(gate):
                open(gate, "w").close()
            return fn

        expect3 = save(f"{n}s3", wrap=open_gate)
        if installed is not None and writer._shm_drain_callback is observe:
            writer._shm_drain_callback = installed  # the observer only watches save 3
        cs.finalize(q)
        out.update(drain_called=bool(seen), s2_equal=_same(cs, f"{root}/{n}s2", expect2),
                   s3_equal=_same(cs, f"{root}/{n}s3", expect3), shm_entries=len(writer._shm_tensor_cache))
        rounds.append(out)
    from colo_shim.checkpoint import stage

    result = {"rounds": rounds, "drain_installs": getattr(stage, "_drain_stats", {}).get("drain_installs"),
              "slot_is_shim_drain": getattr(stage, "_drain", None) is not None
              and writer._shm_drain_callback is stage._drain}
    q.close()
    return result


class Recorder:
    """Stands in for the CUDA runtime calls only (no GPU here); refuses a double registration as CUDA does."""

    def __init__(self, fail=False):
        self.events, self.live, self.fail = [], set(), fail

    def ready(self):
        return True

    def register(self, ptr, nbytes):
        if self.fail:
            self.events.append(["register_failed", ptr, nbytes, ptr in self.live])
            raise RuntimeError("cudaErrorMemoryAllocation (played)")
        self.events.append(["register", ptr, nbytes, ptr in self.live])
        self.live.add(ptr)

    def unregister(self, ptr):
        self.events.append(["unregister", ptr, 0, ptr in self.live])
        self.live.discard(ptr)

    def synchronize(self):
        self.events.append(["synchronize", 0, 0, True])


def _cache_ptrs():
    return sorted(t.untyped_storage().data_ptr() for _, ts in _writer()._shm_tensor_cache.values() for t in ts)


def pin_lifecycle(opts):
    """Which staged buffers are page-locked and when they are unlocked, on every release path."""
    cs = _setup()
    from colo_shim.checkpoint import pinning, release

    rec = None if opts.get("real_host") else Recorder(fail=opts.get("fail", False))
    if rec is not None:
        pinning.host = rec
    result = {}

    def at_exit():  # registered before the shim's exit hook, so it runs after it (last in, first out)
        result["events_at_exit"] = rec.events[len(result["events"]):] if rec else []
        result["pinned_after_exit"] = sorted(pinning._pinned)
        print(json.dumps(result), flush=True)
        for child in __import__("multiprocessing").active_children():
            child.kill()
        os._exit(0)

    atexit.register(at_exit)
    writer = _writer()
    root = tempfile.mkdtemp()
    q = cs.make_queue(shm=False)
    live, step, phases = _values(0), 0, []

    def save(tag, extra=None):
        nonlocal step
        step += 1
        at = _set(live, step)
        state = dict(live, **(extra or {}))
        at.update({k: v.clone() for k, v in (extra or {}).items()})
        mark = len(rec.events) if rec else 0
        cs.async_save(q, state, f"{root}/{step}", cached=True, shm=False)
        cs.finalize(q)
        phases.append({"tag": tag, "equal": _same(cs, f"{root}/{step}", at), "events": rec.events[mark:] if rec else [],
                       "cache_ptrs": _cache_ptrs(), "cache_bytes": sum(
                           t.untyped_storage().nbytes() for _, ts in writer._shm_tensor_cache.values() for t in ts),
                       "pinned_bytes": pinning._stats["pinned_bytes"]})

    def released(tag, action):
        mark = len(rec.events) if rec else 0
        action()
        phases.append({"tag": tag, "events": rec.events[mark:] if rec else [], "cache_ptrs": _cache_ptrs(),
                       "pinned_bytes": pinning._stats["pinned_bytes"]})

    for tag in ("new", "new_worker_again", "first_reuse", "steady"):  # a new worker drops the first save's buffers
        save(tag)
    if not opts.get("short"):
        released("keep_shm", lambda: release.clear_training_caches(keep_shm=True))  # the in-place drop's clear
        save("reuse_after_keep_shm")
        released("cleanup_tensor_caches", writer.cleanup_tensor_caches)  # NeMo-RL main at refit
        save("new_after_cleanup")
        save("reuse_after_cleanup")
        released("close", q.close)  # colo-shim's close wrapper clears the caches
        for tag in ("new_after_close", "new_worker_after_close", "reuse_after_close"):
            save(tag)
        import torch

        os.environ["COLO_SHIM_STAGE_SHM_BYTES"] = "1000"  # a larger structure that does not fit: CUDA IPC,
        released("refused", lambda: save("refused", {"extra": torch.randn(4096)}))  # and the buffers dropped
        os.environ.pop("COLO_SHIM_STAGE_SHM_BYTES")
        save("new_after_refused")
        save("reuse_after_refused")
    import colo_shim

    stage_report = next(r["details"] for r in colo_shim.status() if r["name"] == "nvrx").get("stage", {})
    result.update(phases=phases, events=list(rec.events) if rec else [], stage=stage_report,
                  pinned_at_end=sorted(pinning._pinned))
    return None


if __name__ == "__main__":
    name, options = sys.argv[1], json.loads(sys.argv[2] if len(sys.argv) > 2 else "{}")
    out = globals()[name](options)
    if out is None:
        sys.exit(0)  # the result is printed by an exit hook: interpreter exit is part of the scenario
    print(json.dumps(out, default=str), flush=True)
    import multiprocessing

    for child in multiprocessing.active_children():
        child.kill()
    os._exit(0)
