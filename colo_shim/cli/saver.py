"""The NVRx async-save driver of `colo-shim demo` (cli/demo_child.py), shipped because the demo is.

The demo is an installed command that shows the fix on the user's own machine, so it needs a
host job that saves through real NVRx: real planning, the real persistent worker, real
torch.distributed checkpoint files. Every function here is the demo's. Tests and benchmarks reuse
it rather than keep a second driver; what only they need stays with them: a write held by a gate or
slowed down is their change to the request that `request()` returns, before they queue it, and a
process group of several ranks is theirs to start. The finalize keeps upstream's rule for any
number of ranks (every rank raises when one write failed): one rule, which the demo's single rank
passes through.

It differs from Megatron's driver only where NVRx assumes CUDA: on a machine without a GPU the
staging copy is blocking (NVRx would call torch.cuda.synchronize()) and the finalize step checks
write failures with gloo object collectives instead of a CUDA tensor. It works with every NVRx
version the shim supports (0.4.1 .. 0.7.0).
"""

from __future__ import annotations

import functools
import inspect

import torch
import torch.distributed as dist
from nvidia_resiliency_ext.checkpointing.async_ckpt import core, filesystem_async, state_dict_saver


def _accepted(fn, **kwargs) -> dict:
    params = inspect.signature(fn).parameters
    return {k: v for k, v in kwargs.items() if k in params}


def make_queue(*, shm: bool = False) -> core.AsyncCallsQueue:
    """A persistent queue; shm selects NVRx's CPU shared-memory worker (no CUDA in the worker)."""
    return core.AsyncCallsQueue(**_accepted(core.AsyncCallsQueue.__init__, persistent=True, is_daemon=True,
                                            cpu_shm_mode=shm))


def _finalize(writer, metadata, dist_wrapper) -> None:
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.utils import _get_failure_dict

    results = writer.retrieve_write_results()
    all_results = dist_wrapper.gather_object(results)
    failures = {}
    if dist_wrapper.is_coordinator:
        failures = _get_failure_dict(all_results)
        if not failures:
            writer.finish(metadata, all_results)
    flag = [bool(failures)]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(flag, src=dist_wrapper.coordinator_rank)
    if flag[0]:
        raise CheckpointException("write", failures)


def request(state_dict: dict, path: str, *, cached: bool = True, shm: bool = False) -> core.AsyncRequest:
    """One async save of state_dict (tensors) to path, planned by NVRx and not yet queued."""
    cls = filesystem_async.FileSystemWriterAsync
    writer = cls(path, **_accepted(cls.__init__, thread_count=1, is_multiproc_io=False,
                                   use_cached_data_structure=cached, use_cpu_shm_for_gpu_tensors=shm))
    writer, metadata, dist_wrapper = state_dict_saver.save_state_dict_async_plan(state_dict, writer)[:3]
    save_fn, preload_fn, save_args = writer.get_save_function_and_args()
    if preload_fn is not None and not torch.cuda.is_available():
        preload_fn = functools.partial(preload_fn.func, *preload_fn.args[:-1], False)
    return core.AsyncRequest(save_fn, save_args, [functools.partial(_finalize, writer, metadata, dist_wrapper)],
                             async_fn_kwargs={}, preload_fn=preload_fn)


def async_save(queue, state_dict: dict, path: str, *, cached: bool = True, shm: bool = False) -> int:
    """Plan and queue one async save (the host job's save_checkpoint); returns the call index."""
    return queue.schedule_async_request(request(state_dict, path, cached=cached, shm=shm))


def finalize(queue) -> list:
    return queue.maybe_finalize_async_calls(blocking=True, no_dist=True)


def load(path: str, like: dict) -> dict:
    """Read a checkpoint back into CPU tensors shaped like `like`."""
    import torch.distributed.checkpoint as dcp

    out = {k: torch.empty(v.shape, dtype=v.dtype) for k, v in like.items()}
    dcp.load(out, storage_reader=dcp.FileSystemReader(path))
    return out


def init_single_rank() -> None:
    """gloo process group of one rank, enough for NVRx planning and finalization. Its store lives in
    this process: a TCP port picked here could be taken by another job before gloo binds it."""
    if dist.is_initialized():
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def offload(tensors: dict) -> dict:
    """Colocated-training offload in miniature: CPU copies, then free the device storage in place."""
    import gc

    copies = {k: v.to("cpu", copy=True) for k, v in tensors.items()}
    for t in tensors.values():
        t.untyped_storage().resize_(0)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return copies
