"""What the fence knows between calls: the live checkpoint queues, which were sent CUDA tensors,
which saves are being copied to host right now.

Kept apart from the fence itself because three places feed it (the NVRx constructor and
schedule wrappers, the megatron-core and Megatron-Bridge constructors) and the release
strategies read it; none of them needs the fence's waiting logic. NVRx 0.4.1 and megatron-core's
own queue have no instance tracker, so construction is observed here. Weak sets: a queue the job
dropped must not be kept alive by the shim.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import weakref

from colo_shim.core import config, ledger

TIMEOUT_ENV = config.FENCE_TIMEOUT
_NVRX_CORE = "nvidia_resiliency_ext.checkpointing.async_ckpt.core"
_MEGATRON_SINGLETON = "megatron.training.async_utils"

_queues: "weakref.WeakSet" = weakref.WeakSet()  # every AsyncCallsQueue built while the shim is on
_holders: "weakref.WeakSet" = weakref.WeakSet()  # objects owning `_async_calls_queue` (Bridge state)
_cuda_sent: "weakref.WeakSet" = weakref.WeakSet()  # queues whose worker received CUDA tensors
_cpu_only: "weakref.WeakSet" = weakref.WeakSet()  # NVRx queues whose saves hold only snapshotted host data
_cached_keys: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # queue -> cache keys sent with data
_inflight: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # queue -> deque of bytes per save
_owed: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # caller -> drop markers still to come
_handed_back: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # caller -> completions we read


class _FinalizeLock:
    """One finalizer at a time per process: NVRx's finalize pops the head call and reads comp_q
    without a lock, so the fence and a host thread finalizing concurrently could both take the
    same call. Re-entrant, because a save's finalize function may itself offload (and fence) on
    the finalizing thread; `held_here()` tells the fence it runs inside such a finalize, where
    finalizing later saves would complete them before the one still running (issue 16 item 5)."""

    def __init__(self):
        self._lock = threading.RLock()
        self._owner, self._depth = None, 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if not self._lock.acquire(blocking, timeout):
            return False
        self._owner, self._depth = threading.get_ident(), self._depth + 1
        return True

    def release(self) -> None:
        self._depth -= 1
        if not self._depth:
            self._owner = None
        self._lock.release()

    __enter__ = acquire

    def __exit__(self, *exc) -> None:
        self.release()

    def held_here(self) -> bool:
        return self._owner == threading.get_ident()


lock = _FinalizeLock()
# fence_s / fence_max_s: how long fences held the job up, the figure that tells whether a save
# stayed async across an offload (a fence that leaves a host-only save writing costs microseconds).
_totals = {"fences": 0, "idle": 0, "finalized": 0, "released": 0, "timeouts": 0, "skipped_host_only": 0,
           "release_fallbacks": 0, "fence_s": 0.0, "fence_max_s": 0.0}


class FenceTimeout(RuntimeError):
    """A rank waited longer than COLO_SHIM_FENCE_TIMEOUT for its checkpoint writer."""


class CheckpointWorkerDied(RuntimeError):
    """The persistent checkpoint worker exited with a save still pending."""

_copying: dict = {}  # thread ident -> saves being scheduled there (their device-to-host copy runs)
snapshot_wrapper_ran = False  # colo-shim's NVRx 0.6.0 wrapper cloned a save's host tensors in this process
_FS = "nvidia_resiliency_ext.checkpointing.async_ckpt.filesystem_async"
sent_ptrs: dict = {}  # NVRx cache key -> storage pointers of the CUDA tensors last sent under it
key_bytes: dict = {}  # NVRx cache key -> bytes last sent with it (a reusing save sends none)


def track_queue(queue) -> None:
    _queues.add(queue)


def track_holder(holder) -> None:
    _holders.add(holder)


def note_cuda_sent(queue) -> None:
    _cuda_sent.add(queue)
    _cpu_only.discard(queue)


def note_save(queue, nbytes: int, keys=(), cpu_only: bool = False) -> None:
    """One scheduled save: its bytes (for the wait warning) and the cache keys it sent data under.

    Its host copies stay allocated after the write (torch's pinned allocator in the writer keeps its
    blocks; NVRx 0.7 caches its shared-memory snapshots), so the node's ledger counts the largest save
    against the offload mirrors' budget (offload/budget.py)."""
    _inflight.setdefault(queue, collections.deque(maxlen=64)).append(int(nbytes))
    ledger.note("writer", max(ledger.mine("writer"), int(nbytes)))
    if keys:
        _cached_keys.setdefault(queue, set()).update(keys)
    if cpu_only and queue not in _cuda_sent:
        _cpu_only.add(queue)
    else:
        _cpu_only.discard(queue)


