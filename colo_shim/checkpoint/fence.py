"""colo_shim.fence(): make checkpoint writers let go of GPU storage before it is replaced.

Colocated RL replaces training storage (offload, reload) between saves. A persistent NVRx writer
that cached CUDA IPC handles keeps the old storage alive (held GPU memory) or writes stale values.
The fence runs first in every entry point that replaces storage (families `megatron`, `nvrx`) and
can be called by hand.

It does not wait for a write in flight (issue 22): when NVRx's `save` returns, its worker has
already copied every byte to host memory, so the writer drops its CUDA references through its side
door (release.py, door.py) and the write goes on. Saves in flight stay pending for the job's own
finalize. The fence waits only where it must: for a device-to-host copy still running on another
thread, for the writer's acknowledgement, and, in the fallbacks, for the write (a writer without
the door, an untested NVRx, NVRx < 0.6 whose host tensors are live). It never finalizes an NVRx
save: a finalize gathers across ranks, so a rank that finalized alone would leave that gather
unmatched; its only collective-free choices can differ between ranks. Queues colo-shim cannot
release (megatron-core's own) are still finalized here, without collectives, as before: their
pending count is the same on every rank.

A slow, healthy write must not kill the job: where the fence does wait, it waits as upstream's
blocking finalize does, warning every COLO_SHIM_FENCE_WARN_EVERY seconds (60) with the rank, the
queue and the bytes in flight; COLO_SHIM_FENCE_TIMEOUT > 0 opts into raising FenceTimeout instead.
A fence with nothing to release does no work and takes microseconds.

What it knows between calls, its totals and its errors (FenceTimeout, CheckpointWorkerDied) live in
state.py, because the wrappers and release.py/door.py need them without the fence's waiting; import
them from there. This module hands none of them on: one name, one home.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass, field

from colo_shim.checkpoint import release, state
from colo_shim.core import config, guard

log = logging.getLogger("colo_shim.nvrx")
DEFAULT_TIMEOUT = 0.0  # 0: wait as long as the write takes (upstream's blocking finalize does)
WARN_ENV = config.FENCE_WARN_EVERY
DEFAULT_WARN_EVERY = 60.0


@dataclass
class FenceReport:
    reason: str = ""
    calls_finalized: int = 0
    queues: int = 0
    released: list = field(default_factory=list)
    bytes_released: int | None = 0
    seconds: float = 0.0
    not_waited: int = 0  # queues with saves in flight that hold no GPU memory, left writing

    def as_dict(self) -> dict:
        return dict(reason=self.reason, calls_finalized=self.calls_finalized, queues=self.queues,
                    released=list(self.released), bytes_released=self.bytes_released, seconds=self.seconds,
                    not_waited=self.not_waited)


class Wait:
    """How long the fence waits and how it says so; clock and sleep are injectable for tests."""

    def __init__(self, timeout: float | None = None, warn_every: float | None = None, clock=None, sleep=None):
        self.timeout = config.env_float(state.TIMEOUT_ENV, DEFAULT_TIMEOUT) if timeout is None else timeout
        self.warn_every = config.env_float(WARN_ENV, DEFAULT_WARN_EVERY) if warn_every is None else warn_every
        self.clock = clock or time.monotonic
        self.sleep = sleep or time.sleep
        self.start = self.clock()
        self.deadline = self.start + self.timeout if self.timeout > 0 else None
        self._next_warning = self.start + self.warn_every if self.warn_every > 0 else None
        self._delay = 0.0002
        self.warnings = 0

    def tick(self, queue, what: str = "its checkpoint writer", where: str | None = None) -> None:
        """One poll interval: raise past the opt-in deadline, warn each interval, then sleep."""
        now = self.clock()
        where = where or state.describe(queue)
        if self.deadline is not None and now > self.deadline:
            state._totals["timeouts"] += 1
            raise state.FenceTimeout(f"colo_shim fence: rank {state.rank()} waited more than {self.timeout:g}s "
                                     f"({state.TIMEOUT_ENV}) for {what} on {where}")
        if self._next_warning is not None and now >= self._next_warning:
            self.warnings += 1
            self._next_warning = now + self.warn_every
            log.warning("colo_shim fence: rank %d still waiting after %.0fs for %s on %s, %d bytes in flight "
                        "(waiting as upstream does; set %s to fail instead)", state.rank(), now - self.start,
                        what, where, state.bytes_in_flight(queue) if queue is not None else 0, state.TIMEOUT_ENV)
        self.sleep(self._delay)
        self._delay = min(self._delay * 2, 0.02)


def _is_nvrx(queue) -> bool:
    return type(queue).__module__.startswith("nvidia_resiliency_ext") and hasattr(queue, "persistent_caller")


def _worker_dead(caller) -> bool:
    """A persistent worker that exited without reporting (a temporal one has no comp_q: not judged)."""
    proc, comp_q = getattr(caller, "process", None), getattr(caller, "comp_q", None)
    if proc is None or comp_q is None or proc.is_alive():
        return False
    return getattr(caller, "cur_item", None) is None and comp_q.empty()


def _acquire(wait: Wait, queue) -> None:
    while not state.lock.acquire(timeout=0.05):  # a host thread is finalizing: let it finish first
        wait.tick(queue, "a finalize running in another thread")


def _finalize(queue, wait: Wait) -> int:
    """Finish a queue colo-shim cannot release (megatron-core's own); write errors propagate."""
    done = 0
    _acquire(wait, queue)
    try:
        while True:
            done += len(queue.maybe_finalize_async_calls(blocking=False, no_dist=True))
            if not state.pending(queue):
                return done
            if _worker_dead(getattr(queue.async_calls[0], "async_caller", None)):
                raise state.CheckpointWorkerDied(f"colo_shim fence: rank {state.rank()}: checkpoint worker exited "
                                                 f"with a save pending on {state.describe(queue)}")
            wait.tick(queue)
    finally:
        state.lock.release()


def _free_bytes():
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            return torch.cuda.mem_get_info()[0]
    except Exception:
        pass
    return None


def fence(reason: str = "", *, wait: Wait | None = None) -> FenceReport:
    """Make every live writer that may hold GPU memory let go of it; saves in flight keep writing."""
    start = time.perf_counter()
    state._totals["fences"] += 1
    queues = state.live_queues()
    busy = [q for q in queues if state.must_wait(q)]
    skipped = sum(1 for q in queues if state.pending(q) and q not in busy)
    state._totals["skipped_host_only"] += skipped
    if not busy:
        state._totals["idle"] += 1
        return _timed(FenceReport(reason, 0, len(queues), [], 0, 0.0, skipped), start)
    report = FenceReport(reason, 0, len(queues), not_waited=skipped)
    free_before = _free_bytes()
    wait = wait or Wait()
    while state.copying_elsewhere():  # its device-to-host copy reads the storage about to go
        wait.tick(None, "a checkpoint copy to host on another thread", where="a save being scheduled")
    for queue in busy:
        if not _is_nvrx(queue):
            if state.pending(queue):
                if state.lock.held_here():  # inside a save's finalize: later saves must wait their turn
                    release.await_writes(queue, wait)
                else:
                    report.calls_finalized += _finalize(queue, wait)
            state.forget_release(queue)
            continue
        if queue in state._cuda_sent:
            how = _release(queue, wait, reason)
            if how:
                report.released.append(how)
        if state.pending(queue) and state.host_snapshotted():
            release.check_alive(queue, wait)  # a save left writing on a dead writer would hang the next finalize
            state.note_left_writing(queue)
            report.not_waited += 1
        elif state.pending(queue):
            release.await_writes(queue, wait)  # NVRx < 0.6: the write reads live host tensors
    if report.released:
        release.collect_cuda()
    free_after = _free_bytes()
    report.bytes_released = (free_after - free_before) if free_before is not None and free_after else None
    _timed(report, start)
    state._totals["finalized"] += report.calls_finalized
    state._totals["released"] += len(report.released)
    log.info("colo_shim fence(%s): finalized %d, released %s, %s bytes, %d left writing, %.3fs", reason,
             report.calls_finalized, report.released or "nothing", report.bytes_released, report.not_waited,
             report.seconds)
    return report


def _release(queue, wait: Wait, reason: str) -> str | None:
    how = guard.step("nvrx: release of a checkpoint writer", release.release, queue, wait, default=_FAILED,
                     passthrough=(state.FenceTimeout, state.CheckpointWorkerDied))
    if how is _FAILED:  # memory may stay held; the next fence tries again
        return None
    state.forget_release(queue)  # released, or the strategy says leave it (none)
    return how


_FAILED = object()


def _timed(report: FenceReport, start: float) -> FenceReport:
    report.seconds = time.perf_counter() - start
    state._totals["fence_s"] += report.seconds
    state._totals["fence_max_s"] = max(state._totals["fence_max_s"], report.seconds)
    return report


def rewarm(reason: str = "") -> int:
    """After storage came back: start writers released by the `restart` strategy (non-blocking)."""
    return release.rewarm(reason)


def guarded(reason: str) -> None:
    """fence() for wrappers that run it before upstream's call: the job's errors surface (a write
    that failed in a finalize the fence ran, a dead worker, the opt-in timeout); shim bugs only log."""
    guard.step(f"megatron: fence before {reason}", fence, reason, passthrough=job_error)


def job_error(exc: BaseException) -> bool:
    """Whether an error is the job's own rather than colo-shim's: it comes from an upstream finalize
    (a checkpoint write that failed), or says the writer died or the opt-in deadline passed."""
    if isinstance(exc, (state.FenceTimeout, state.CheckpointWorkerDied)):
        return True
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name in _UPSTREAM_FINALIZE and not code.co_filename.startswith(_OURS):
            return True
        tb = tb.tb_next
    return False


_UPSTREAM_FINALIZE = ("maybe_finalize_async_calls", "execute_finalize_fns")
_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
