"""Runs inside the NVRx persistent checkpoint worker (sent there as an async request).

Kept tiny and free of colo_shim imports: it is unpickled by reference in a spawned worker that
may not have the shim active, and it must not import anything the worker does not already have.
"""

import gc
import sys

MARKER = -7_000_001  # call_idx of the drop request; never a real checkpoint index


def drop_cached_tensors(*_args, **_kwargs) -> None:
    """Forget the CUDA tensors the worker keeps (0.6+: its data cache; 0.4.1: the last request)."""
    core = sys.modules.get("nvidia_resiliency_ext.checkpointing.async_ckpt.core")
    cache = getattr(getattr(core, "PersistentAsyncCaller", None), "_worker_data_cache", None)
    if cache:
        cache.clear()
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
