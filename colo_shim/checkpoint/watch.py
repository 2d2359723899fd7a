"""A dead NVRx checkpoint worker ends a save with a clear error or is replaced; never waited on.

NVRx 0.4.1-0.7.0 never checks its worker's liveness where the trainer waits on it (a save in
`preload_q.join()` until the copy to host is done, a blocking finalize on the completion queue, close()
on the worker's queue), so a worker that died (killed, out of memory, a "Worker cache miss") hangs the
job. Before a save or a finalize, a worker that exited is replaced: the saves it reported stay for the
job's finalize, the rest are dropped, never finalized (a lost save must not look finished), and the
next blocking finalize, the job's word that its saves are complete, raises CheckpointWorkerDied naming
them (NeMo-RL main renames tmp_step_N right after it returns); NVRx's own `_get_async_caller` builds a fresh caller (new queues: the old ones may hold an unread request and task
counts that would hang close); trainer-side caches are cleared so that the next save re-sends. While a
save is scheduled, a thread waits on the worker's exit; then `task_done()` from the trainer's side ends
`join()` and the save raises CheckpointWorkerDied. A save planned to reuse data the dead worker cached
(NVRx >= 0.6) raises unsent: a fresh worker could not write it.
"""

from __future__ import annotations

import contextlib
import logging
import queue as _queue
import signal
import threading
import weakref
from multiprocessing import connection

from colo_shim.checkpoint import release, state, worker

log = logging.getLogger("colo_shim.nvrx")
_POLL = 0.05
totals = {"worker_deaths": 0, "saves_lost": 0, "last_worker_death": None}  # the nvrx row of status()
_fresh: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # queue -> why its worker was replaced
_lost: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # queue -> (lost call indices, why)


def _completions(caller) -> set:
    """Call indices the dead worker reported; colo-shim's own drop markers are not saves."""
    done = {caller.cur_item, *state._handed_back.pop(caller, ())}
    state._owed.pop(caller, None)
    with contextlib.suppress(_queue.Empty, OSError, ValueError):
        while True:
            done.add(caller.comp_q.get_nowait())
    return done - {worker.MARKER, None}


def _replace(queue, caller, proc, when: str) -> str:
    """Drop the dead worker's unreported saves and give the queue a fresh caller; the message."""
    owned = state.lock.acquire(timeout=30.0)  # a finalize holding it longer is itself stuck: its calls stay
    try:
        calls = getattr(queue, "async_calls", None) or []
        done = _completions(caller) if owned else set()
        lost = [c.idx for c in calls if c.async_caller is caller and c.idx not in done]
        if owned:
            kept = [c for c in calls if c.async_caller is not caller or c.idx in done]
            calls.clear()
            calls.extend(kept)
        caller.process, caller.cur_item = None, None  # its reported saves finalize without a worker
        caller.close = lambda *_a, **_k: None  # nothing left to close; its __del__ would (via our close
        # wrapper) clear the training caches at any moment, even inside NVRx's planning of a save
        for old in (caller.queue, caller.preload_q):
            with contextlib.suppress(Exception):
                old.cancel_join_thread()  # an unread request must not block this process's exit
                old.close()
        queue.persistent_caller = None
        queue._get_async_caller()  # NVRx's own constructor; close() still finalizes the reported saves
    finally:
        if owned:
            state.lock.release()
    release.clear_training_caches(keep_shm=True)  # NVRx's shm drain may run this mid-planning, buffers in use
    state.forget_release(queue)
    code = proc.exitcode
    if isinstance(code, int) and -code in signal.valid_signals():
        code = f"{code} ({signal.Signals(-code).name})"
    totals["worker_deaths"] += 1
    totals["saves_lost"] += len(lost)
    lost_text = (f"unfinished save(s) {lost} lost, never finalized (no checkpoint of theirs is marked complete)"
                 if lost else "no unfinished save lost") + ("" if owned else " (another thread was finalizing)")
    totals["last_worker_death"] = _fresh[queue] = message = (
        f"colo_shim: rank {state.rank()}: NVRx checkpoint worker pid {proc.pid} exited with code {code} {when}; "
        f"{lost_text}; a fresh worker starts at the next save")
    if lost:
        _lost[queue] = (_lost.get(queue, ((), ""))[0] + tuple(lost), message)
    log.log(logging.ERROR if lost else logging.WARNING, "%s", message)
    return message


def raise_lost(queue) -> None:
    """A blocking finalize is the job's word that every save it scheduled is complete (NeMo-RL main
    renames tmp_step_N right after it): saves lost since the last one make it raise, once."""
    lost, why = _lost.pop(queue, ((), ""))
    if lost:
        raise state.CheckpointWorkerDied(f"{why}. This finalize cannot report save(s) {list(lost)} complete: they "
                                         f"were not written completely and their directories must not be used")


