"""Patch family `nvrx`: NVRx persistent checkpoint writers that outlive offloaded storage.

What the NVRx patch does, wrapper by wrapper (facts per version in docs/checkpoint-fence.md):
- AsyncCallsQueue.__init__: 0.4.1 has no instance tracker, so the fence could not find its queues.
- AsyncCallsQueue.schedule_async_request: records what each save sent: CUDA tensors (then the fence must release
  that writer), only host data that NVRx or the shim snapshotted (then the fence leaves it writing), the cache keys
  sent with data (what a drop must free) and its bytes (named while the fence waits). It wraps the save's preload_fn
  (worker.Preload: the writer's side door, door.py) and, once `save` returned (the copy to host is done), drops the
  trainer's own references to the CUDA tensors it sent, so that a write in flight pins no replaced storage on either
  side. It (re)installs NVRx's shm drain (shm_drain.py); a dead worker never hangs it (watch.py). A host tensor
  on pages colo-shim page-locked (an offloaded optimizer's mirror) is sent as a copy (issue 32 item 5).
- AsyncCallsQueue.maybe_finalize_async_calls: serialized with the fence (state.lock), so a host thread
  finalizing (NeMo-RL's background finalizer) and the fence never race; a dead worker is replaced first.
- PersistentAsyncCaller.is_current_async_call_done: a drop marker that arrives late (opt-in
  timeout) is skipped, and a completion read while waiting for it is handed back, so no finalize
  ever takes our marker for a save, nor loses a save's completion.
- AsyncCallsQueue.close / PersistentAsyncCaller.close (abort included): no version forgets the
  training-side cache keys on close; the next cached save then sends a key without data, the fresh
  worker dies on a cache miss and the trainer blocks forever in preload_q.join(). A close also
  removes NVRx's shm drain: it is put back while another queue still has a write pending.
- FileSystemWriterAsync.prepare_write_data (0.6.0 only; 0.7.0 does both itself): a cached save after
  offload + reload to a new address writes the old values, so a moved key is re-sent; host tensors
  are passed live (NVRx #376), so they are cloned: the save then equals the state when scheduled.
"""

from __future__ import annotations

import functools
import logging
import queue as _queue
import sys

from colo_shim.core import cudahost, guard
from colo_shim.core.registry import Patch, Target
from colo_shim.checkpoint import door, release, shm_drain, state, watch, worker

log = logging.getLogger("colo_shim.nvrx")

CORE = "nvidia_resiliency_ext.checkpointing.async_ckpt.core"
FS = "nvidia_resiliency_ext.checkpointing.async_ckpt.filesystem_async"
DIST = "nvidia-resiliency-ext"
RANGE = ">=0.4.1,<0.9"

_MAX_DEPTH = 10


def declaration() -> Patch:
    """The family as the registry sees it; built at the end of this module, once the wrappers exist."""
    return Patch(
        name="nvrx",
        summary="NVRx persistent checkpoint writer pins offloaded GPU memory, writes stale data, hangs after close",
        targets=(
            Target(CORE, "AsyncCallsQueue.__init__", _track, DIST, RANGE),
            Target(CORE, "AsyncCallsQueue.schedule_async_request", _schedule, DIST, RANGE),
            Target(CORE, "AsyncCallsQueue.maybe_finalize_async_calls", _serialized, DIST, RANGE),
            Target(CORE, "PersistentAsyncCaller.is_current_async_call_done", _completion, DIST, RANGE),
            Target(CORE, "AsyncCallsQueue.close", _close, DIST, RANGE),
            Target(CORE, "PersistentAsyncCaller.close", _close, DIST, RANGE),
            Target(FS, "FileSystemWriterAsync.prepare_write_data", _prepare_write_data, DIST, RANGE,
                   upstream_fixed=_checks_pointers),
        ),
        report=_report,
    )


def _checks_pointers(module):
    writer = getattr(module, "FileSystemWriterAsync", None)
    if writer is not None and hasattr(writer, "_cached_tensor_data_ptrs"):
        return "FileSystemWriterAsync refreshes moved cached tensors and clones host tensors itself"
    if writer is not None and not hasattr(writer, "_cached_identifiers"):
        return "no constant-structure caching in this NVRx version (added in 0.6.0)"
    return None


