"""COLO_SHIM_NVRX_RELEASE=stage: NVRx writers stage GPU tensors through CPU shared memory.

With CUDA IPC the persistent writer holds the training storage until it is released, and a
release has to wait for the write, so an offload right after a save waits for the whole file
write (9-11 s for 16 GiB on tmpfs, minutes on a network file system). NVRx >= 0.6 can copy GPU
tensors into /dev/shm at schedule time instead (`use_cpu_shm_for_gpu_tensors`, megatron's
`--async-ckpt-use-cpu-shm`): the worker then never sees CUDA memory, and the fence has nothing to
wait for. The price is paid at schedule time (the device-to-host copy into shared memory, done by
the trainer) and in host memory: one /dev/shm copy of the checkpointed tensors per rank, kept and
reused across saves of the same structure.

/dev/shm is often small (containers default to 64 MiB) and shared by every rank of the node, so
each first save of a structure reserves its bytes node-wide under a file lock (shm_ledger; or
checks them against COLO_SHIM_STAGE_SHM_BYTES, an explicit per-rank budget); if they do not fit,
that save goes through CUDA IPC as before, with one warning that names the sizes, and the fence
waits for it as with inplace. An allocation that still fails mid-save (/dev/shm filled by
something outside the ledger) falls back the same way instead of raising into the job.

Reused buffers are guarded by NVRx's shm drain, which close() removes: ensure_drain puts one back
at every schedule (for every NVRx queue, stage or not). The buffers themselves are page-locked
while cached (checkpoint/pinning.py), so the staging copy runs at pinned-memory speed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys

from colo_shim.checkpoint import pinning, shm_ledger, state

log = logging.getLogger("colo_shim.nvrx")

SHM_DIR_ENV, SHM_BYTES_ENV = shm_ledger.DIR_ENV, "COLO_SHIM_STAGE_SHM_BYTES"
_FS = "nvidia_resiliency_ext.checkpointing.async_ckpt.filesystem_async"
_stats = {"staged_saves": 0, "staged_bytes": 0, "ipc_saves": 0, "shm_budget": None, "refused": ""}
_drain_stats = {"drain_installs": 0, "drained": 0}
_mode = {"ipc": False}  # the last save of this process went through CUDA IPC (refused)


def active() -> bool:
    from colo_shim.checkpoint import release

    return release.strategy() == "stage"


def not_staging(module):
    """upstream_fixed detector: these writer wrappers only matter with the stage strategy."""
    if not active():
        return "only used with COLO_SHIM_NVRX_RELEASE=stage"
    writer = getattr(module, "FileSystemWriterAsync", None)
    if writer is not None and not hasattr(writer, "_shm_tensor_cache"):
        return "this NVRx has no CPU shared-memory staging (added in 0.6.0); stage acts as inplace"
    return None


def writer_init(wrapped, instance, args, kwargs):
    kwargs["use_cpu_shm_for_gpu_tensors"] = True
    result = wrapped(*args, **kwargs)
    instance._colo_staged = True
    try:
        pinning.install(type(instance))
    except Exception as exc:
        log.warning("colo_shim: staged buffers stay unpinned: %s: %s", type(exc).__name__, exc)
    return result


def _explicit_budget() -> int | None:
    explicit = os.environ.get(SHM_BYTES_ENV)
    if explicit:
        try:
            return int(float(explicit))
        except ValueError:
            log.warning("colo_shim: %s=%r is not a number of bytes; using /dev/shm's free space", SHM_BYTES_ENV, explicit)
    return None


def shm_budget() -> int:
    """Bytes of /dev/shm this rank may fill now: an explicit per-rank budget, else the node's free
    space less what other ranks reserved and have not allocated yet (shm_ledger)."""
    explicit = _explicit_budget()
    if explicit is not None:
        return explicit
    try:
        return shm_ledger.available()
    except OSError:
        return _share_without_ledger()


def _share_without_ledger() -> int:
    """No ledger (an shm directory without flock or write access): this rank's share of the free space."""
    try:
        free = shm_ledger.free_bytes()
    except OSError:
        return 0
    return free // max(1, shm_ledger.local_ranks()["count"] or 1)


def _plan_bytes(plan) -> int:
    total = 0
    for item in plan.items:
        data = getattr(item, "tensor_data", None)
        if data is None:
            continue
        numel = 1
        for size in data.chunk.sizes:
            numel *= int(size)
        dtype = getattr(data.properties, "dtype", None)
        total += numel * (dtype.itemsize if dtype is not None and hasattr(dtype, "itemsize") else 4)
    return total


