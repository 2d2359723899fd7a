"""The one seam between colo-shim and the CUDA runtime's host-memory registration.

Fixes page-lock host buffers they did not allocate through torch (NVRx's /dev/shm staging
buffers, the offload family's mirrors) with cudaHostRegister, so that copies into them run at the
link's speed. Tests replace an instance of this class with a recorder; the GPU runs exercise it
for real. torch is never imported here: a process that has not imported it has nothing to lock.

`pinned` holds the address of every buffer a fix page-locked: a host tensor whose storage starts
there must never be handed to torch.multiprocessing as it is (pickling moves a CPU storage into
shared memory in place, leaving the registered pages behind), so the checkpoint fix sends a copy.
"""

from __future__ import annotations

import contextlib
import sys

pinned: set = set()  # addresses page-locked through this seam (kept by the fixes that lock them)


class CudaHost:
    def ready(self) -> bool:
        torch = sys.modules.get("torch")
        return torch is not None and torch.cuda.is_initialized()

    def register(self, ptr: int, nbytes: int, device=None) -> None:
        """device: the index to register on from a thread whose current device may be another (a new
        thread's is 0; registering there would make a context on another rank's GPU)."""
        torch = sys.modules["torch"]
        with torch.cuda.device(device) if device is not None else contextlib.nullcontext():
            code = int(torch.cuda.cudart().cudaHostRegister(ptr, nbytes, 0))
        if code != 0:
            raise RuntimeError(f"cudaHostRegister returned cudaError {code}")

    def unregister(self, ptr: int) -> None:
        torch = sys.modules["torch"]
        code = int(torch.cuda.cudart().cudaHostUnregister(ptr))
        if code != 0:
            raise RuntimeError(f"cudaHostUnregister returned cudaError {code}")

    def synchronize(self, device=None) -> None:
        """device: the index whose streams to wait for; None: the calling thread's current device."""
        sys.modules["torch"].cuda.synchronize(device)
