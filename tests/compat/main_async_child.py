"""Compat check `main_async`: the REAL NeMo-RL main worker's finalize_async_save under colo-shim.

Run by test_compat_nemo_rl.py like compat_child.py (zero-code activation, stand-ins, the real tree),
plus the real NVRx 0.7.0 on the path. The object is a real `MegatronPolicyWorkerImpl` built without
its __init__ (which needs a GPU model); the methods that run are main's own: offload_before_refit,
finalize_async_save, _requires_nvrx_cuda_cache_release. Megatron-Bridge is not installable here, so
the module's `maybe_finalize_async_save` and megatron-core's `get_async_strategy` are replaced by
equivalents on the real NVRx queue (Bridge: finalize the GlobalState queue, close it on terminate;
mcore: NVRx's FileSystemWriterAsync), recording how main called them. no_dist=True: one gloo rank.
main's offload_before_refit raises at `torch.randn(1).cuda()` on this machine, after its finalize
and the first offload steps; the check records that it got that far. Without a driver,
torch.cuda.ipc_collect/empty_cache (main's release) are recorded instead of raising.

Prints `RESULT <json>`.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
import types


def main() -> dict:
    import torch

    import colo_shim
    from colo_shim.cli import saver as cs

    import gated_io
    from nvidia_resiliency_ext.checkpointing.async_ckpt.filesystem_async import FileSystemWriterAsync
    from nemo_rl.models.policy.workers import megatron_policy_worker as mpw

    cs.init_single_rank()
    q = cs.make_queue(shm=True)  # NVRx's own shm worker: no GPU here
    calls = []

    def maybe_finalize_async_save(global_state, ckpt_cfg, blocking=False, terminate=False):
        calls.append({"blocking": blocking, "terminate": terminate})
        if not ckpt_cfg.async_save or global_state.async_calls_queue is None:
            return
        global_state.async_calls_queue.maybe_finalize_async_calls(blocking, no_dist=True)
        if terminate:
            global_state.async_calls_queue.close()

    mpw.maybe_finalize_async_save = maybe_finalize_async_save
    if not torch.cuda.is_available():  # no driver here: record main's release calls instead of raising
        for name in ("ipc_collect", "empty_cache"):
            setattr(torch.cuda, name, functools.partial(calls.append, name))
    mpw.get_async_strategy = lambda strategy: (None, {"FileSystemWriterAsync": FileSystemWriterAsync})
    worker = object.__new__(mpw.MegatronPolicyWorkerImpl)
    ckpt_cfg = types.SimpleNamespace(async_save=True, async_strategy="nvrx", use_persistent_ckpt_worker=True,
                                     ckpt_assume_constant_structure=True, async_ckpt_use_cpu_shm=False)
    worker.mcore_state = types.SimpleNamespace(cfg=types.SimpleNamespace(checkpoint=ckpt_cfg), async_calls_queue=q)
    worker.cfg = {"generation": {"colocated": {"enabled": True}}, "megatron_cfg": {}}
    worker.model, worker.fp8_cfg, worker.rank = torch.nn.Linear(8, 8), None, 0
    root = tempfile.mkdtemp()
    in_offload, waited = [False], []
    real = q.maybe_finalize_async_calls

    def watched(blocking=False, no_dist=False):
        if blocking and in_offload[0] and q.get_num_unfinalized_calls():
            waited.append(True)
            open(gate, "a").close()  # main waits for the write here: let it through
        return real(blocking, no_dist)

    q.maybe_finalize_async_calls = watched
    out = {"requires_release": worker._requires_nvrx_cuda_cache_release(), "steps": []}
    torch.manual_seed(3)
    live = {"w": torch.randn(512), "m": torch.randn(64, 8)}
    for step in range(1, 4):
        gate = f"{root}/gate{step}"
        for v in live.values():
            v.add_(step)
        at_save = {k: v.clone() for k, v in live.items()}
        worker._async_checkpoint_cuda_cache_active = True  # as main's save_checkpoint sets it
        q.schedule_async_request(gated_io.gated(cs.request(live, f"{root}/s{step}", cached=True, shm=True), gate))
        row = {"shm_before": _shm(FileSystemWriterAsync), "pid_before": _pid(q)}
        calls.clear()
        in_offload[0] = True
        try:
            worker.offload_before_refit()
            row["offload"] = "returned"
        except (RuntimeError, AssertionError) as exc:  # no GPU: main's offload stops at .cuda()
            row["offload"] = f"{type(exc).__name__} after its finalize"
        in_offload[0] = False
        row.update(waited=bool(waited), pending=q.get_num_unfinalized_calls(), gate_open=os.path.exists(gate),
                   offload_calls=list(calls))
        waited.clear()
        for v in live.values():  # training changes the tensors while the write may be held
            v.mul_(-3.0)
        open(gate, "a").close()
        calls.clear()
        worker.finalize_async_save()  # the checkpointer thread's wait_fn (a waiting call)
        row.update(wait_calls=list(calls), pending_after_wait=q.get_num_unfinalized_calls(),
                   equal=_equal(cs, f"{root}/s{step}", at_save), shm_after=_shm(FileSystemWriterAsync),
                   pid_after=_pid(q), flag_after=worker._async_checkpoint_cuda_cache_active)
        out["steps"].append(row)
    out["status"] = {s["target"]: s["status"] for s in colo_shim.status()
                     if s["target"].endswith("PolicyWorkerImpl.finalize_async_save")}
    q.close()
    return out


def _shm(writer):
    return sorted(t.data_ptr() for _, tensors in getattr(writer, "_shm_tensor_cache", {}).values() for t in tensors)


def _pid(q):
    proc = getattr(getattr(q, "persistent_caller", None), "process", None)
    return proc.pid if proc is not None and proc.is_alive() else None


def _equal(cs, path, expected):
    import torch

    got = cs.load(path, expected)
    return all(torch.equal(got[k], expected[k]) for k in expected)


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(), default=str), flush=True)
    import multiprocessing

    for child in multiprocessing.active_children():
        child.kill()
    os._exit(0)
