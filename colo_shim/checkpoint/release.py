"""How an NVRx writer lets go of the CUDA tensors it was sent (COLO_SHIM_NVRX_RELEASE).

- inplace (default): the writer drops its cached tensors through its side door (door.py) while a
  write in flight goes on from its host copies; nothing waits for the write, the worker stays warm
  and the next save re-sends its tensors. Where the door is not open or does not answer, or the
  NVRx release was not tested, the same drop goes down the worker's queue after the writes in
  flight (today's wait), with one warning naming the cause and a `colo-shim doctor` row.
- restart: the upstream-style release: after the writes in flight, the worker process ends (its
  CUDA context goes too) and a fresh one starts in the background once storage is back.
- none: nothing is released (memory stays pinned; for comparison).
- stage: a deprecated alias of inplace, with one warning. It staged GPU tensors through page-locked
  /dev/shm so the offload never waited for the write; once inplace stopped waiting too, stage only
  cost a checkpoint shard of host memory per rank (issue 22), so it was retired. The value stays
  valid so that job configs that name it keep running.

Nothing here finalizes a save: a finalize gathers across ranks, and a rank that consumed a save
another rank still has pending would leave that gather unmatched. Waiting for a write is local
(the worker's completion is read and handed back to NVRx's own finalize), so what one rank
decides here never changes the collectives any rank runs.
"""

from __future__ import annotations

import logging
import queue as _queue
import sys
import weakref

from colo_shim.core import config, versions
from colo_shim.checkpoint import door, state, worker

log = logging.getLogger("colo_shim.nvrx")

ENV = "COLO_SHIM_NVRX_RELEASE"
CHOICES = ("inplace", "restart", "none")
RETIRED = "stage"  # still a valid value: a deprecated alias of inplace
DEFAULT = "inplace"
INPLACE_TESTED = ("0.4.1", "0.5.0", "0.6.0", "0.7.0")  # exact releases; dev snapshots are not these
_FS = "nvidia_resiliency_ext.checkpointing.async_ckpt.filesystem_async"
DIST = "nvidia-resiliency-ext"

_to_rewarm: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # caller -> rank
_warned: set = set()
fallbacks: dict = {}  # cause -> count, for `colo-shim doctor`


def strategy() -> str:
    """The configured strategy; the retired `stage` runs as inplace, said once per process (not an
    error under COLO_SHIM_STRICT: it is a valid value, only deprecated)."""
    config.retired_knobs()
    how = config.env_choice(ENV, CHOICES, DEFAULT, deprecated=(RETIRED,))
    if how == RETIRED:
        config.deprecated(ENV, RETIRED)
        return DEFAULT
    return how


def inplace_tested(version: str | None) -> bool:
    return version in INPLACE_TESTED


def drops_in_place() -> bool:
    """Whether writers are released in place (worker kept warm): inplace on a tested NVRx release."""
    return strategy() == "inplace" and inplace_tested(versions.installed_version(DIST))


def skips_upstream_finalize() -> bool:
    """Whether an offload may leave a save writing instead of finalizing it (NeMo-RL main's offload
    finalize). A function of the environment and the installed NVRx only, so every rank of a job
    answers alike without a collective."""
    return strategy() == "inplace" and versions.installed_version(DIST) in ("0.6.0", "0.7.0")


def _warn_once(key: str, message: str, *args) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message, *args)


def _fell_back(cause: str, message: str, *args) -> None:
    fallbacks[cause] = fallbacks.get(cause, 0) + 1
    state._totals["release_fallbacks"] += 1
    _warn_once(cause, message, *args)


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
    """Release one queue's worker; returns what was done, None when nothing applies."""
    if not type(queue).__module__.startswith("nvidia_resiliency_ext"):
        return None
    how = strategy()
    if how == "none":
        return None
    caller = getattr(queue, "persistent_caller", None)
    proc = getattr(caller, "process", None)
    # Before anything reaches the worker, and so on every path out of here: the next cached save
    # re-sends its data. A worker that dropped its cache while the trainer kept its keys (a fence
    # that raised after the knock) would die on a cache miss and hang the next save (issue 32 item 1);
    # re-sending to a worker that kept its cache only overwrites the entry.
    clear_training_caches(keep_shm=True)
    if proc is None or not proc.is_alive():
        await_writes(queue, wait)  # raises when the dead worker took a pending save with it
        clear_training_caches(keep_shm=False)
        return "gone"
    if how == "inplace":
        version = versions.installed_version(DIST)
        if not drops_in_place():
            _fell_back("untested", "colo_shim: NVRx %s is not a release the inplace release was tested on (%s); "
                       "releasing checkpoint writers by restarting them after their writes", version,
                       ", ".join(INPLACE_TESTED))
        else:
            freed, how_done = _drop(queue, caller, wait)
            problem = _mismatch(queue, caller, freed)
            if problem is None:
                return how_done
            _fell_back("mismatch", "colo_shim: the checkpoint writer's in-place drop %s; restarting the writer "
                       "instead (COLO_SHIM_NVRX_RELEASE=restart avoids the attempt)", problem)
    await_writes(queue, wait)
    _to_rewarm[caller] = caller.rank
    caller.close()
    clear_training_caches(keep_shm=False)
    return "restart"


