"""Mirrors made ahead of the offload that needs them, in background threads (issue 34).

A tensor's first offload used to make its mirror on the spot, while the job waited: an mmap, then
cudaHostRegister, which faults in and pins every page (on an H200, 3.1 of the 3.4 s that the first
offload of 10.5 GiB took). The tensors exist well before that offload: megatron's Adam makes its
moments in the optimizer's first step, and the refit's offload comes only after the rest of the
step (the checkpoint save, the driver's bookkeeping). So once an offload has shown colo-shim an
optimizer, a hook after each of its steps looks for device tensors that the next offload will
move and that have no mirror yet, and background threads make those mirrors (cudaHostRegister
releases the GIL: the trainer's thread goes on). The next offload waits only for mirrors still
being made (settle), then finds the rest ready, linked to their tensors as a restore links them.

What the threads make is what the next offload would have made, no more: the walk of the entry
point whose offload last saw this optimizer (NeMo-RL's move_optimizer moves Adam's state only,
megatron-core's the main params too), within the same budget the offload checks; the mirrors are
made earlier, not in addition, so the host peak does not grow. A mirror becomes visible to an
offload only once page-locked (mirrors.adopt, under the mirrors' lock): never half-registered. One
made for a tensor that an offload moved meanwhile (it stopped waiting after SETTLE_S, a safety
net) is given back. A page-lock failure here is the failure an offload would have met: mirrors off
for good in this process, one warning. Any other failure leaves that tensor to its offload.
Without CUDA nothing is made ahead: pageable mirrors cost nothing to make.
"""

from __future__ import annotations

import collections
import logging
import os
import sys
import threading
import time
import weakref

from colo_shim.core import guard as shim
from colo_shim.offload import mirrors, pages

log = logging.getLogger("colo_shim.offload")

THREADS = 4  # mirrors of different tensors fault in and pin their pages in parallel
SETTLE_S = 300.0  # safety net: an offload waits at most this long, then makes what is missing itself
WHERE = "the next offloads (page-locking their mirrors ahead failed)"

_cv = threading.Condition()
_todo: collections.deque = collections.deque()  # (weakref to a device tensor, device index, epoch, bytes)
_queued: set = set()  # id(device storage) queued or being made
_state = {"busy": 0, "threads": 0, "waiting": 0, "bytes": 0, "warned": False}
_walks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # torch optimizer -> (ref(entry), walk, gate)
stats = dict(requested=0, prepared=0, failed=0, prepare_s=0.0, waited_s=0.0, last_error="")


def watch(instance, walk, gate) -> None:
    """An offload moved `instance`'s tensors: after each step of its torch optimizers, make the mirrors
    its next offload will want (`walk(instance, True)`, while `gate()` says the family is on)."""
    try:
        for opt in _torch_optimizers(instance):
            if opt not in _walks:
                opt.register_step_post_hook(_stepped)
            _walks[opt] = (weakref.ref(instance), walk, gate)
    except AttributeError as exc:  # no torch optimizer hooks (torch < 2.0): mirrors are made at the offload
        _failed(exc)  # anything else is a shim error, contained by the offload wrapper's core/guard step


def _torch_optimizers(instance) -> list:
    """The torch optimizers behind an entry point: megatron's wrappers (`.optimizer`), a ChainedOptimizer's
    members (`.chained_optimizers`; its `.optimizer` asserts when there are several), a NeMo-RL worker's."""
    torch = sys.modules["torch"]
    found, todo = [], [(instance, 0)]
    while todo:
        obj, depth = todo.pop()
        if isinstance(obj, torch.optim.Optimizer):
            found.append(obj)
        elif depth < 4 and getattr(obj, "chained_optimizers", None) is not None:
            todo += [(o, depth + 1) for o in obj.chained_optimizers]
        elif depth < 4 and getattr(obj, "optimizer", None) is not None:
            todo.append((obj.optimizer, depth + 1))
    return found