def copying(delta: int) -> None:
    """A save's schedule (its device-to-host copy) starts (+1) or ends (-1) on this thread."""
    me = threading.get_ident()
    left = _copying.get(me, 0) + delta
    if left > 0:
        _copying[me] = left
    else:
        _copying.pop(me, None)


def copying_elsewhere() -> bool:
    me = threading.get_ident()
    return any(ident != me for ident in list(_copying))


def host_snapshotted() -> bool:
    """Whether a save's host tensors were copied at schedule time (NVRx 0.7.0 itself, 0.6.0 by
    colo-shim): then a write in flight reads nothing the job still changes."""
    writer = getattr(sys.modules.get(_FS), "FileSystemWriterAsync", None)
    return hasattr(writer, "_cached_tensor_data_ptrs") or snapshot_wrapper_ran


def note_left_writing(queue) -> None:
    """The writer let go of the GPU; its pending saves read only host copies until they finish."""
    _cpu_only.add(queue)


def must_wait(queue) -> bool:
    """Whether the fence has to finish this queue: its writer may hold GPU memory, or we cannot tell."""
    return queue in _cuda_sent or (pending(queue) > 0 and queue not in _cpu_only)


def bytes_in_flight(queue) -> int:
    sizes = list(_inflight.get(queue, ()))
    n = pending(queue)
    return sum(sizes[-n:]) if n else 0


def hand_back(caller, completion) -> None:
    """A real save's completion read while waiting for our drop marker: NVRx gets it next."""
    _handed_back.setdefault(caller, collections.deque()).append(completion)


def forget_release(queue) -> None:
    _cuda_sent.discard(queue)
    _cached_keys.pop(queue, None)


def totals() -> dict:
    return dict(_totals, fence_s=round(_totals["fence_s"], 6), fence_max_s=round(_totals["fence_max_s"], 6),
                tracked_queues=len(_queues), holding_cuda=len(_cuda_sent), not_waited=len(_cpu_only))


def live_queues() -> list:
    found = {id(q): q for q in list(_queues)}
    core = sys.modules.get(_NVRX_CORE)
    cls = getattr(core, "AsyncCallsQueue", None)
    if cls is not None and hasattr(cls, "get_instances"):
        for q in cls.get_instances():
            found.setdefault(id(q), q)
    single = getattr(sys.modules.get(_MEGATRON_SINGLETON), "_async_calls_queue", None)
    if single is not None:
        found.setdefault(id(single), single)
    for holder in list(_holders):
        q = getattr(holder, "_async_calls_queue", None)
        if q is not None:
            found.setdefault(id(q), q)
    return list(found.values())


def pending(queue) -> int:
    calls = getattr(queue, "async_calls", None)
    return len(calls) if calls is not None else queue.get_num_unfinalized_calls()


def rank() -> int:
    dist = getattr(sys.modules.get("torch"), "distributed", None)
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist.get_rank()
    except Exception:
        pass
    return int(os.environ.get("RANK", "0"))


def describe(queue) -> str:
    caller = getattr(queue, "persistent_caller", None)
    proc = getattr(caller, "process", None)
    worker = f", worker pid {proc.pid}" if proc is not None else ""
    return (f"{type(queue).__module__}.{type(queue).__qualname__}@{id(queue):#x} "
            f"({pending(queue)} pending{worker})")