def _drop(queue, caller, wait) -> tuple:
    """Through the side door while writing; else, after the writes in flight, down the queue."""
    try:
        return door.knock(caller, wait), "inplace"
    except door.NoAnswer as exc:
        _fell_back("door", "colo_shim: %s; the offload waits for the checkpoint write in flight and releases "
                   "the writer through its queue (is colo_shim importable in the NVRx worker?)", exc)
    await_writes(queue, wait)
    return _drop_queued(caller, wait), "queued"


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
    if len(freed) > worker.REQ_CUDA and freed[worker.REQ_CUDA] > 0:
        return f"left {freed[worker.REQ_CUDA]} CUDA tensor(s) referenced by the worker's requests"
    return None


def check_alive(queue, wait) -> None:
    """Raise when a pending save's worker died before reporting it (its write is lost)."""
    for call in list(queue.async_calls):
        proc = getattr(call.async_caller, "process", None)
        if proc is not None and not proc.is_alive():
            await_writes(queue, wait)  # reads what the dead worker did report; raises for the rest
            return


def await_writes(queue, wait) -> None:
    """Wait until the worker wrote every pending save of `queue`, finalizing none: each completion
    read is handed back, so NVRx's own finalize (collective, on every rank) still sees it."""
    with state.lock:  # a host thread finalizing reads comp_q too
        for caller in {id(c.async_caller): c.async_caller for c in queue.async_calls}.values():
            owed = sum(1 for c in queue.async_calls if c.async_caller is caller)
            comp_q = getattr(caller, "comp_q", None)
            while comp_q is None and caller.process is not None and caller.process.is_alive():
                wait.tick(queue)  # a temporal worker: one write per process
            have = ((caller.cur_item is not None) + len(state._handed_back.get(caller, ()))
                    if comp_q is not None else owed)
            while have < owed:
                try:
                    got = comp_q.get(timeout=0.05)
                except _queue.Empty:
                    got = None
                if got == worker.MARKER and state._owed.get(caller, 0) > 0:
                    state._owed[caller] -= 1
                elif got is not None:
                    state.hand_back(caller, got)
                    have += 1
                elif caller.process is None:  # no worker: nothing to write on this rank, or ended by us
                    break
                elif not caller.process.is_alive():
                    raise state.CheckpointWorkerDied(f"colo_shim fence: rank {state.rank()}: checkpoint worker "
                                                     f"exited with a save pending on {state.describe(queue)}")
                else:
                    wait.tick(queue)


def _drop_queued(caller, wait) -> list:
    """Send the drop request down the worker's queue and wait for its marker; never consume or
    strand a real completion (the worker is idle by now: the writes in flight were awaited)."""
    torch = sys.modules["torch"]
    core = sys.modules[type(caller).__module__]
    report = torch.zeros(worker.SLOTS, dtype=torch.int64).share_memory_()
    fields = core.AsyncRequest._fields
    values = dict(async_fn=worker.drop_cached_tensors, async_fn_args=(report,), finalize_fns=[],
                  async_fn_kwargs={}, preload_fn=None, call_idx=worker.MARKER)
    with state.lock:
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
    for caller, rank in list(_to_rewarm.items()):
        _to_rewarm.pop(caller, None)
        start = getattr(caller, "_start_worker", None)
        if start is None or caller.process is not None or rank is None:
            continue
        try:
            start(rank)
            started += 1
        except Exception as exc:  # a cold next save is the fallback, never a failure
            log.warning("colo_shim: re-warm of checkpoint writer failed (%s): %s: %s", reason, type(exc).__name__, exc)
    if started:
        log.info("colo_shim: re-warming %d checkpoint writer(s) after %s", started, reason)
    return started
