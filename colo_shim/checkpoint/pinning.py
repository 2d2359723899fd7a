"""Page-lock the staged /dev/shm buffers, so that staging copies run at the link's speed.

NVRx's stage path copies each GPU tensor into a /dev/shm-backed CPU tensor at schedule time.
Those buffers are pageable, so the copy goes through the driver's bounce buffers: 15.5 GB/s on an
H200, against 55.2 GB/s into the same buffer once it is registered with cudaHostRegister. NVRx
keeps the buffers of a structure in `FileSystemWriterAsync._shm_tensor_cache` and reuses them on
every later save, so registering each buffer once pays for itself from the second save on.

The cache is the one place that sees a buffer reused (NVRx reads an entry only to copy the next
save into it, right after its drain) and dropped (NVRx's cleanup_tensor_caches, colo-shim's
releases, NeMo-RL main's refit: all clear that dict). So the shim swaps the dict for a subclass
that registers an entry's buffers when it is first read and unregisters them on every removal.
Not at creation: NVRx's worker-restart callback drops the buffers of the first save on every new
worker, so registering those would be paid for nothing. The subclass holds its own reference to
each registered storage until it is unregistered, so a buffer is never freed (and its address
reused) while registered.

Registration only happens when CUDA is initialised in this process (the trainer; NVRx's
cpu_shm_mode worker never initialises it) and COLO_SHIM_STAGE_PIN is not 0. A failed registration
logs once and the buffers stay pageable: slower, never wrong. Before unregistering, the device is
synchronized, so no copy into a buffer can still run when its pages are unlocked.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time

from colo_shim.core.cudahost import CudaHost

log = logging.getLogger("colo_shim.nvrx")

ENV = "COLO_SHIM_STAGE_PIN"
_pinned: dict = {}  # data_ptr -> (storage kept alive while registered, nbytes)
_lock = threading.Lock()
_stats = {"pinned_bytes": 0, "pin_registrations": 0, "pin_unregistrations": 0, "pin_failures": 0,
          "pin_seconds": 0.0}
_state = {"failed": False, "atexit": False}
host = CudaHost()  # the one seam to the CUDA runtime (tests swap in a recorder)


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "off", "false", "no")


def _tensors(value):
    """NVRx stores (items, shm_tensors) per key."""
    try:
        return list(value[1])
    except (TypeError, IndexError):
        return []


def _guarded(fn):
    """The cache lives inside NVRx's save path: a bug here must cost pinning, never the save."""
    def call(*args, **kwargs):
        try:
            fn(*args, **kwargs)
        except Exception as exc:
            log.warning("colo_shim: staged-buffer pinning skipped: %s: %s", type(exc).__name__, exc)
    return call


@_guarded
def pin(value) -> None:
    """Register the buffers of one new cache entry, each storage once."""
    if _state["failed"] or not enabled() or not host.ready():
        return
    start = time.perf_counter()
    with _lock:
        for t in _tensors(value):
            storage = t.untyped_storage()
            ptr, nbytes = storage.data_ptr(), storage.nbytes()
            if nbytes == 0 or ptr in _pinned:
                continue
            try:
                host.register(ptr, nbytes)
            except Exception as exc:
                _stats["pin_failures"] += 1
                _state["failed"] = True
                log.warning("colo_shim: page-locking the staged /dev/shm buffers failed (%s: %s); staging "
                            "continues unpinned (slower device-to-host copies). %s=0 skips the attempt.",
                            type(exc).__name__, exc, ENV)
                break
            _pinned[ptr] = (storage, nbytes)
            _stats["pin_registrations"] += 1
            _stats["pinned_bytes"] += nbytes
        if not _state["atexit"]:
            _state["atexit"] = True
            atexit.register(unpin_all)
    _stats["pin_seconds"] += time.perf_counter() - start


@_guarded
def unpin(values, keep=()) -> None:
    """Unregister the buffers of entries leaving the cache (except storages still in `keep`)."""
    keep_ptrs = {t.untyped_storage().data_ptr() for value in keep for t in _tensors(value)}
    with _lock:
        ptrs = [p for value in values for p in {t.untyped_storage().data_ptr() for t in _tensors(value)}
                if p in _pinned and p not in keep_ptrs]
        _unregister(ptrs)


@_guarded
def unpin_all() -> None:
    """Interpreter exit: unlock what is still registered while the CUDA context still exists."""
    with _lock:
        _unregister(list(_pinned))


def _unregister(ptrs) -> None:
    if not ptrs:
        return
    try:
        host.synchronize()  # no staging copy into these pages may still be running
    except Exception as exc:
        log.debug("colo_shim: synchronize before unpinning failed: %s", exc)
    for ptr in ptrs:
        _storage, nbytes = _pinned.pop(ptr)
        try:
            host.unregister(ptr)
        except Exception as exc:
            log.debug("colo_shim: cudaHostUnregister failed: %s", exc)
        _stats["pin_unregistrations"] += 1
        _stats["pinned_bytes"] -= nbytes


class PinnedCache(dict):
    """NVRx's `_shm_tensor_cache`, registering buffers when first reused and unregistering when removed."""

    def __getitem__(self, key):
        value = dict.__getitem__(self, key)
        pin(value)  # NVRx reads an entry only to reuse it; each storage is registered once
        return value

    def __setitem__(self, key, value):
        old = dict.get(self, key)
        dict.__setitem__(self, key, value)
        if old is not None and old is not value:
            unpin([old], keep=[value])

    def __delitem__(self, key):
        value = dict.__getitem__(self, key)
        dict.__delitem__(self, key)
        unpin([value])

    def pop(self, key, *default):
        had = key in self
        value = dict.pop(self, key, *default)
        if had:
            unpin([value])
        return value

    def popitem(self):
        key, value = dict.popitem(self)
        unpin([value])
        return key, value

    def clear(self):
        values = list(dict.values(self))
        dict.clear(self)
        unpin(values)

    def update(self, *args, **kwargs):
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def setdefault(self, key, default=None):
        if key not in self:
            self[key] = default
        return dict.__getitem__(self, key)


def install(writer_cls) -> bool:
    """Swap NVRx's shm buffer cache for the registering one (once), keeping the entries it holds."""
    if not enabled():
        return False
    owner = next((c for c in writer_cls.__mro__ if isinstance(c.__dict__.get("_shm_tensor_cache"), dict)), None)
    if owner is None or isinstance(owner.__dict__["_shm_tensor_cache"], PinnedCache):
        return False
    old = owner.__dict__["_shm_tensor_cache"]
    owner._shm_tensor_cache = PinnedCache(old)
    return True


def report() -> dict:
    return dict(_stats, pin_seconds=round(_stats["pin_seconds"], 6), pin=enabled())
