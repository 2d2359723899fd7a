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
import sys
import time
from dataclasses import dataclass, field

from colo_shim.fence.state import (
    TIMEOUT_ENV, CheckpointWorkerDied, FenceTimeout, _cuda_sent, _totals, describe, live_queues, pending, rank,
)

log = logging.getLogger("colo_shim.nvrx")
DEFAULT_TIMEOUT = 600.0


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
    from colo_shim.core import config

    return config.env_float(TIMEOUT_ENV, DEFAULT_TIMEOUT)


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
        from colo_shim.fence import release

        for queue in [q for q in busy if q in _cuda_sent]:
            try:
                how = release.release(queue, deadline)
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
            release.collect_cuda()
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
    from colo_shim.fence import release

    return release.rewarm(reason)


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
