"""How a finalized NVRx writer lets go of CUDA tensors it was sent (COLO_SHIM_NVRX_RELEASE).

- inplace (default): a drop request goes down the worker's own queue; the worker forgets its
  cached tensors and stays warm, so the next save costs a re-send instead of a worker boot. Its
  CUDA context (~0.5 GiB) stays. It relies on NVRx internals (`_worker_data_cache`, `comp_q`), so
  it runs only on the NVRx releases it was tested on; the drop reports what it freed, and when
  that does not match what was sent the writer is restarted instead (one warning).
- restart: the upstream-style release (close the queue, clear caches); the worker's CUDA context
  goes too. When storage is reloaded, a fresh worker is started in the background with the
  queue's original QoS arguments so the next save does not pay the boot.
- stage: writers never get CUDA tensors; they are staged into CPU shared memory at schedule time
  (checkpoint/stage.py), so the fence has nothing to wait for. A save that still went through CUDA
  IPC (too little /dev/shm, NVRx < 0.6) is released as with inplace.
- none: finalize only (memory stays pinned; for comparison).
"""

from __future__ import annotations

import inspect
import logging
import queue as _queue
import sys
import weakref

from colo_shim.core import config, versions
from colo_shim.checkpoint import state, worker

log = logging.getLogger("colo_shim.nvrx")

ENV = "COLO_SHIM_NVRX_RELEASE"
CHOICES = ("inplace", "restart", "stage", "none")
DEFAULT = "inplace"
INPLACE_TESTED = ("0.4.1", "0.5.0", "0.6.0", "0.7.0")  # exact releases; dev snapshots are not these
_FS = "nvidia_resiliency_ext.checkpointing.async_ckpt.filesystem_async"
DIST = "nvidia-resiliency-ext"

_to_rewarm: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # queue -> rank
_warned: set = set()


def strategy() -> str:
    return config.env_choice(ENV, CHOICES, DEFAULT)


def inplace_tested(version: str | None) -> bool:
    return version in INPLACE_TESTED


def drops_in_place() -> bool:
    """Whether a release leaves pending saves alone (an in-place drop) rather than closing the queue:
    inplace/stage on an NVRx release the drop was tested on."""
    return strategy() in ("inplace", "stage") and inplace_tested(versions.installed_version(DIST))


def _warn_once(key: str, message: str, *args) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message, *args)


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


def release(queue, wait) -> str | None:
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
    if how in ("inplace", "stage"):
        version = versions.installed_version(DIST)
        if not drops_in_place():
            _warn_once("untested", "colo_shim: NVRx %s is not a release the inplace release was tested on (%s); "
                       "releasing checkpoint writers by restarting them", version, ", ".join(INPLACE_TESTED))
            state._totals["release_fallbacks"] += 1
        else:
            freed = _drop_in_place(caller, wait)
            problem = _mismatch(queue, caller, freed)
            if problem is None:
                clear_training_caches(keep_shm=True)
                return "inplace"
            _warn_once("mismatch", "colo_shim: the checkpoint writer's in-place drop %s; restarting the "
                       "writer instead (COLO_SHIM_NVRX_RELEASE=restart avoids the attempt)", problem)
            state._totals["release_fallbacks"] += 1
    _to_rewarm[queue] = caller.rank
    queue.close()
    return "restart"


def _mismatch(queue, caller, freed: list) -> str | None:
    """What the drop should have freed, given what this queue's worker was sent; None when it did."""
    if not freed[worker.RAN]:
        return "did not run in the worker"
    has_cache = hasattr(type(caller), "_worker_data_cache")
    if has_cache and not freed[worker.FOUND]:
        return "found no worker data cache (NVRx internals changed)"
    sent = len(state._cached_keys.get(queue, ()))
    if sent and freed[worker.ENTRIES] < 1:
        return f"freed no cached entry although {sent} cache key(s) were sent with data"
    return None


def _drop_in_place(caller, wait) -> list:
    """Send the drop request and wait for its marker; never consume or strand a real completion."""
    torch = sys.modules["torch"]
    core = sys.modules[type(caller).__module__]
    report = torch.zeros(worker.SLOTS, dtype=torch.int64).share_memory_()
    fields = core.AsyncRequest._fields
    values = dict(async_fn=worker.drop_cached_tensors, async_fn_args=(report,), finalize_fns=[],
                  async_fn_kwargs={}, preload_fn=None, call_idx=worker.MARKER)
    caller.queue.put(core.AsyncRequest(**{k: v for k, v in values.items() if k in fields}))
    state._owed[caller] = state._owed.get(caller, 0) + 1  # until the marker is read, by us or later
    while True:
        try:
            got = caller.comp_q.get(timeout=0.05)
        except _queue.Empty:
            got = None
        if got == worker.MARKER:
            state._owed[caller] -= 1
            return report.tolist()
        if got is not None:  # a real save finished: it is the host's, hand it back untouched
            state.hand_back(caller, got)
        if not caller.process.is_alive():
            raise state.CheckpointWorkerDied(
                f"colo_shim fence: rank {state.rank()}: checkpoint worker died while releasing its cache")
        wait.tick(None, "its checkpoint writer to drop its cache", where=f"worker pid {caller.process.pid}")


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
