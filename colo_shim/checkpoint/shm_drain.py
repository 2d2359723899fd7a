"""Keep NVRx's shm drain installed after every close, so no checkpoint holds the next step's values.

NVRx's CPU shared-memory path (`use_cpu_shm_for_gpu_tensors`, megatron's `--async-ckpt-use-cpu-shm`;
0.7.0 routes host tensors through it too) copies each save into /dev/shm buffers that it caches and
reuses for the next save of the same structure. Its only guard against overwriting buffers a
write still reads is the drain callback that AsyncCallsQueue.__init__ installs in cpu_shm_mode;
close() (0.6.0 and 0.7.0) removes it and no restart puts it back. So after any close and reuse
(terminate-and-resume, NeMo-RL main's refit, the restart release, a dead worker) the third save
wrote into the buffers the second was still writing. The shim puts a drain back at every schedule
of every NVRx queue, and after a close while another queue still has a write pending.
"""

from __future__ import annotations

import sys

from colo_shim.checkpoint import state

_FS = "nvidia_resiliency_ext.checkpointing.async_ckpt.filesystem_async"
_stats = {"drain_installs": 0, "drained": 0}


def ensure_drain() -> None:
    """Keep a drain installed for every save that follows: called at each schedule and after a close.

    One slot for the process; installed only when it holds something else, so never twice.
    """
    writer = getattr(sys.modules.get(_FS), "FileSystemWriterAsync", None)
    if writer is None or not hasattr(writer, "register_shm_drain_callback"):
        return
    if getattr(writer, "_shm_drain_callback", None) is not _drain:
        writer.register_shm_drain_callback(_drain)
        _stats["drain_installs"] += 1


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
            _stats["drained"] += fence._finalize(queue, fence.Wait())


def report() -> dict:
    """Shown in the nvrx family's details: how often the drain was put back, and how many saves it finished."""
    return {"shm_drain": dict(_stats)}
