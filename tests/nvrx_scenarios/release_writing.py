"""Issue 22 scenarios: the writer lets go of what it was sent while its write is still running.

`python release_writing.py NAME '{json options}'`, real NVRx (the version on PYTHONPATH), its real
spawned persistent worker, gloo. This machine has no GPU, so NVRx runs its CPU shared-memory path:
the worker caches shared-memory tensors under the same `_worker_data_cache` key it would cache CUDA
IPC tensors under, and the queue is marked, through the real state API, as one whose worker was
sent CUDA tensors. Each write is held by a gate file (gated_io.py), so "still writing" is a fact of
the test, not a matter of timing. The last stdout line is the JSON result.
"""

import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _install():
    import colo_shim

    colo_shim.install(["nvrx", "megatron"])
    from colo_shim.cli import saver as cs

    return cs


def _state(seed):
    import torch

    torch.manual_seed(seed)
    return {"w": torch.randn(4096), "m": torch.randn(64, 8), "v": torch.rand(64, 8)}


def _gated_save(cs, q, live, path, gate):
    import gated_io

    q.schedule_async_request(gated_io.gated(cs.request(live, path, cached=True, shm=True), gate))


def _equal(cs, path, expected):
    import torch

    got = cs.load(path, expected)
    return all(torch.equal(got[k], expected[k]) for k in expected)


def _writer_cls():
    from nvidia_resiliency_ext.checkpointing.async_ckpt.filesystem_async import FileSystemWriterAsync

    return FileSystemWriterAsync


def _held_first_save(seed):
    """A queue whose first save's write is held by gate1, played as one that was sent CUDA tensors."""
    cs = _install()
    cs.init_single_rank()
    from colo_shim.checkpoint import state

    root = tempfile.mkdtemp()
    q = cs.make_queue(shm=True)
    live = _state(seed)
    _gated_save(cs, q, live, f"{root}/s1", f"{root}/gate1")
    snapshot = {k: v.clone() for k, v in live.items()}
    state.note_cuda_sent(q)
    return cs, root, q, live, snapshot


def while_writing(opts):
    """save (write held) -> fence -> offload/reload -> write released -> finalize -> save, save."""
    cs, root, q, live, snapshot = _held_first_save(0)
    import colo_shim
    from colo_shim.checkpoint import door, fence, state

    out = {}
    if opts.get("no_door"):
        door._TOKEN += "-not-the-workers"  # the worker's door is elsewhere: as a worker without colo-shim  # the fallback waits for the write: open the gate once it waits
        import threading

        threading.Timer(1.0, lambda: open(f"{root}/gate1", "w").close()).start()
    report = colo_shim.fence("offload").as_dict()
    out.update(fence=report, pending_after_fence=q.get_num_unfinalized_calls(),
               gate_open_at_fence=os.path.exists(f"{root}/gate1"),
               identifiers_after_fence=len(_writer_cls()._cached_identifiers),
               totals=state.totals())
    if not opts.get("no_door"):
        out["second_drop"] = door.knock(q.persistent_caller, fence.Wait())  # the cache is empty now
    offloaded = {k: v.clone() for k, v in live.items()}
    for v in live.values():
        v.untyped_storage().resize_(0)  # storage replaced while the write is pending
    live = {k: v + 1 for k, v in offloaded.items()}
    open(f"{root}/gate1", "w").close()
    cs.finalize(q)  # the job's own finalize
    out["equal"] = [_equal(cs, f"{root}/s1", snapshot)]
    for i in (2, 3):  # 2: re-sends after the release; 3: no offload since, so NVRx reuses its cache
        out[f"cached_before_{i}"] = len(_writer_cls()._cached_identifiers)
        open(f"{root}/gate{i}", "w").close()
        state._cached_keys.pop(q, None)
        _gated_save(cs, q, live, f"{root}/s{i}", f"{root}/gate{i}")
        out[f"keys_sent_{i}"] = len(state._cached_keys.get(q, ()))
        cs.finalize(q)
        out["equal"].append(_equal(cs, f"{root}/s{i}", live))
        live = {k: v + 1 for k, v in live.items()}
    out["worker_alive"] = q.persistent_caller.process.is_alive()
    q.close()
    return out


def next_save_during_write(opts):
    """The next save is scheduled while the released writer still writes the previous one."""
    cs, root, q, live, first = _held_first_save(1)
    import colo_shim
    from colo_shim.checkpoint import state

    report = colo_shim.fence("offload").as_dict()
    live = {k: v * 2 for k, v in live.items()}  # reload with new values at new addresses
    import threading

    threading.Timer(1.0, lambda: open(f"{root}/gate1", "w").close()).start()  # the worker frees up later
    open(f"{root}/gate2", "w").close()
    _gated_save(cs, q, live, f"{root}/s2", f"{root}/gate2")  # queued behind write 1 (NVRx's FIFO)
    cs.finalize(q)
    out = {"fence": report, "equal": [_equal(cs, f"{root}/s1", first), _equal(cs, f"{root}/s2", live)]}
    q.close()
    # close and reuse: a fresh worker, a fresh door, the same release
    live = {k: v + 3 for k, v in live.items()}
    _gated_save(cs, q, live, f"{root}/s3", f"{root}/gate3")
    state.note_cuda_sent(q)
    out["fence_after_reuse"] = colo_shim.fence("offload after reuse").as_dict()
    open(f"{root}/gate3", "w").close()
    cs.finalize(q)
    out["equal"].append(_equal(cs, f"{root}/s3", live))
    q.close()
    return out


if __name__ == "__main__":
    name, options = sys.argv[1], json.loads(sys.argv[2] if len(sys.argv) > 2 else "{}")
    result = globals()[name](options)
    print(json.dumps(result, default=str), flush=True)
    import multiprocessing

    for child in multiprocessing.active_children():
        child.kill()
    os._exit(0)