def _stepped(opt, args, kwargs) -> None:
    """torch's step post-hook, inside the job's optimizer.step: through core/guard, never raises into it."""
    shim.step("offload: mirrors made ahead after an optimizer step", _after_step, opt)


def _after_step(opt) -> None:
    ref, walk, gate = _walks.get(opt, (lambda: None, None, None))
    instance = ref()
    if instance is not None and gate():
        request(walk(instance, True))


def request(slots) -> int:
    """Queue the device tensors of `slots` that have no mirror yet; returns how many were queued."""
    if not pages.host.ready():
        return 0
    with _cv:
        new = [t for t in map(mirrors.tensor_of, slots)
               if id(t.untyped_storage()) not in _queued and mirrors.wanted(t)]
        need = sum(pages.size(t) for t in new)
        if not new or not mirrors.room(_state["bytes"] + need):
            return 0  # over the budget: the offload falls back as it would have, with its warning
        epoch = mirrors.stats["offloads"]
        for t in new:
            _queued.add(id(t.untyped_storage()))
            _todo.append((weakref.ref(t), t.device.index, epoch, pages.size(t)))
        _state["bytes"] += need
        stats["requested"] += len(new)
        while _state["threads"] < min(THREADS, len(_todo) + _state["busy"]):
            _state["threads"] += 1
            threading.Thread(target=_work, name="colo_shim-mirrors", daemon=True).start()
        _cv.notify_all()  # the threads already there wait for work
        return len(new)


def _work() -> None:
    while True:
        with _cv:
            while not _todo:
                _cv.wait()
            item = _todo.popleft()
            _state["busy"] += 1
        start = time.perf_counter()
        made = _make(*item)
        with _cv:
            _state["busy"] -= 1
            _state["bytes"] -= item[3]
            _queued.difference_update(made)
            stats["prepare_s"] = round(stats["prepare_s"] + time.perf_counter() - start, 6)
            _cv.notify_all()


def _make(ref, device, epoch, nbytes) -> tuple:
    """One mirror, made and handed to mirrors.adopt. Holds the device tensor only while it runs (a
    thread keeping it after an offload would keep its device memory from the engine)."""
    t = ref()
    if t is None:
        return ()
    key = id(t.untyped_storage())
    try:
        if mirrors.wanted(t) and mirrors.adopt(t, mirrors.make(t, True, "optimizer", device), epoch):
            with _cv:
                stats["prepared"] += 1
    except pages.LockFailed as exc:
        mirrors.broke(WHERE, exc)
    except Exception as exc:  # noqa: BLE001 - a background thread: not core/guard, whose strict mode re-raises;
        _failed(exc)  # a raise would end it before _work's bookkeeping and leave settle() waiting SETTLE_S
    return (key,)


def settle() -> None:
    """Before an offload: wait for the mirrors still being made (in steady state there are none)."""
    with _cv:
        if not _todo and not _state["busy"]:
            return
        start = time.perf_counter()
        _state["waiting"] += 1
        _cv.notify_all()
        done = _cv.wait_for(lambda: not _todo and not _state["busy"], SETTLE_S)
        _state["waiting"] -= 1
        stats["waited_s"] = round(stats["waited_s"] + time.perf_counter() - start, 6)
        if not done and not _state["warned"]:
            _state["warned"] = True
            log.warning("colo_shim: offload mirrors being made ahead not ready after %.0f s; the offload makes "
                        "the rest itself", SETTLE_S)


def _failed(exc) -> None:
    with _cv:
        stats["failed"] += 1
        stats["last_error"] = f"{type(exc).__name__}: {exc}"[:300]
    log.debug("colo_shim: offload mirrors not made ahead: %s", exc)


def report() -> dict:
    with _cv:
        return dict(stats, pending=len(_todo) + _state["busy"], threads=_state["threads"],
                    waiting=_state["waiting"], watched=len(_walks))


def _forked() -> None:
    """A forked child has none of the parent's threads: what they were making is not coming."""
    global _cv
    _cv = threading.Condition()
    _todo.clear()
    _queued.clear()
    _state.update(busy=0, threads=0, waiting=0, bytes=0)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)
