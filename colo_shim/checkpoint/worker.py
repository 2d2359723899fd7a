"""Runs inside the NVRx persistent checkpoint worker (sent there as an async request).

Kept tiny and free of colo_shim imports: it is unpickled by reference in a spawned worker that
may not have the shim active, and it must not import anything the worker does not already have.

The worker loop throws the function's return value away, so what was freed is written into
`report`, a small CPU tensor the request carries (torch shares it with the trainer through shared
memory): the fence reads it after the marker comes back and checks it against what it sent.
"""

import gc
import sys

MARKER = -7_000_001  # call_idx of the drop request; never a real checkpoint index
# report slots: the function ran, the worker cache attribute exists, entries, tensors, CUDA tensors, bytes
RAN, FOUND, ENTRIES, TENSORS, CUDA, BYTES = range(6)
SLOTS = 6


def _tensors(obj, out, depth=0):
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        out.append(obj)
    elif depth < 8 and isinstance(obj, (list, tuple)):
        for item in obj:
            _tensors(item, out, depth + 1)
    elif depth < 8 and isinstance(obj, dict):
        for item in obj.values():
            _tensors(item, out, depth + 1)
    return out


def drop_cached_tensors(report=None, *_args, **_kwargs) -> None:
    """Forget the tensors the worker keeps (0.6+: its data cache; 0.4.1: the last request)."""
    core = sys.modules.get("nvidia_resiliency_ext.checkpointing.async_ckpt.core")
    cache = getattr(getattr(core, "PersistentAsyncCaller", None), "_worker_data_cache", None)
    found = isinstance(cache, dict)
    held = _tensors(list(cache.values()), []) if found else []
    counts = {RAN: 1, FOUND: int(found), ENTRIES: len(cache) if found else 0, TENSORS: len(held),
              CUDA: sum(1 for t in held if t.device.type == "cuda"),
              BYTES: sum(t.untyped_storage().nbytes() for t in held)}
    del held
    if found:
        cache.clear()
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    if report is not None:
        for slot, value in counts.items():
            report[slot] = value