def _staged_bytes(writer_cls) -> int:
    cache = getattr(writer_cls, "_shm_tensor_cache", {}) or {}
    return sum(t.numel() * t.element_size() for _, tensors in cache.values() for t in tensors)


def _structure_key(plan):
    """NVRx's cache key for this plan (the same items reach prepare_write_data), None if unknown."""
    fs = sys.modules.get(_FS)
    keyer = getattr(fs, "_compute_data_structure_key_from_plan", None)
    if keyer is None:
        return None
    items = [item for item in plan.items if item.type != fs.WriteItemType.BYTE_IO]
    return keyer(items) if items else None


def _new_bytes(writer, plan) -> int:
    """What this save allocates in /dev/shm: nothing when its structure's buffers are cached."""
    key = _structure_key(plan)
    if key is None:
        return max(0, _plan_bytes(plan) - _staged_bytes(type(writer)))
    if writer.use_cached_data_structure and key in (getattr(type(writer), "_shm_tensor_cache", None) or {}):
        return 0
    return _plan_bytes(plan)


def check_room(wrapped, instance, args, kwargs):
    """Before a staged save: its new shm copies must fit node-wide (reserved under the ledger's
    lock), or this save keeps CUDA IPC."""
    try:
        if getattr(instance, "_colo_staged", False) and instance.use_cpu_shm_for_gpu_tensors:
            need = _new_bytes(instance, args[0] if args else kwargs.get("plan"))
            granted, room = True, None
            if need:
                try:
                    granted, room = shm_ledger.reserve(need, _explicit_budget())
                except OSError as exc:
                    ranks = shm_ledger.local_ranks()
                    _warn_once("ledger", "colo_shim: no /dev/shm reservation ledger in %s (%s: %s); each rank "
                               "budgets its share of the free space (%s ranks per node, %s)", shm_ledger.directory(),
                               type(exc).__name__, exc, ranks["count"] or 1, ranks["source"])
                    room = _explicit_budget()
                    room = _share_without_ledger() if room is None else room
                    granted = need <= room
                _stats["shm_budget"] = room
            if not granted:
                _refuse(instance, need, room)
            else:
                _after_ipc()
                _stats["staged_saves"] += 1
                _stats["staged_bytes"] = max(_stats["staged_bytes"], need)
                _guard_allocation(instance, need)
    except Exception as exc:
        log.warning("colo_shim: /dev/shm check skipped: %s: %s", type(exc).__name__, exc)
    return wrapped(*args, **kwargs)


def _warn_once(key: str, message: str, *args) -> None:
    from colo_shim.checkpoint import release

    release._warn_once(f"stage-{key}", message, *args)


def _to_ipc(writer) -> None:
    from colo_shim.checkpoint import release

    writer.use_cpu_shm_for_gpu_tensors = False
    _mode["ipc"] = True
    release.clear_training_caches(keep_shm=False)  # no cache key may mix the two transfer modes
    _stats["ipc_saves"] += 1
    state._totals["stage_fallbacks"] += 1


def _refuse(writer, need: int, budget: int) -> None:
    _to_ipc(writer)
    _stats["refused"] = f"needs {_size(need)} of /dev/shm, {_size(budget)} available"
    _warn_once("room", "colo_shim: COLO_SHIM_NVRX_RELEASE=stage: this checkpoint %s for this rank (node-wide, "
               "after what other ranks reserved); it is written through CUDA IPC instead and the fence waits "
               "for it at the next offload. Enlarge /dev/shm (docker --shm-size) or set %s.",
               _stats["refused"], SHM_BYTES_ENV)