def replace_dead(queue, when: str = "before a finalize", dead: tuple = ()):
    """A persistent worker found dead (or `dead`: caller, process) is replaced; the message, or None."""
    try:
        caller, proc = dead or (queue.persistent_caller, getattr(queue.persistent_caller, "process", None))
        if dead:
            proc.join(timeout=5)  # its exit was seen: reap it, so that its exit code is known
        if getattr(queue, "persistent", False) and proc is not None and proc.exitcode is not None:
            return _replace(queue, caller, proc, when)
    except Exception as exc:
        log.warning("colo_shim: dead checkpoint worker check skipped: %s: %s", type(exc).__name__, exc)
    return f"colo_shim: rank {state.rank()}: NVRx checkpoint worker pid {dead[1].pid} died {when}" if dead else None


class _Watcher(threading.Thread):
    """Waits on the worker's exit while a save is scheduled; releases `preload_q.join()` if it dies."""

    def __init__(self, queue):
        super().__init__(name="colo-shim-save-watch", daemon=True)
        self.queue, self.dead, self._done, self._lock = queue, None, threading.Event(), threading.Lock()

    def run(self) -> None:
        while not self._done.is_set():
            caller = getattr(self.queue, "persistent_caller", None)
            proc = getattr(caller, "process", None)
            try:
                exited = proc is not None and bool(connection.wait([proc.sentinel], timeout=_POLL))
            except (ValueError, OSError, AttributeError):  # not started yet, or closed
                exited = False
            if not exited:
                self._done.wait(_POLL if proc is None else 0)
                continue
            with self._lock:
                if self._done.is_set():
                    return
                self.dead = self.dead or (caller, proc)
                with contextlib.suppress(ValueError):  # raised once nothing is unfinished: join() returns
                    for _ in range(1024):
                        caller.preload_q.task_done()
            self._done.wait(_POLL / 2)  # the schedule may not have reached its put and join yet

    def stop(self):
        with self._lock:
            self._done.set()
            return self.dead


@contextlib.contextmanager
def scheduling(queue, reused=()):
    """Around NVRx's schedule: a dead worker is replaced first; a save that `reused` cache keys the
    replaced worker never saw raises unsent; a worker dying before the copy is done ends the save."""
    if not getattr(queue, "persistent", False):
        yield
        return
    replace_dead(queue, "before this save")
    if reused and queue in _fresh:
        raise state.CheckpointWorkerDied(f"{_fresh[queue]}. This save was planned to reuse data the dead worker "
                                         f"had cached ({len(reused)} NVRx cache key(s)), so it was not scheduled; "
                                         f"the next save re-sends its data")
    watcher = _Watcher(queue)
    watcher.start()
    try:
        yield
    finally:
        dead = watcher.stop()
        message = dead and replace_dead(queue, f"while save {queue.call_idx} was copied to host", dead)
    if message:
        _lost.pop(queue, None)  # told to the job here, not again at its next blocking finalize
        raise state.CheckpointWorkerDied(message)
    _fresh.pop(queue, None)  # the fresh worker has this save's data now


def await_completion(caller) -> None:
    """The blocking wait, ended by the completion or by the worker's exit, never by a clock.

    NVRx's own blocking wait polls comp_q for as long as it takes, also after the worker died; and
    once our drop markers are involved a dead worker would make the wait return as if done, so
    that the job (NeMo-RL main renames tmp_step_N right after) took an unwritten checkpoint for a
    finished one (issue 32 item 5). Both end here in CheckpointWorkerDied; the save stays
    unfinalized, and close() drops it (`forget_at_close`)."""
    while caller.cur_item is None:
        alive = caller.process.is_alive()  # read before the queue: a report sent just before exit is seen
        try:
            caller.cur_item = caller.comp_q.get(timeout=0.1)
        except _queue.Empty:
            if not alive:
                raise state.CheckpointWorkerDied(
                    f"colo_shim: rank {state.rank()}: checkpoint worker pid {caller.process.pid} exited (code "
                    f"{caller.process.exitcode}) before reporting a pending save: that checkpoint was not written "
                    "completely") from None


def forget_at_close(instance) -> None:
    """close() on a dead worker blocks forever (DONE + queue.join(), or a blocking finalize)."""
    caller = getattr(instance, "persistent_caller", instance)
    proc = getattr(caller, "process", None)
    if proc is None or not hasattr(proc, "is_alive") or proc.is_alive():
        return
    calls = getattr(instance, "async_calls", None)
    if calls:
        log.error("colo_shim: checkpoint worker pid %s is dead; dropping %d unfinished save(s) at close",
                  proc.pid, len(calls))
        calls.clear()
    if hasattr(caller, "queue"):
        proc.join(timeout=1)
        caller.process = None
