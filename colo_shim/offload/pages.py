"""Host memory for mirrors: whole pages of an anonymous mapping, page-locked with cudaHostRegister.

Not torch's pinned allocator: it rounds each block up to a power of two and keeps freed blocks
cached, up to twice the memory and never given back; a mapping costs whole pages (4 KiB at most
over per tensor) and goes back to the kernel when the last tensor on it is freed. Pages are
registered one mapping each, so no two registrations share a page (CUDA refuses a second one), and
are kept from fork (a child's copy-on-write would leave the device writing pages the parent no
longer maps). The laid-out tensor is what `.cpu()` would have returned: same shape, dtype and
strides (torch.empty_like keeps them where `.cpu()` does).
"""

from __future__ import annotations

import mmap
import sys
import threading
import time

from colo_shim.core import cudahost
from colo_shim.core.cudahost import CudaHost

host = CudaHost()  # the one seam to the CUDA runtime (tests swap in a recorder)
stats = {"lock_s": 0.0}  # seconds spent page-locking, in every thread
_stats_lock = threading.Lock()


class LockFailed(RuntimeError):
    """cudaHostRegister refused: the caller stops using page-locked mirrors."""


def size(t) -> int:
    """Bytes of whole pages a host copy of t takes."""
    return -(-_layout(t).untyped_storage().nbytes() // mmap.PAGESIZE) * mmap.PAGESIZE


def _layout(t):
    return sys.modules["torch"].empty_like(t, device="meta")


def allocate(t):
    """(a host tensor laid out as `t.cpu()` on fresh pages, bytes of those pages)."""
    torch = sys.modules["torch"]
    meta, nbytes = _layout(t), size(t)
    if nbytes == 0:
        return torch.empty_like(t, device="cpu"), 0
    pages = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        pages.madvise(mmap.MADV_DONTFORK)
    except (AttributeError, OSError):  # not Linux, or a sandbox kernel without it: forks are rare here
        pass
    raw = torch.frombuffer(pages, dtype=torch.uint8)[:meta.untyped_storage().nbytes()]
    return raw.view(t.dtype).as_strided(meta.shape, meta.stride()), nbytes


def lock(tensor, nbytes: int, device=None) -> None:
    """Page-lock; any thread may call it (mirrors made ahead are locked in background threads)."""
    begin, ptr = time.perf_counter(), tensor.untyped_storage().data_ptr()
    try:
        host.register(ptr, nbytes, device)
    except Exception as exc:  # noqa: BLE001 - whatever the CUDA runtime's binding raises means: not page-locked
        raise LockFailed(f"cudaHostRegister of {nbytes} bytes failed: {type(exc).__name__}: {exc}") from exc
    cudahost.pinned.add(ptr)
    with _stats_lock:
        stats["lock_s"] = round(stats["lock_s"] + time.perf_counter() - begin, 6)


def unlock(tensors, log) -> None:
    """Unregister after one synchronize: no copy into or out of these pages may still be running."""
    if not tensors:
        return
    try:  # cleanup (also at exit) gives back every page it can: a failure is logged, never stops the rest
        host.synchronize()
    except Exception as exc:  # noqa: BLE001
        log.debug("colo_shim: synchronize before unlocking mirrors failed: %s", exc)
    for tensor in tensors:
        ptr = tensor.untyped_storage().data_ptr()
        cudahost.pinned.discard(ptr)
        try:
            host.unregister(ptr)
        except Exception as exc:  # noqa: BLE001
            log.debug("colo_shim: cudaHostUnregister failed: %s", exc)


def synchronize(tensors) -> None:
    """Wait for the copies on every device these tensors live on, each once: torch.cuda.synchronize()
    waits for the calling thread's current device only, which need not be theirs (a thread starts on
    device 0; one process may drive several GPUs)."""
    for index in sorted({t.device.index or 0 for t in tensors if t.device.type == "cuda"}):
        host.synchronize(index)