def _shm_failure(exc: BaseException) -> bool:
    """torch's shm allocation failed (it fallocates, so a full tmpfs fails here, not by SIGBUS later)."""
    if isinstance(exc, OSError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and any(s in text for s in (
        "unable to allocate shared memory", "No space left on device", "unable to mmap", "Cannot allocate memory",
        "unable to open shared memory"))


def _guard_allocation(writer, need: int) -> None:
    """This save's prepare_write_data, where NVRx allocates the shm copies: an allocation that still
    fails (/dev/shm filled by something outside the ledger) sends the save through CUDA IPC."""
    cls = type(writer)
    prepare = cls.prepare_write_data.__get__(writer, cls)
    before = set(getattr(cls, "_shm_tensor_cache", None) or {})

    def prepare_write_data(*args, **kwargs):
        writer.__dict__.pop("prepare_write_data", None)  # this save only
        try:
            result = prepare(*args, **kwargs)
        except Exception as exc:
            with contextlib.suppress(Exception):
                shm_ledger.abandon()
            if not (writer.use_cpu_shm_for_gpu_tensors and _shm_failure(exc)):
                raise
            message = f"{type(exc).__name__}: {exc}"
            del exc  # its traceback holds the copies already allocated: free them before the retry
            _to_ipc(writer)
            _stats["refused"] = f"allocation failed mid-save ({message})"
            _warn_once("alloc", "colo_shim: COLO_SHIM_NVRX_RELEASE=stage: /dev/shm ran out while staging this "
                       "checkpoint (%s); it is written through CUDA IPC instead and the fence waits for it.", message)
            return prepare(*args, **kwargs)
        with contextlib.suppress(Exception):
            _note_allocated(writer, before, need)
        return result

    writer.prepare_write_data = prepare_write_data


def _note_allocated(writer, before: set, need: int) -> None:
    cache = getattr(type(writer), "_shm_tensor_cache", None) or {}
    fresh = [tensors for key, (_, tensors) in cache.items() if key not in before]
    sent = getattr(writer, "cached_tensor_data", None)
    if not fresh and sent is not None and not writer.use_cached_data_structure:
        fresh = [sent[1]]  # no caching: fresh copies every save, freed once the write is done
    tensors = [t for group in fresh for t in group]
    if not tensors:
        if need:
            shm_ledger.abandon()
        return
    shm_ledger.allocated(sum(t.numel() * t.element_size() for t in tensors), keepalive=tensors[0])


def _after_ipc() -> None:
    """A staged save after CUDA IPC ones: forget the keys those sent, or (GPU) this save would send
    no data under a key whose worker entry holds live CUDA tensors, and the worker would write them."""
    if _mode["ipc"]:
        from colo_shim.checkpoint import release

        _mode["ipc"] = False
        release.clear_training_caches(keep_shm=True)


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"


def before_schedule(queue, has_cuda: bool) -> None:
    """Start a stage worker without CUDA (NVRx cpu_shm_mode); a CUDA save needs a CUDA worker."""
    if not active() or not hasattr(queue, "cpu_shm_mode"):
        return
    caller = getattr(queue, "persistent_caller", None)
    if caller is None and not has_cuda and not queue.cpu_shm_mode:
        queue.cpu_shm_mode = True
    elif has_cuda and queue.cpu_shm_mode and caller is not None and getattr(caller, "cpu_shm_mode", False):
        log.info("colo_shim: a checkpoint went through CUDA IPC; restarting its writer with CUDA")
        queue.close()
        queue.cpu_shm_mode = False


def ensure_drain() -> None:
    """Keep a drain installed for every save that follows: called at each schedule and after a close.

    NVRx's only guard against overwriting shm buffers a write still reads is the drain that
    AsyncCallsQueue.__init__ installs in cpu_shm_mode; close() (0.6.0 and 0.7.0) removes it and no
    restart puts it back, so after any close and reuse (terminate-and-resume, NeMo-RL main's refit,
    the restart release, the CUDA IPC fallback, a dead worker) the third save wrote into the buffers
    the second was writing. One slot for the process; installed only when it holds something else,
    so never twice.
    """
    writer = getattr(sys.modules.get(_FS), "FileSystemWriterAsync", None)
    if writer is None or not hasattr(writer, "register_shm_drain_callback"):
        return
    if getattr(writer, "_shm_drain_callback", None) is not _drain:
        writer.register_shm_drain_callback(_drain)
        _drain_stats["drain_installs"] += 1


def after_close(closed) -> None:
    """A close removed the drain: put it back at once when another queue still has a write pending."""
    if any(q is not closed and state.pending(q) for q in state.live_queues()):
        ensure_drain()


def _drain() -> None:
    """Before NVRx overwrites cached shm buffers: finish every pending save, on every queue.

    Unlike NVRx's drain (its own queue only) this covers each live queue, because the buffer cache
    is one per process; a dead worker raises through the fence's own finish instead of hanging.
    """
    from colo_shim.checkpoint import fence

    for queue in state.live_queues():
        if state.pending(queue):
            _drain_stats["drained"] += fence._finalize(queue, fence.Wait())


def report() -> dict:
    if not active():
        return {}
    out = dict(_stats, **_drain_stats, **pinning.report(), local_ranks=shm_ledger.local_ranks())
    with contextlib.suppress(Exception):
        out["ledger"] = shm_ledger.snapshot()
    return {"stage": out}
