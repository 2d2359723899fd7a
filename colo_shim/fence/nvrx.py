"""Patch family `nvrx`: NVRx persistent checkpoint writers that outlive offloaded storage.

Why each wrapper exists (facts per version in docs/checkpoint-fence.md):
- AsyncCallsQueue.__init__: 0.4.1 has no instance tracker, so the fence could not find its queues.
- AsyncCallsQueue.schedule_async_request: the fence releases a writer only when it was really sent
  CUDA tensors (runtime state, any driver), so it notes that here.
- AsyncCallsQueue.close / PersistentAsyncCaller.close (abort included): no version forgets the
  training-side cache keys on close; the next cached save then sends a key without data, the fresh
  worker dies on a cache miss and the trainer blocks forever in preload_q.join().
- FileSystemWriterAsync.prepare_write_data (0.6.0 only; 0.7.0 checks pointers itself): a cached
  save after offload + reload to a new address writes the old values; a moved key is re-sent.
"""

from __future__ import annotations

import functools
import logging
import sys

from colo_shim.core.registry import Patch, Target
from colo_shim.fence import release, state

log = logging.getLogger("colo_shim.nvrx")

CORE = "nvidia_resiliency_ext.checkpointing.async_ckpt.core"
FS = "nvidia_resiliency_ext.checkpointing.async_ckpt.filesystem_async"
DIST = "nvidia-resiliency-ext"
RANGE = ">=0.4.1,<0.9"

_MAX_DEPTH = 10


def _track(wrapped, instance, args, kwargs):
    result = wrapped(*args, **kwargs)
    try:
        state.track_queue(instance)
    except Exception as exc:
        log.warning("colo_shim: cannot track %s: %s", type(instance).__name__, exc)
    return result


def _has_cuda(obj, depth: int = 0) -> bool:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return obj.device.type == "cuda"
    if depth > _MAX_DEPTH:
        return False
    if isinstance(obj, functools.partial):
        return _has_cuda(obj.args, depth + 1) or _has_cuda(obj.keywords, depth + 1)
    if isinstance(obj, (list, tuple)):
        return any(_has_cuda(item, depth + 1) for item in obj)
    if isinstance(obj, dict):
        return any(_has_cuda(item, depth + 1) for item in obj.values())
    return False


def _schedule(wrapped, instance, args, kwargs):
    try:
        request = args[0] if args else kwargs.get("async_request")
        if getattr(instance, "persistent", False) and (
                _has_cuda(getattr(request, "preload_fn", None)) or _has_cuda(getattr(request, "async_fn_args", ()))):
            state.note_cuda_sent(instance)
    except Exception as exc:
        log.warning("colo_shim: cannot inspect async request: %s: %s", type(exc).__name__, exc)
    return wrapped(*args, **kwargs)


def _forget_dead_worker(instance) -> None:
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


def _close(wrapped, instance, args, kwargs):
    try:
        _forget_dead_worker(instance)
    except Exception as exc:
        log.debug("colo_shim: dead-worker check at close failed: %s", exc)
    try:
        return wrapped(*args, **kwargs)
    finally:
        try:
            if sys.meta_path is not None:  # skip at interpreter teardown (__del__ calls close)
                release.clear_training_caches()
                state._cuda_sent.discard(instance)
        except Exception as exc:
            log.debug("colo_shim: cache clear after close failed: %s", exc)


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


def _prepare_write_data(wrapped, instance, args, kwargs):
    try:
        _drop_moved_key(instance, *args, **kwargs)
    except Exception as exc:
        log.warning("colo_shim: pointer check skipped: %s: %s", type(exc).__name__, exc)
    result = wrapped(*args, **kwargs)
    try:
        ident, sent = instance.consistent_data_identifier, getattr(instance, "cached_tensor_data", None)
        if ident is not None and sent is not None:
            state.sent_ptrs[ident.key] = _cuda_ptrs(sent[1])
    except Exception as exc:
        log.warning("colo_shim: pointer record skipped: %s: %s", type(exc).__name__, exc)
    return result


def _checks_pointers(module):
    writer = getattr(module, "FileSystemWriterAsync", None)
    if writer is not None and hasattr(writer, "_cached_tensor_data_ptrs"):
        return "FileSystemWriterAsync refreshes cached tensors whose pointers moved"
    if writer is not None and not hasattr(writer, "_cached_identifiers"):
        return "no constant-structure caching in this NVRx version (added in 0.6.0)"
    return None


def _report() -> dict:
    return dict(state.totals(), release=release.strategy(), sent_keys=len(state.sent_ptrs))


PATCH = Patch(
    name="nvrx",
    summary="NVRx persistent checkpoint writer pins offloaded GPU memory, writes stale data, hangs after close",
    targets=(
        Target(CORE, "AsyncCallsQueue.__init__", _track, DIST, RANGE),
        Target(CORE, "AsyncCallsQueue.schedule_async_request", _schedule, DIST, RANGE),
        Target(CORE, "AsyncCallsQueue.close", _close, DIST, RANGE),
        Target(CORE, "PersistentAsyncCaller.close", _close, DIST, RANGE),
        Target(FS, "FileSystemWriterAsync.prepare_write_data", _prepare_write_data, DIST, RANGE,
               upstream_fixed=_checks_pointers),
    ),
    report=_report,
)
