"""Give back the pinned host memory that a level-1 sleep leaves behind, before a level-2 sleep (issue 9).

vLLM's level-1 sleep copies every weight into pinned CPU tensors (`CuMemAllocator.sleep`,
`torch.empty(..., pin_memory=True)`); the wake-up copies them back and drops them. They go to
torch's caching host allocator, which keeps the pinned blocks (rounded up to powers of two) until
`torch._C._host_emptyCache()`. Measured on vLLM 0.26 / H200: 1.54 GiB of weights pin 2.25 GiB,
still held after the wake-up, so one level-1 sleep anywhere in the process (setup, a validation
finish, the first cycle that learns coverage) cancelled every later level-2 saving.

The release runs where the blocks live: vLLM's worker, inside the engine-core process, reached
through `collective_rpc(callable)`. It runs right before a level-2 sleep, so cached blocks are
free by then (the level-1 wake-up copied the backup back, synchronously), and a level-1 sleep
that follows a level-1 wake-up still reuses the cache. `emptyCache` frees only blocks no tensor
uses; vLLM's own pinned staging buffers stay. The `*_rpc` functions are module-level so that
they pickle by reference.
"""

from __future__ import annotations

import threading
import time

from colo_shim.discard import guard


def _held() -> tuple[int, int] | None:
    """(bytes the caching host allocator owns, bytes checked out), or None without CUDA."""
    import torch

    stats = torch.cuda.host_memory_stats()
    if "allocated_bytes.current" not in stats:
        return None
    return int(stats["allocated_bytes.current"]), int(stats.get("active_bytes.current", 0))


def _rss() -> int:
    """This process's resident bytes: what can be known where torch keeps no host-allocator stats."""
    import os

    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):  # no /proc (not Linux): nothing measurable
        return 0


def _release_unmeasured(torch) -> dict:
    """torch < 2.7 has `_host_emptyCache` but no `host_memory_stats`: release anyway, measure RSS.

    cudaFreeHost unmaps the blocks, so the drop in resident bytes is what was returned (other
    threads allocating at the same moment can hide part of it, hence "measure": "rss").
    """
    before = _rss()
    t = time.perf_counter()
    torch._C._host_emptyCache()
    seconds = time.perf_counter() - t
    after = _rss()
    return {"supported": True, "measure": "rss", "released": max(0, before - after), "seconds": round(seconds, 6),
            "held": 0, "rss_before": before, "rss_after": after}


def release_rpc(worker) -> dict:
    """Return the cached (unused) pinned blocks to the driver; report what it freed and the time."""
    import torch

    if getattr(torch.cuda, "host_memory_stats", None) is None:
        return _release_unmeasured(torch)
    before = _held()
    if before is None:
        return {"supported": False, "released": 0, "seconds": 0.0, "held": 0}
    # No test on active_bytes: on torch 2.11 it only grew across vLLM's level-1 cycles (4.5 GiB
    # "active" of 2.25 GiB owned), so it cannot tell cached blocks from used ones; emptyCache
    # itself frees only unused blocks and costs microseconds when there are none.
    t = time.perf_counter()
    torch._C._host_emptyCache()
    seconds = time.perf_counter() - t
    after = _held() or (0, 0)
    return {"supported": True, "measure": "allocator", "released": before[0] - after[0], "seconds": round(seconds, 6),
            "held": after[0]}


class _Record:
    def __init__(self):
        self.releases = 0
        self.released = 0
        self.seconds = 0.0
        self.unsupported = 0
        self.errors = 0
        self.rss_measured = 0  # releases on torch without host_memory_stats (< 2.7), counted by RSS
        self.last: dict | None = None


_lock = threading.Lock()


def _record(engine) -> _Record:
    """Kept on the engine's guard state, the one per-engine registry of the family."""
    st = guard.state_for(engine)
    with _lock:
        if st.host_memory is None:
            st.host_memory = _Record()
        return st.host_memory


def _records() -> list:
    return [st.host_memory for st in guard.states() if st.host_memory is not None]


def note(engine, results) -> dict:
    """Fold one release's per-worker results (a list from collective_rpc) into the engine's record."""
    rows = results if isinstance(results, list) else [results]
    rows = [r for r in rows if isinstance(r, dict)]
    merged = {"released": sum(r.get("released", 0) for r in rows),
              "seconds": round(max((r.get("seconds", 0.0) for r in rows), default=0.0), 6),
              "held": sum(r.get("held", 0) for r in rows),
              "supported": any(r.get("supported") for r in rows),
              "measure": ",".join(sorted({r["measure"] for r in rows if r.get("measure")})) or None}
    rec = _record(engine)
    with _lock:
        rec.last = merged
        rec.rss_measured += merged["measure"] == "rss"
        if not merged["supported"]:
            rec.unsupported += 1
        elif merged["released"]:
            rec.releases += 1
            rec.released += merged["released"]
            rec.seconds += merged["seconds"]
    return merged


def note_error(engine, exc: BaseException) -> None:
    rec = _record(engine)
    with _lock:
        rec.errors += 1
        rec.last = {"error": f"{type(exc).__name__}: {exc}"}


def last(engine) -> dict | None:
    st = guard.state_for(engine, create=False)
    rec = st.host_memory if st is not None else None
    return None if rec is None else rec.last


def report() -> dict:
    recs = _records()
    return {"releases": sum(r.releases for r in recs), "released_bytes": sum(r.released for r in recs),
            "release_seconds": round(sum(r.seconds for r in recs), 4),
            "unsupported": sum(r.unsupported for r in recs), "errors": sum(r.errors for r in recs),
            "rss_measured": sum(r.rss_measured for r in recs)}


def _failed(engine, exc: BaseException) -> None:
    import logging

    note_error(engine, exc)
    first = _record(engine).errors == 1
    logging.getLogger("colo_shim.vllm").log(
        logging.WARNING if first else logging.DEBUG,
        "colo_shim.vllm: returning cached pinned host memory failed (%s: %s); the level-2 sleep still runs",
        type(exc).__name__, exc)


# The RPC runs torch's private allocator calls in every worker, where they may be missing or fail
# (another torch, a dead worker): an expected failure, counted in this record's errors and not worth
# stopping the sleep for. What the driver does with the answer (note) is colo-shim's own: an error
# there reaches the wrapper's core/guard step (shim_errors), under WHAT.
WHAT = "vllm: returning cached pinned host memory"


def release(engine) -> None:
    """Before a level-2 sleep of a synchronous engine (vLLM's LLM)."""
    try:
        results = engine.collective_rpc(release_rpc)
    except Exception as exc:  # noqa: BLE001 - any failure in the workers; see above
        _failed(engine, exc)
        return
    note(engine, results)


async def release_async(engine) -> None:
    """Before a level-2 sleep of vLLM's AsyncLLM."""
    try:
        results = await engine.collective_rpc(release_rpc)
    except Exception as exc:  # noqa: BLE001 - any failure in the workers; see above
        _failed(engine, exc)
        return
    note(engine, results)
