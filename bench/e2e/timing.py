"""Where an offload's seconds go (issue 22 item 6): harness timing only, nothing it calls changes.

colo-shim's fence runs inside the first entry point that replaces storage (the grad buffers'
offload_to_cpu), so its seconds are taken out of that part by reading the shim's own fence total
before and after each part; on NeMo-RL main's worker, main's finalize_async_save (and the shim's
fence inside it) is the fence part.
"""

from __future__ import annotations

import time


def fence_seconds() -> float:
    """colo-shim's fence seconds so far in this process (0 without colo-shim)."""
    import sys

    state = sys.modules.get("colo_shim.checkpoint.state")
    return float(state.totals()["fence_s"]) if state is not None else 0.0


class Parts:
    """`with Parts(sums, "before") as part: part("grads", fn, *args)` adds each part's seconds to
    sums["before.grads"] (and the fence seconds inside it to sums["before.fence"])."""

    def __init__(self, sums: dict, prefix: str):
        self.sums, self.prefix = sums, prefix

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def _add(self, name, seconds):
        key = f"{self.prefix}.{name}"
        self.sums[key] = self.sums.get(key, 0.0) + seconds

    def __call__(self, name, fn, *args, **kwargs):
        t0, f0 = time.perf_counter(), fence_seconds()
        try:
            return fn(*args, **kwargs)
        finally:
            took, fenced = time.perf_counter() - t0, fence_seconds() - f0
            if name == "fence":
                self._add("fence", took)
            else:
                self._add("fence", fenced)
                self._add(name, took - fenced)
