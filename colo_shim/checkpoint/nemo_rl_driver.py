"""NeMo-RL main's driver: its background wait for a checkpoint write must not occupy the policy actors.

CONTRACT (what the driver-side classes must look like, and what is read):
- `nemo_rl.models.policy.lm_policy:Policy.finalize_async_save(self)`: main's `wait_fn`, called by the
  checkpointer's background thread (`CheckpointManager.begin_finalization`). It sends
  `finalize_async_save` to every worker of `self.worker_group` (`run_all_workers_single_data`) and
  `ray.get`s the answers. `self.worker_group.workers` are the workers' Ray actor handles.
- Before main's method, every worker is asked, through Ray's `ActorHandle.__ray_call__` (an actor
  task that runs a function with the actor instance), whether its writes are written (`written`: no
  collective, nothing finalized); the question is asked again every POLL_S seconds while one is still
  writing. Then main's method runs as it is: its remote finalize, with its collectives, finds the
  write done.
- `written` says None (cannot tell) when the actor does not release (colo-shim's `megatron` and
  `nvrx` families off there, or release.skips_upstream_finalize() false there, as in
  nemo_rl_main.py), when a queue holds more than one unfinalized save, or when a writer has exited
  without reporting: the asking stops and main's method runs at once, waiting as it would without
  colo-shim. Asking fails (an actor died, no `__ray_call__`): the same, through core/guard.py.
- `nemo_rl.distributed.worker_groups:RayWorkerGroup.run_all_workers_{single,multiple,sharded}_data`:
  one lock per process around the sending (these methods return futures; nothing is waited for
  under the lock), so a send to all workers from one thread is never interleaved with another
  thread's.

WHY (measured on main 7ea279abf's own GRPO on an H100, bench/nemo_rl): main's policy workers are
plain Ray actors, which run one call at a time. The checkpointer thread's `finalize_async_save`
reaches the actor right after the save and blocks it until the write is on disk (~13 s for the 1B
model and its optimizer); the next step's `offload_before_refit` queues behind it, so the write is
paid inside `prepare_for_generation` (14.7 s of a 25.3 s step) although colo-shim's offload needs no
finalize. Asked first, the actor is busy only for the probes (milliseconds), and the write overlaps
the refit, generation and logprobs. The deferred finalize then lands among the loop's calls; its
collectives must meet the same call on every rank, and Ray keeps only the submission order of one
caller: the lock makes every send to all ranks atomic, so each actor sees the two threads' calls in
one order.
"""

from __future__ import annotations

import queue as _queue
import threading
import time

from colo_shim.checkpoint import nvrx, release, state
from colo_shim.core import guard

POLL_S = 0.2
SEND_METHODS = ("run_all_workers_single_data", "run_all_workers_multiple_data", "run_all_workers_sharded_data")
_stats = {"asked": 0, "written_first": 0, "could_not_tell": 0, "polls": 0, "sends_waited": 0}


def wait_off_actor(wrapped, instance, args, kwargs):
    """Main's wait_fn, once every worker says its write is written (or cannot tell)."""
    guard.step("megatron: NeMo-RL ask the policy workers whether the write is done", _await_written, instance)
    return wrapped(*args, **kwargs)


def _await_written(policy) -> None:
    """Only the actors decide whether they release: the driver may run in another environment (NeMo-RL
    builds per-actor venvs), without NVRx."""
    import ray

    left = list(policy.worker_group.workers)
    _stats["asked"] += 1
    while left:
        answers = ray.get([w.__ray_call__.remote(written) for w in left])
        _stats["polls"] += 1
        if any(a is None for a in answers):
            _stats["could_not_tell"] += 1
            return
        left = [w for w, done in zip(left, answers) if not done]
        if left:
            time.sleep(POLL_S)
    _stats["written_first"] += 1


def written(_worker=None):
    """In the actor: True when no save of this process is still writing, False while one is, None when
    colo-shim cannot tell. Reads a completion the way NVRx's own non-blocking check does (into the
    caller's `cur_item`, where NVRx's next finalize looks first); finalizes nothing."""
    from colo_shim.core import registry

    if not (registry.enabled("megatron") and registry.enabled("nvrx") and release.skips_upstream_finalize()):
        return None
    with state.lock:
        answer = True
        for q in state.live_queues():
            pending = state.pending(q)
            if pending > 1:
                return None
            if pending and answer:
                answer = _one_written(q)
        return answer


def _one_written(queue):
    caller = getattr(queue, "persistent_caller", None)
    if caller is None or not hasattr(caller, "comp_q"):  # a process per save: written once it exited
        procs = [getattr(getattr(c, "async_caller", None), "process", None) for c in queue.async_calls]
        return not any(p is not None and p.is_alive() for p in procs)
    if not nvrx._settle(caller, False):
        return False  # a drop marker of colo-shim's release is still ahead of the completion
    if caller.cur_item is None:
        alive = caller.process is not None and caller.process.is_alive()  # read before the queue
        try:
            caller.cur_item = caller.comp_q.get_nowait()
        except _queue.Empty:
            return False if alive else None
    return True


class _Sends:
    """The per-process lock around sends to all workers; `waiting` counts sends held up right now."""

    def __init__(self):
        self._lock = threading.RLock()
        self.waiting = 0

    def __enter__(self):
        if not self._lock.acquire(blocking=False):
            self.waiting += 1
            _stats["sends_waited"] += 1
            self._lock.acquire()
            self.waiting -= 1

    def __exit__(self, *exc) -> None:
        self._lock.release()


SENDS = _Sends()


def atomic_send(wrapped, instance, args, kwargs):
    with SENDS:
        return wrapped(*args, **kwargs)


def report() -> dict:
    return {"nemo_rl_driver": dict(_stats)}
