"""Scenarios for NVRx's own /dev/shm buffers (issue 16 item 1): `python shm_drain.py NAME '{json}'`.

Real NVRx (the version on PYTHONPATH), a real spawned persistent worker, gloo, CPU tensors, the
job's own CPU shared-memory path (cpu_shm_mode queue, use_cpu_shm_for_gpu_tensors writers, as
megatron's --async-ckpt-use-cpu-shm): NVRx 0.7.0 copies CPU tensors through its shared-memory cache
too, so the buffer reuse that a GPU job does is the same code here. A "gated" write waits in the
worker until the trainer creates a file, so whether a write is still reading a buffer is ordered by
the test, never by timing. The last stdout line is the JSON result.
"""

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
    from colo_shim.checkpoint import fence, state

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
    elif how == "inplace_drop":  # the default release of a writer sent CUDA: drop in place, keep the buffers
        state.note_cuda_sent(q)
        out["released"] = colo_shim.fence("drop").as_dict()["released"]
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
    q = cs.make_queue(shm=True)  # the job's own shm path: a cpu_shm_mode queue, writers asking for shm copies
    live = _values(0)
    step, rounds = 0, []

    def save(tag, change=lambda request: request):
        nonlocal step
        step += 1
        expected = _set(live, step)
        q.schedule_async_request(change(cs.request(live, f"{root}/{tag}", cached=True, shm=True)))
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
        expect2 = save(f"{n}s2", change=lambda request: gated_io.gated(request, gate))
        installed = writer._shm_drain_callback
        out["drain_installed_after_restart"] = installed is not None
        seen = []
        if installed is not None:
            def observe(installed=installed, gate=gate):
                seen.append(True)
                open(gate, "w").close()  # save 2 may write now; the drain must wait for it
                installed()
            writer._shm_drain_callback = observe

        def open_gate(request, gate=gate):  # save 3's values are in the shm buffers now; its request is not queued
            if not os.path.exists(gate):
                open(gate, "w").close()
            return request

        expect3 = save(f"{n}s3", change=open_gate)
        if installed is not None and writer._shm_drain_callback is observe:
            writer._shm_drain_callback = installed  # the observer only watches save 3
        cs.finalize(q)
        out.update(drain_called=bool(seen), s2_equal=_same(cs, f"{root}/{n}s2", expect2),
                   s3_equal=_same(cs, f"{root}/{n}s3", expect3), shm_entries=len(writer._shm_tensor_cache))
        rounds.append(out)
    import colo_shim
    from colo_shim.checkpoint import shm_drain

    result = {"rounds": rounds, "slot_is_shim_drain": writer._shm_drain_callback is shm_drain._drain,
              "report": next(r["details"] for r in colo_shim.status() if r["name"] == "nvrx").get("shm_drain")}
    q.close()
    return result


if __name__ == "__main__":
    import entry

    entry.main(globals())