def _track(wrapped, instance, args, kwargs):
    result = wrapped(*args, **kwargs)
    guard.step("nvrx: track a checkpoint queue", state.track_queue, instance)
    return result


def _scan(obj, acc: dict | None = None, depth: int = 0) -> dict:
    """Tensors, CUDA or not, and the cache keys sent with data, anywhere in an async request."""
    if acc is None:
        acc = {"seen": set(), "bytes": 0, "cuda": False, "keys": set(), "reused": set()}
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        if id(obj) not in acc["seen"]:
            acc["seen"].add(id(obj))
            acc["bytes"] += obj.numel() * obj.element_size()
            acc["cuda"] = acc["cuda"] or obj.device.type == "cuda"
        return acc
    if depth > _MAX_DEPTH:
        return acc
    if isinstance(obj, functools.partial):
        _scan(obj.args, acc, depth + 1)
        _scan(obj.keywords, acc, depth + 1)
    elif isinstance(obj, (list, tuple)):
        if len(obj) == 2 and type(obj[0]).__name__ == "ConsistentDataIdentifier" and isinstance(obj[1], tuple):
            key, with_data = obj[0].key, len(obj[1]) > 1 and obj[1][1] is not None
            acc["keys" if with_data else "reused"].add(key)
        for item in obj:
            _scan(item, acc, depth + 1)
    elif isinstance(obj, dict):
        for item in obj.values():
            _scan(item, acc, depth + 1)
    return acc


def _schedule(wrapped, instance, args, kwargs):
    preload, reused = None, ()
    try:
        request = args[0] if args else kwargs.get("async_request")
        guard.step("nvrx: copy page-locked host tensors", _copy_pinned, request)
        acc = _scan((getattr(request, "preload_fn", None), getattr(request, "async_fn_args", ())))
        shm_drain.ensure_drain()
        if getattr(instance, "persistent", False):
            if acc["cuda"]:
                state.note_cuda_sent(instance)
            for key in acc["keys"]:
                state.key_bytes[key] = acc["bytes"]
            reused = acc["reused"] - acc["keys"]
            nbytes = acc["bytes"] + sum(state.key_bytes.get(k, 0) for k in reused)
            state.note_save(instance, nbytes, acc["keys"], cpu_only=not acc["cuda"] and state.host_snapshotted())
            wrapped_request = door.wrap(request)
            if wrapped_request is not request:
                preload = wrapped_request.preload_fn
                args, kwargs = ((wrapped_request,) + tuple(args[1:]), kwargs) if args else \
                    ((), dict(kwargs, async_request=wrapped_request))
    except Exception as exc:
        log.warning("colo_shim: cannot inspect async request: %s: %s", type(exc).__name__, exc)
    state.copying(+1)
    try:
        with watch.scheduling(instance, reused):  # a dead worker: replaced, or this save raises
            result = wrapped(*args, **kwargs)
    finally:
        state.copying(-1)
    if preload is not None and preload.fn is not None:  # schedule returned after the worker's copy to host
        guard.step("nvrx: drop the trainer's references of a scheduled save", _forget, preload)
    return result


def _copy_pinned(request) -> int:
    """Host tensors on pages colo-shim page-locked (offload mirrors) go to the worker as copies: NVRx < 0.6
    sends a host tensor that fills its storage as it is, and torch's queue moves that storage into shared
    memory in place, so the mirror would keep pageable pages and its page-locked ones stay registered."""
    if not cudahost.pinned:
        return 0
    return worker.swap((getattr(request, "preload_fn", None), getattr(request, "async_fn_args", ())),
                       lambda t: t.device.type == "cpu" and t.untyped_storage().data_ptr() in cudahost.pinned,
                       lambda t: t.clone())


def _forget(preload) -> None:
    """The trainer's references to the tensors a scheduled save sent serve nothing any more."""
    worker.strip(preload.fn, cuda_only=True, tuples=False)
    preload.forget()


def _serialized(wrapped, instance, args, kwargs):
    with state.lock:
        watch.replace_dead(instance)
        done = wrapped(*args, **kwargs)
        if kwargs.get("blocking", args[0] if args else False):
            watch.raise_lost(instance)
        return done


