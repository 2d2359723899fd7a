"""colo_shim.fence(): finish every pending async checkpoint save, then let go of offloaded storage.

Colocated RL replaces training storage (offload, reload) between saves. An async save still in
flight, or a persistent NVRx writer that cached CUDA IPC handles, keeps the old storage alive
(held GPU memory) or writes stale values. The fence runs first in every entry point that replaces
storage (families `megatron`, `nvrx`) and can be called by hand.

Queues are found without framework config: instances tracked by the family wrappers (NVRx 0.4.1
has no instance tracker, megatron-core's own queue never had one), NVRx's own tracker where it
exists, megatron.training.async_utils' singleton and Megatron-Bridge GlobalState objects. Whether
a writer must be released is decided from what it was actually sent (CUDA tensors or not).

Finalizing is collective in these stacks because all ranks offload together, but a fence with
nothing pending must do no collective at all: that is what keeps it at microseconds. Waiting is a
bounded poll so a stuck rank raises FenceTimeout naming itself and the queue instead of hanging.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import weakref
from dataclasses import dataclass, field

log = logging.getLogger("colo_shim.nvrx")

TIMEOUT_ENV = "COLO_SHIM_FENCE_TIMEOUT"
DEFAULT_TIMEOUT = 600.0
_NVRX_CORE = "nvidia_resiliency_ext.checkpointing.async_ckpt.core"
_MEGATRON_SINGLETON = "megatron.training.async_utils"

_queues: "weakref.WeakSet" = weakref.WeakSet()  # every AsyncCallsQueue built while the shim is on
_holders: "weakref.WeakSet" = weakref.WeakSet()  # objects owning `_async_calls_queue` (Bridge state)
_cuda_sent: "weakref.WeakSet" = weakref.WeakSet()  # queues whose worker received CUDA tensors
_totals = {"fences": 0, "idle": 0, "finalized": 0, "released": 0, "timeouts": 0}


class FenceTimeout(RuntimeError):
    """A rank waited longer than COLO_SHIM_FENCE_TIMEOUT for its checkpoint writer."""


class CheckpointWorkerDied(RuntimeError):
    """The persistent checkpoint worker exited with a save still pending."""


@dataclass
class FenceReport:
    reason: str = ""
    calls_finalized: int = 0
    queues: int = 0
    released: list = field(default_factory=list)
    bytes_released: int | None = 0
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return dict(reason=self.reason, calls_finalized=self.calls_finalized, queues=self.queues,
                    released=list(self.released), bytes_released=self.bytes_released, seconds=self.seconds)


def track_queue(queue) -> None:
    _queues.add(queue)


def track_holder(holder) -> None:
    _holders.add(holder)


def note_cuda_sent(queue) -> None:
    _cuda_sent.add(queue)


def totals() -> dict:
    return dict(_totals, tracked_queues=len(_queues), holding_cuda=len(_cuda_sent))


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


def _worker_dead(queue) -> bool:
    caller = getattr(queue, "persistent_caller", None)
    proc = getattr(caller, "process", None)
    if proc is None or proc.is_alive():
        return False
    return getattr(caller, "cur_item", None) is None and caller.comp_q.empty()


def _finalize(queue, deadline: float | None, timeout: float) -> int:
    """Finish this queue's pending saves; checkpoint-write errors propagate unchanged."""
    done, delay = 0, 0.0002
    while True:
        done += len(queue.maybe_finalize_async_calls(blocking=False, no_dist=True))
        if not pending(queue):
            return done
        if _worker_dead(queue):
            done += len(queue.maybe_finalize_async_calls(blocking=False, no_dist=True))
            if not pending(queue):
                return done
            raise CheckpointWorkerDied(f"colo_shim fence: rank {rank()}: checkpoint worker exited with a "
                                       f"save pending on {describe(queue)}")
        if deadline is not None and time.monotonic() > deadline:
            _totals["timeouts"] += 1
            raise FenceTimeout(f"colo_shim fence: rank {rank()} waited more than {timeout:g}s "
                               f"({TIMEOUT_ENV}) for {describe(queue)}")
        time.sleep(delay)
        delay = min(delay * 2, 0.02)


def _timeout() -> float:
    from colo_shim import _config

    return _config.env_float(TIMEOUT_ENV, DEFAULT_TIMEOUT)


def _free_bytes():
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            return torch.cuda.mem_get_info()[0]
    except Exception:
        pass
    return None


def fence(reason: str = "") -> FenceReport:
    """Finalize every pending async save on every live queue, then release cached CUDA tensors."""
    start = time.perf_counter()
    _totals["fences"] += 1
    queues = live_queues()
    busy = [q for q in queues if q in _cuda_sent or pending(q)]
    if not busy:
        _totals["idle"] += 1
        return FenceReport(reason, 0, len(queues), [], 0, time.perf_counter() - start)
    report = FenceReport(reason, 0, len(queues))
    free_before = _free_bytes()
    timeout = _timeout()
    deadline = time.monotonic() + timeout if timeout > 0 else None
    for queue in busy:
        if pending(queue):
            report.calls_finalized += _finalize(queue, deadline, timeout)
    if any(q in _cuda_sent for q in busy):
        from colo_shim import nvrx_release

        for queue in [q for q in busy if q in _cuda_sent]:
            try:
                how = nvrx_release.release(queue, deadline)
            except (FenceTimeout, CheckpointWorkerDied):
                raise
            except Exception as exc:  # our own release logic must never break the job
                log.warning("colo_shim: release of %s failed, memory may stay held: %s: %s",
                            describe(queue), type(exc).__name__, exc)
                continue
            _cuda_sent.discard(queue)  # released, or the strategy says leave it (none / not NVRx)
            if how:
                report.released.append(how)
        if report.released:
            nvrx_release.collect_cuda()
    free_after = _free_bytes()
    report.bytes_released = (free_after - free_before) if free_before is not None and free_after else None
    report.seconds = time.perf_counter() - start
    _totals["finalized"] += report.calls_finalized
    _totals["released"] += len(report.released)
    log.info("colo_shim fence(%s): finalized %d, released %s, %s bytes, %.3fs", reason, report.calls_finalized,
             report.released or "nothing", report.bytes_released, report.seconds)
    return report


def rewarm(reason: str = "") -> int:
    """After storage came back: start writers released by the `restart` strategy (non-blocking)."""
    from colo_shim import nvrx_release

    return nvrx_release.rewarm(reason)


def guarded(reason: str) -> None:
    """fence() for wrappers: write errors, dead workers and timeouts surface, shim bugs only log."""
    try:
        fence(reason)
    except (FenceTimeout, CheckpointWorkerDied):
        raise
    except Exception as exc:
        if _is_checkpoint_error(exc):
            raise
        log.warning("colo_shim: fence before %s failed: %s: %s", reason, type(exc).__name__, exc)


def _is_checkpoint_error(exc: BaseException) -> bool:
    """Errors from finalize functions (checkpoint writes) belong to the caller."""
    tb = exc.__traceback__
    while tb is not None:
        if "execute_finalize_fns" in tb.tb_frame.f_code.co_name or tb.tb_frame.f_code.co_name == "_finalize":
            return True
        tb = tb.tb_next
    return False
