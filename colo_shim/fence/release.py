"""How a finalized NVRx writer lets go of CUDA tensors it was sent (COLO_SHIM_NVRX_RELEASE).

- inplace: a drop request goes down the worker's own queue; the worker forgets its cached tensors
  and stays warm, so the next save costs a re-send instead of a worker boot (import torch, CUDA
  context). Its CUDA context (~0.5 GiB) stays.
- restart: the upstream-style release (close the queue, clear caches); the worker's CUDA context
  goes too. When storage is reloaded, a fresh worker is started in the background with the
  queue's original QoS arguments so the next save does not pay the boot.
- none: finalize only (memory stays pinned; for comparison).
"""

from __future__ import annotations

import inspect
import logging
import queue as _queue
import sys
import time
import weakref

from colo_shim.core import config
from colo_shim.fence import state, worker

log = logging.getLogger("colo_shim.nvrx")

ENV = "COLO_SHIM_NVRX_RELEASE"
CHOICES = ("inplace", "restart", "none")
_FS = "nvidia_resiliency_ext.checkpointing.async_ckpt.filesystem_async"
DEFAULT = "inplace"

_to_rewarm: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # queue -> rank


def strategy() -> str:
    return config.env_choice(ENV, CHOICES, DEFAULT)


def clear_training_caches(keep_shm: bool = False) -> None:
    """Make the next cached save re-send its data; keep_shm keeps CPU shm buffers (no GPU held)."""
    state.sent_ptrs.clear()
    writer = getattr(sys.modules.get(_FS), "FileSystemWriterAsync", None)
    if writer is None:
        return
    cleanup = getattr(writer, "cleanup_tensor_caches", None)
    if cleanup is not None and not keep_shm:
        cleanup()
        return
    for name in ("_cached_identifiers", "_cached_tensor_data_ptrs") + (() if keep_shm else ("_shm_tensor_cache",)):
        cache = getattr(writer, name, None)
        if cache is not None:
            cache.clear()


def release(queue, deadline: float | None) -> str | None:
    """Release one finalized queue's worker; returns what was done, None when nothing applies."""
    if not type(queue).__module__.startswith("nvidia_resiliency_ext"):
        return None
    how = strategy()
    if how == "none":
        return None
    caller = getattr(queue, "persistent_caller", None)
    proc = getattr(caller, "process", None)
    if proc is None or not proc.is_alive():
        clear_training_caches(keep_shm=False)
        return "gone"
    if how == "inplace":
        _drop_in_place(caller, deadline)
        clear_training_caches(keep_shm=True)
        return "inplace"
    _to_rewarm[queue] = caller.rank
    queue.close()
    return "restart"


def _drop_in_place(caller, deadline: float | None) -> None:
    core = sys.modules[type(caller).__module__]
    fields = core.AsyncRequest._fields
    values = dict(async_fn=worker.drop_cached_tensors, async_fn_args=(), finalize_fns=[],
                  async_fn_kwargs={}, preload_fn=None, call_idx=worker.MARKER)
    caller.queue.put(core.AsyncRequest(**{k: v for k, v in values.items() if k in fields}))
    while True:
        try:
            got = caller.comp_q.get(timeout=0.05)
        except _queue.Empty:
            got = None
        if got == worker.MARKER:
            return
        if got is not None:
            log.warning("colo_shim: unexpected completion %r while releasing the writer", got)
        if not caller.process.is_alive():
            raise state.CheckpointWorkerDied(
                f"colo_shim fence: rank {state.rank()}: checkpoint worker died while releasing its cache")
        if deadline is not None and time.monotonic() > deadline:
            raise state.FenceTimeout(
                f"colo_shim fence: rank {state.rank()} timed out ({state.TIMEOUT_ENV}) "
                f"waiting for checkpoint worker pid {caller.process.pid} to drop its cache")


def collect_cuda() -> None:
    """Return blocks the worker let go of: IPC limbo first, then the caching allocator."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.ipc_collect()
        torch.cuda.empty_cache()


def rewarm(reason: str = "") -> int:
    """Start, in the background, the writers the restart strategy ended; returns how many."""
    started = 0
    for queue, rank in list(_to_rewarm.items()):
        _to_rewarm.pop(queue, None)
        warm = getattr(type(queue), "warmup_persistent_caller", None)
        if warm is None or getattr(queue, "persistent_caller", None) is not None or rank is None:
            continue
        try:
            params = inspect.signature(warm).parameters
            kwargs = {name: getattr(queue, name) for name in params if name != "rank" and hasattr(queue, name)}
            warm(rank, **kwargs)
            started += 1
        except Exception as exc:  # a cold next save is the fallback, never a failure
            log.warning("colo_shim: re-warm of checkpoint writer failed (%s): %s: %s", reason, type(exc).__name__, exc)
    if started:
        log.info("colo_shim: re-warming %d checkpoint writer(s) after %s", started, reason)
    return started