def _settle_marker(caller, blocking: bool) -> bool:
    """Put back handed-back completions, skip owed drop markers; False: our marker is still to come."""
    if caller.cur_item is not None:
        return True
    back = state._handed_back.get(caller)
    if back:
        caller.cur_item = back.popleft()
        return True
    while state._owed.get(caller, 0) > 0:
        try:
            got = caller.comp_q.get(timeout=0.1) if blocking else caller.comp_q.get_nowait()
        except _queue.Empty:
            if blocking and caller.process is not None and caller.process.is_alive():
                continue
            return False
        if got == worker.MARKER:
            state._owed[caller] -= 1
        else:
            caller.cur_item = got
            return True
    return True


def _settle(caller, blocking: bool) -> bool:
    """Our bookkeeping before NVRx reads a completion; False: not done yet (non-blocking only)."""
    if (state._owed.get(caller) or state._handed_back.get(caller)) and not _settle_marker(caller, blocking) \
            and not blocking:
        return False
    if blocking and caller.cur_item is None and getattr(caller, "process", None) is not None \
            and getattr(caller, "comp_q", None) is not None:
        watch.await_completion(caller)
    return True


def _completion(wrapped, instance, args, kwargs):
    blocking = kwargs.get("blocking", args[0] if args else False)
    no_dist = kwargs.get("no_dist", args[1] if len(args) > 1 else False)
    done = guard.step("nvrx: drop-marker bookkeeping", _settle, instance, bool(blocking), default=True,
                      passthrough=(state.CheckpointWorkerDied,))
    if not done:
        return False if no_dist else instance.sync_all_async_calls(1)  # still writing
    return wrapped(*args, **kwargs)


def _close(wrapped, instance, args, kwargs):
    guard.step("nvrx: dead-worker check at close", watch.forget_at_close, instance)
    try:
        return wrapped(*args, **kwargs)
    finally:
        if sys.meta_path is not None:  # skip at interpreter teardown (__del__ calls close)
            guard.step("nvrx: cache clear after close", _after_close, instance)


def _after_close(instance) -> None:
    release.clear_training_caches()
    state.forget_release(instance)
    shm_drain.after_close(instance)


def _cuda_ptrs(tensors) -> tuple:
    return tuple(t.untyped_storage().data_ptr() for t in tensors
                 if getattr(t, "device", None) is not None and t.device.type == "cuda"
                 and "dequantize" not in type(t).__dict__)


def _drop_moved_key(writer, plan, planner) -> None:
    if not writer.use_cached_data_structure or getattr(writer, "use_cpu_shm_for_gpu_tensors", False):
        return
    fs = sys.modules[FS]
    items = [item for item in plan.items if item.type != fs.WriteItemType.BYTE_IO]
    if not items:
        return
    key = fs._compute_data_structure_key_from_plan(items)
    cached = type(writer)._cached_identifiers
    if key not in cached:
        return
    current = _cuda_ptrs(planner.resolve_data(item) for item in items)
    if state.sent_ptrs.get(key) != current:
        cached.discard(key)
        log.info("colo_shim: cached checkpoint tensors moved (offload/reload); re-sending them")


def _snapshot_host_tensors(writer) -> None:
    """NVRx 0.6.0 hands contiguous CPU tensors to the worker live (#376); copy them as 0.7.0 does."""
    torch = sys.modules["torch"]
    uncached = getattr(writer, "uncached_tensor_data", None)
    if uncached:
        items, data = uncached
        writer.uncached_tensor_data = (items, [t.clone() if isinstance(t, torch.Tensor) and t.device.type == "cpu"
                                               and t.untyped_storage().nbytes() == t.numel() * t.element_size()
                                               else t for t in data])
    state.snapshot_wrapper_ran = True


def _prepare_write_data(wrapped, instance, args, kwargs):
    guard.step("nvrx: moved-pointer check", _drop_moved_key, instance, *args, **kwargs)
    result = wrapped(*args, **kwargs)
    guard.step("nvrx: pointer record / host snapshot", _after_prepare, instance)
    return result


def _after_prepare(writer) -> None:
    ident, sent = writer.consistent_data_identifier, getattr(writer, "cached_tensor_data", None)
    if ident is not None and sent is not None:
        state.sent_ptrs[ident.key] = _cuda_ptrs(sent[1])
    _snapshot_host_tensors(writer)


def _report() -> dict:
    return dict(state.totals(), release=release.strategy(), release_fallbacks_by_cause=dict(release.fallbacks),
                sent_keys=len(state.sent_ptrs), **shm_drain.report(), **watch.totals)


PATCH = declaration()
