"""colo_shim.fence(): finish the pending async saves that hold GPU memory, then make writers let go.

Colocated RL replaces training storage (offload, reload) between saves. An async save still in
flight, or a persistent NVRx writer that cached CUDA IPC handles, keeps the old storage alive
(held GPU memory) or writes stale values. The fence runs first in every entry point that replaces
storage (families `megatron`, `nvrx`) and can be called by hand.

Only writers that may hold GPU memory are waited for (issue 11): a save whose worker was sent no
CUDA tensors, on an NVRx version where the host tensors were snapshotted at schedule time, goes on
writing and completes through the job's own finalize. Everything the shim cannot inspect (other
queues, NVRx < 0.6, whose host tensors are live) is still finished here.

A slow, healthy write must not kill the job: by default the fence waits as upstream's blocking
finalize does, warning every COLO_SHIM_FENCE_WARN_EVERY seconds (60) with the rank, the queue and
the bytes in flight; COLO_SHIM_FENCE_TIMEOUT > 0 opts into raising FenceTimeout instead.

A fence with nothing to wait for does no collective and takes microseconds. Finalizing holds
state.lock, which the NVRx wrapper also takes around the host's own finalize calls: a host thread
(a background checkpoint finalizer) and the fence never finalize the same call or race on comp_q.
A fence run by a save's own finalize function (an offload called from it) finalizes nothing: it
waits for the later saves' writes and leaves their finalize to the loop already running, in order.
"""

from __future__ import annotations

import logging
import queue as _queue
import sys
import time
from dataclasses import dataclass, field

from colo_shim.checkpoint import state
from colo_shim.core import config
from colo_shim.checkpoint.state import (  # noqa: F401  (re-exported: the fence's public helpers)
    TIMEOUT_ENV, CheckpointWorkerDied, FenceTimeout, _totals, bytes_in_flight, describe, forget_release,
    live_queues, lock, must_wait, note_cuda_sent, pending, rank, totals, track_holder, track_queue,
)

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
        self.timeout = config.env_float(TIMEOUT_ENV, DEFAULT_TIMEOUT) if timeout is None else timeout
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
        where = where or describe(queue)
        if self.deadline is not None and now > self.deadline:
            _totals["timeouts"] += 1
            raise FenceTimeout(f"colo_shim fence: rank {rank()} waited more than {self.timeout:g}s "
                               f"({TIMEOUT_ENV}) for {what} on {where}")
        if self._next_warning is not None and now >= self._next_warning:
            self.warnings += 1
            self._next_warning = now + self.warn_every
            log.warning("colo_shim fence: rank %d still waiting after %.0fs for %s on %s, %d bytes in flight "
                        "(waiting as upstream does; set %s to fail instead)", rank(), now - self.start, what,
                        where, bytes_in_flight(queue) if queue is not None else 0, TIMEOUT_ENV)
        self.sleep(self._delay)
        self._delay = min(self._delay * 2, 0.02)


def _worker_dead(queue) -> bool:
    caller = getattr(queue, "persistent_caller", None)
    proc = getattr(caller, "process", None)
    if proc is None or proc.is_alive():
        return False
    return getattr(caller, "cur_item", None) is None and caller.comp_q.empty()


def _acquire(wait: Wait, queue) -> None:
    while not lock.acquire(timeout=0.05):  # a host thread is finalizing: let it finish first
        wait.tick(queue, "a finalize running in another thread")


def _finalize(queue, wait: Wait) -> int:
    """Finish this queue's pending saves; checkpoint-write errors propagate unchanged."""
    done = 0
    _acquire(wait, queue)
    try:
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
            wait.tick(queue)
    finally:
        lock.release()


def _await_writes(queue, wait: Wait) -> None:
    """Wait until the worker wrote every pending save, finalizing none: the finalize running on this
    thread, then NVRx's own loop, finalize them in order. Completions read are handed back."""
    from colo_shim.checkpoint import worker

    for caller in {id(c.async_caller): c.async_caller for c in queue.async_calls}.values():
        owed = sum(1 for c in queue.async_calls if c.async_caller is caller)
        comp_q = getattr(caller, "comp_q", None)
        while comp_q is None and caller.process is not None and caller.process.is_alive():
            wait.tick(queue)  # a temporal worker: one write per process
        have = (caller.cur_item is not None) + len(state._handed_back.get(caller, ())) if comp_q is not None else owed
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
            elif _worker_dead(queue):
                raise CheckpointWorkerDied(f"colo_shim fence: rank {rank()}: checkpoint worker exited with a "
                                           f"save pending on {describe(queue)}")
            else:
                wait.tick(queue)


def _free_bytes():
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            return torch.cuda.mem_get_info()[0]
    except Exception:
        pass
    return None


def fence(reason: str = "", *, wait: Wait | None = None) -> FenceReport:
    """Finish pending saves that may hold GPU memory on every live queue, then release those writers."""
    start = time.perf_counter()
    _totals["fences"] += 1
    queues = live_queues()
    busy = [q for q in queues if must_wait(q)]
    skipped = sum(1 for q in queues if pending(q) and q not in busy)
    _totals["skipped_host_only"] += skipped
    if not busy:
        _totals["idle"] += 1
        return _timed(FenceReport(reason, 0, len(queues), [], 0, 0.0, skipped), start)
    report = FenceReport(reason, 0, len(queues), not_waited=skipped)
    free_before = _free_bytes()
    wait = wait or Wait()
    nested = lock.held_here()  # inside a save's finalize function: later saves must wait their turn
    for queue in busy:
        if pending(queue):
            if nested:
                _await_writes(queue, wait)
            else:
                report.calls_finalized += _finalize(queue, wait)
    holding = [q for q in busy if q in state._cuda_sent]
    if holding:
        from colo_shim.checkpoint import release

        for queue in holding:
            if nested and pending(queue) and not release.drops_in_place():
                log.warning("colo_shim fence(%s) inside a checkpoint finalize: the %s release would finalize "
                            "later saves first; left to the next fence", reason, release.strategy())
                continue
            try:
                how = release.release(queue, wait)
            except (FenceTimeout, CheckpointWorkerDied):
                raise
            except Exception as exc:  # our own release logic must never break the job
                log.warning("colo_shim: release of %s failed, memory may stay held: %s: %s",
                            describe(queue), type(exc).__name__, exc)
                continue
            forget_release(queue)  # released, or the strategy says leave it (none / not NVRx)
            if how:
                report.released.append(how)
        if report.released:
            release.collect_cuda()
    free_after = _free_bytes()
    report.bytes_released = (free_after - free_before) if free_before is not None and free_after else None
    _timed(report, start)
    _totals["finalized"] += report.calls_finalized
    _totals["released"] += len(report.released)
    log.info("colo_shim fence(%s): finalized %d, released %s, %s bytes, %d left writing, %.3fs", reason,
             report.calls_finalized, report.released or "nothing", report.bytes_released, skipped, report.seconds)
    return report


def _timed(report: FenceReport, start: float) -> FenceReport:
    report.seconds = time.perf_counter() - start
    _totals["fence_s"] += report.seconds
    _totals["fence_max_s"] = max(_totals["fence_max_s"], report.seconds)
    return report


def rewarm(reason: str = "") -> int:
    """After storage came back: start writers released by the `restart` strategy (non-blocking)."""
    from colo_shim.checkpoint import release

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
