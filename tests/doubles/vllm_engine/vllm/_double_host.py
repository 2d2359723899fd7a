"""Pinned host memory for the engine double (no upstream file of this name): torch's CUDA caching
host allocator, which a CPU build of torch lacks.

vLLM's level-1 sleep pins one `torch.empty(..., pin_memory=True)` per allocation
(device_allocator/cumem.py); when the wake-up drops them, torch's CachingHostAllocator keeps the
blocks (sizes rounded up to powers of two) until `torch._C._host_emptyCache()`, and
`torch.cuda.host_memory_stats()["allocated_bytes.current"]` counts them (seen on vLLM 0.26 /
torch 2.11 on an H200: 2.25 GiB kept for 1.54 GiB of weights). Installed in place of those two
torch functions only when CUDA is unavailable.
"""

from __future__ import annotations

import torch


class PinnedHostCache:
    """torch's CachingHostAllocator as vLLM's level-1 backup meets it (c10/core/CachingHostAllocator)."""

    def __init__(self):
        self.free: dict[int, list[torch.Tensor]] = {}
        self.held = 0
        self.active = 0

    def alloc(self, nbytes: int) -> torch.Tensor:
        size = 1 << max(int(nbytes) - 1, 0).bit_length()
        blocks = self.free.get(size)
        block = blocks.pop() if blocks else None
        if block is None:
            block = torch.zeros(size, dtype=torch.uint8)  # touched, as cudaHostAlloc pages are
            self.held += size
        self.active += size
        return block

    def release(self, block: torch.Tensor) -> None:
        self.active -= block.numel()
        self.free.setdefault(block.numel(), []).append(block)

    def empty_cache(self) -> None:
        self.held -= sum(b.numel() for blocks in self.free.values() for b in blocks)
        self.free = {}

    def stats(self) -> dict:
        return {"allocated_bytes.current": self.held, "active_bytes.current": self.active}


HOST_CACHE = PinnedHostCache()
if not torch.cuda.is_available():
    torch.cuda.host_memory_stats = HOST_CACHE.stats
    torch._C._host_emptyCache = HOST_CACHE.empty_cache
