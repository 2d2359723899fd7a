"""NeMo-RL main (PR #3322): its offloads neither wait for the checkpoint write nor end the writer.

CONTRACT (what a class must look like for this patch to apply, and what it reads):
- Module `nemo_rl.models.policy.workers.megatron_policy_worker` defines a class
  `MegatronPolicyWorkerImpl` with a method `finalize_async_save(self)` (no other arguments). The
  patch wraps that method (and, through core/ray_actors.py, every `@ray.remote` subclass such as
  main's `MegatronPolicyWorker`). No such method (NeMo-RL before PR #2828): the target reports
  target-missing (not required) and nothing changes. From #2828 to #3322 main has the method but
  neither the instance flag nor offloads that call it: every call is a waiting call, run unchanged.
- An "offload call" is a call of `finalize_async_save` made, on the same thread, while a method
  named `offload_before_refit` or `offload_after_refit` of the same instance (`self`) is running
  (found on the Python stack, up to 16 frames up). Every other call (main's checkpointer thread via
  `Policy.finalize_async_save` -> `begin_finalization(wait_fn=...)`, `checkpointer.shutdown()` at
  exit, a direct call) is a "waiting call".
- "Releasing": COLO_SHIM_NVRX_RELEASE is inplace (the default; `stage`, retired, runs as inplace)
  and the installed NVRx is 0.6.0 or 0.7.0 (release.skips_upstream_finalize()). Read from the
  environment and the installed package only, never from this rank's writers: every rank decides
  alike with no collective.
- Offload call, releasing: colo-shim's fence runs (the writer drops its CUDA references while its
  write goes on) and main's method is skipped: nothing waited, finalized, closed or cleaned. The
  write is finalized by main's own next finalize (the checkpointer's wait_fn, or save_checkpoint's
  leading blocking maybe_finalize_async_save).
- Waiting call, releasing: main's method runs and waits as it does, but with
  `self._async_checkpoint_cuda_cache_active` set to False for the duration of the call (restored
  after), so main passes terminate=False and skips cleanup_tensor_caches/gc/ipc_collect/empty_cache:
  the worker stays warm for the next save (its CUDA references are the fence's business). An
  instance without that attribute is called unchanged. The driver sends this call only once the
  worker said its write is done (checkpoint/nemo_rl_driver.py), so it no longer holds the actor.
- Not releasing (restart, none, another NVRx): main's method runs unchanged, both kinds of call.
- A failure of colo-shim's own part (deciding, the fence, the release, the bookkeeping) logs one
  warning and runs main's method unchanged, in its place and order: main's finalize, close and
  cleanup all still run, and nothing of colo-shim's raises into the offload (core/guard.py). The
  errors main's own method raises (a failed write, a dead writer) are main's and propagate as they
  would without colo-shim. Only COLO_SHIM_STRICT=1 lets colo-shim's own error through.
- What a harness must also have: the `megatron` family on (COLO_SHIM=1 or a list naming it) and
  the class in that module when the module finishes importing (the patch is a post-import hook);
  saves through NVRx queues (megatron-core `--async-strategy nvrx` / Megatron-Bridge nvrx).
  Counters: colo_shim.status() row `megatron`, details["nemo_rl_main"] = {offload_skipped,
  release_kept, unchanged}.

WHY: main calls finalize_async_save first in both refit offloads: a blocking finalize, then (when
`_requires_nvrx_cuda_cache_release()`) close the writer and FileSystemWriterAsync.cleanup_tensor_caches().
With colo-shim's release the writer holds no GPU memory once the fence ran, so that wait buys
nothing and the close makes every next save boot a worker. Both call orders give every rank the same
collectives: an offload call runs none, a waiting call runs main's finalize, whichever comes first
on a rank (main's checkpointer thread and its training loop reach each Ray actor in their own order).
The waiting calls must still wait: main renames tmp_step_N to step_N, and prunes old checkpoints,
right after its wait_fn returns.
"""

from __future__ import annotations

import logging
import sys

from colo_shim.checkpoint import fence, release, state
from colo_shim.core import guard

log = logging.getLogger("colo_shim.megatron")

OFFLOADS = ("offload_before_refit", "offload_after_refit")
_FLAG = "_async_checkpoint_cuda_cache_active"
_DEPTH = 16
_stats = {"offload_skipped": 0, "release_kept": 0, "unchanged": 0}


def _in_offload(instance) -> bool:
    frame = sys._getframe(1)
    for _ in range(_DEPTH + 4):  # + the frames between the wrapper and here (guard, _kind)
        if frame is None:
            return False
        if frame.f_code.co_name in OFFLOADS and frame.f_locals.get("self") is instance:
            return True
        frame = frame.f_back
    return False


def finalize_async_save(wrapped, instance, args, kwargs):
    def upstream():
        return wrapped(*args, **kwargs)

    kind = guard.step("megatron: NeMo-RL finalize_async_save decision", _kind, instance, default="unchanged")
    if kind == "offload":
        return guard.instead("megatron: NeMo-RL offload fence", _fence_instead, upstream)
    if kind == "waiting":
        return _keep_warm(instance, upstream)
    _stats["unchanged"] += 1
    return upstream()


def _kind(instance) -> str:
    if not release.skips_upstream_finalize():
        return "unchanged"
    if _in_offload(instance):
        return "offload"
    return "waiting" if hasattr(instance, _FLAG) else "unchanged"


def _fence_instead() -> None:
    """In place of main's blocking finalize + close + cleanup: the fence alone (the write goes on)."""
    fence.fence("nemo_rl main finalize_async_save (offload)")
    log.info("colo_shim: offload leaves %d checkpoint write(s) writing",
             sum(state.pending(q) for q in state.live_queues()))
    _stats["offload_skipped"] += 1


def _keep_warm(instance, upstream):
    """Main's waiting call as it is, with terminate off for its duration: the worker stays warm."""
    active = guard.step("megatron: NeMo-RL keep the writer warm", _flag_off, instance, default=_UNSET)
    if active is _UNSET:
        _stats["unchanged"] += 1
        return upstream()
    _stats["release_kept"] += 1
    try:
        return upstream()
    finally:
        guard.step("megatron: NeMo-RL restore the release flag", _flag_back, instance, active)


_UNSET = object()


def _flag_off(instance):
    active = getattr(instance, _FLAG)
    setattr(instance, _FLAG, False)  # main then finalizes with terminate=False and keeps its caches
    return active


def _flag_back(instance, active) -> None:
    if getattr(instance, _FLAG) is False:
        setattr(instance, _FLAG, active)


def report() -> dict:
    return {"nemo_rl_main": dict(_stats)}
