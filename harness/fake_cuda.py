"""A CPU stand-in for CUDA, so that the offload entry points really move tensors on this machine.

megatron-core and NeMo-RL move only tensors whose `is_cuda` is true, and this machine has no GPU,
so without a stand-in every offload would be a no-op with or without colo-shim. Inside
`FakeCuda()` a tensor is "on the device" when its storage was made by the stand-in: `.cuda()`,
`.to("cuda")` and factories with `device="cuda"` copy into fresh CPU storage marked as the
device's, and so do `zeros_like(t)` and the other `*_like` factories of a device tensor (Adam makes
its moments that way in its first step); `.cpu()` / `.to("cpu")` copy a marked tensor into
unmarked storage; `is_cuda` and `device` read the mark (and its index: `.to("cuda:1")`, `.cuda(1)`);
`pin_memory()` copies and marks the copy pinned; torch.cuda.is_available()
says True (so NeMo-RL's doubles move to "cuda"). Values are real CPU bytes, so every copy is checked
bit for bit. The real code of megatron-core, NeMo-RL's doubles and colo-shim runs unchanged; only
torch's answers differ.

`FakeCuda(build=True)`, for building and stepping megatron's optimizer, makes `Tensor.type()` name
CUDA types (its distributed optimizer refuses parameters whose type is not `torch.cuda.*Tensor`) and
leaves is_available() alone (torch's Adam would then ask the accelerator for a stream).

`PageLocks` stands in for the CUDA runtime's page-locking (colo_shim/core/cudahost.py's seam):
it records what colo-shim registers and refuses what CUDA would refuse.
"""

import threading
import weakref

import torch
from torch.overrides import TorchFunctionMode

_device: dict = {}  # id(storage) -> weakref(storage): storages "on the device"
_index: dict = {}  # id(storage) -> the device's index, for storages on one other than cuda:0
_pinned: dict = {}
IS_CUDA = torch.Tensor.is_cuda.__get__
DEVICE = torch.Tensor.device.__get__
LIKE = {torch.empty_like, torch.zeros_like, torch.ones_like, torch.full_like, torch.rand_like, torch.randn_like}


def _mark(table, t, index=0):
    storage = t.untyped_storage()
    table[id(storage)] = weakref.ref(storage)
    if table is _device:
        _index[id(storage)] = index
    return t


def _has(table, t) -> bool:
    storage = t.untyped_storage()
    ref = table.get(id(storage))
    return ref is not None and ref() is storage and storage.nbytes() > 0


def adopt(t):
    """Say that t, made on the CPU before the stand-in was used, lives on the device (a DDP buffer)."""
    return _mark(_device, t)


def on_device(t) -> bool:
    return _has(_device, t)


def device_bytes() -> int:
    """What a GPU would have allocated now: the bytes of live device storages."""
    live = (ref() for ref in list(_device.values()))
    return sum(s.nbytes() for s in live if s is not None)


def _kind(device):
    if isinstance(device, str):
        return device.split(":")[0]
    return device.type if isinstance(device, torch.device) else None


def _number(device) -> int:
    """The index "cuda:1", torch.device("cuda", 1) or 1 names; a bare "cuda" is 0 (no current device here)."""
    if isinstance(device, int):
        return device
    return (torch.device(device) if isinstance(device, str) else device).index or 0


class FakeCuda(TorchFunctionMode):
    def __init__(self, build=False):
        super().__init__()
        self.build = build

    def __enter__(self):
        self._available = torch.cuda.is_available
        if not self.build:  # torch's own optimizers then ask the accelerator for streams
            torch.cuda.is_available = lambda: True
        return super().__enter__()

    def __exit__(self, *exc):
        torch.cuda.is_available = self._available
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func == IS_CUDA:
            return on_device(args[0])
        if func == DEVICE:
            return torch.device("cuda", _index[id(args[0].untyped_storage())]) if on_device(args[0]) else func(*args)
        if self.build and func is torch.Tensor.type and len(args) == 1 and not kwargs:
            return func(*args).replace("torch.", "torch.cuda.", 1)
        if func is torch.Tensor.cuda:
            return _mark(_device, args[0].clone(), _number(args[1] if len(args) > 1 else kwargs.get("device", 0)))
        if func is torch.Tensor.cpu:
            return args[0].clone() if on_device(args[0]) else args[0]
        if func is torch.Tensor.pin_memory:
            return _mark(_pinned, args[0].clone())
        if func is torch.Tensor.is_pinned:
            return _has(_pinned, args[0])
        if func is torch.Tensor.to:
            return self._to(func, args, kwargs)
        if func in LIKE and "device" not in kwargs and args and on_device(args[0]):  # zeros_like(p): p's device
            return _mark(_device, func(*args, **kwargs), _index[id(args[0].untyped_storage())])
        if _kind(kwargs.get("device")) == "cuda":  # factories: torch.tensor(..., device="cuda"), empty_like, ...
            index, kwargs["device"] = _number(kwargs["device"]), "cpu"
            return _mark(_device, func(*args, **kwargs), index)
        return func(*args, **kwargs)

    @staticmethod
    def _to(func, args, kwargs):
        src, rest = args[0], list(args[1:])
        device = kwargs.pop("device", None)
        if device is None and rest and isinstance(rest[0], (str, torch.device)):
            device = rest.pop(0)
        kind = _kind(device)
        if kind == "cuda":
            same = on_device(src) and _index[id(src.untyped_storage())] == _number(device)
            return src if same and not kwargs.get("copy") else _mark(_device, src.clone(), _number(device))
        if kind == "cpu":
            return src.clone() if on_device(src) or kwargs.get("copy") else src
        return func(src, *rest, **kwargs)


class PageLocks:
    """cudaHostRegister / cudaHostUnregister / synchronize as colo-shim calls them, from any thread;
    refuses what CUDA would refuse. `fail`: every registration fails; `fail_background`: those of
    threads other than the main one; `gate`: an Event other threads' registrations wait for (a
    registration still in progress, for the mirrors made ahead)."""

    def __init__(self, fail=False):
        self.fail, self.locked, self.registrations, self.unregistrations, self.syncs = fail, {}, 0, 0, 0
        self.fail_background, self.gate, self.blocked, self.calls, self.synced = False, None, 0, [], []
        self.lock = threading.Lock()
        self.cv = threading.Condition(self.lock)

    def ready(self):
        return True

    def register(self, ptr, nbytes, device=None):
        main = threading.current_thread() is threading.main_thread()
        with self.lock:
            self.calls.append({"main": main, "device": device})
        if self.fail or (self.fail_background and not main):
            raise RuntimeError("cudaErrorMemoryAllocation (recorder)")
        if self.gate is not None and not main:
            with self.cv:
                self.blocked += 1
                self.cv.notify_all()
            self.gate.wait(120)  # safety net: the test releases it
        with self.lock:
            assert ptr % 4096 == 0 and nbytes % 4096 == 0 and ptr not in self.locked, (ptr, nbytes)
            self.locked[ptr] = nbytes
            self.registrations += 1

    def unregister(self, ptr):
        with self.lock:
            del self.locked[ptr]
            self.unregistrations += 1

    def synchronize(self, device=None):
        """device: as torch.cuda.synchronize takes it (None: the current one); `synced` keeps each in order."""
        with self.lock:
            self.syncs += 1
            self.synced.append(device)
