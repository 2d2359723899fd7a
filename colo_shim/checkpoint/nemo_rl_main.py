"""NeMo-RL main (PR #3322) stays async with COLO_SHIM_NVRX_RELEASE=stage (issue 16 item 4).

CONTRACT (what a class must look like for this patch to apply, and what it reads):
- Module `nemo_rl.models.policy.workers.megatron_policy_worker` defines a class
  `MegatronPolicyWorkerImpl` with a method `finalize_async_save(self)` (no other arguments). The
  patch wraps that method (and, through core/ray_actors.py, every `@ray.remote` subclass such as
  main's `MegatronPolicyWorker`). No such method (NeMo-RL before PR #3322): the target reports
  target-missing (not required) and nothing changes.
- An "offload call" is a call of `finalize_async_save` made, on the same thread, while a method
  named `offload_before_refit` or `offload_after_refit` of the same instance (`self`) is running
  (found on the Python stack, up to 16 frames up). Every other call (main's checkpointer thread via
  `Policy.finalize_async_save` -> `begin_finalization(wait_fn=...)`, `checkpointer.shutdown()` at
  exit, a direct call) is a "waiting call".
- "Host-only": the stage strategy is on (COLO_SHIM_NVRX_RELEASE=stage, read at call time) and, for
  every checkpoint queue this process knows (colo_shim.checkpoint.state.live_queues(): NVRx
  AsyncCallsQueue instances, megatron.training.async_utils._async_calls_queue, Megatron-Bridge
  GlobalState queues), state.must_wait(queue) is False: its worker was never sent CUDA tensors and
  every pending save holds only snapshotted host data. With torch.distributed initialized and more
  than one rank, the ranks agree by one all_reduce(MIN) (CUDA tensor under NCCL), because main's
  finalize runs collectives and every rank must take the same branch.
- Offload call, host-only: returns None at once; nothing waited, closed or cleaned. The write goes
  on; it is finalized by main's own next finalize (the checkpointer's wait_fn, or save_checkpoint's
  leading blocking maybe_finalize_async_save).
- Waiting call, host-only: main's method runs and waits as it does, but with
  `self._async_checkpoint_cuda_cache_active` set to False for the duration of the call (restored
  after), so main passes terminate=False and skips cleanup_tensor_caches/gc/ipc_collect/empty_cache:
  the worker and the staged /dev/shm buffers stay for the next save. An instance without that
  attribute is called unchanged.
- Not host-only (another strategy, a save that went through CUDA IPC, an unknown queue): main's
  method runs unchanged, both kinds of call.
- A failure of the shim's own decision logs a warning and runs main's method unchanged.
- What a harness must also have: the `megatron` family on (COLO_SHIM=1 or a list naming it) and
  the class in that module when the module finishes importing (the patch is a post-import hook);
  saves through NVRx queues (megatron-core `--async-strategy nvrx` / Megatron-Bridge nvrx): a
  queue the nvrx family does not see scheduling (megatron-core's own AsyncCallsQueue) counts as
  "may hold CUDA" and keeps main's code unchanged. Counters: colo_shim.status() row `megatron`,
  details["nemo_rl_main"] = {offload_skipped, release_kept, unchanged}.

WHY: main calls finalize_async_save first in both refit offloads: a blocking finalize, then (when
`_requires_nvrx_cuda_cache_release()`) close the writer and FileSystemWriterAsync.cleanup_tensor_caches(),
which also drops the shared-memory cache. Under stage the worker holds no CUDA memory, so that
wait buys nothing and the release makes every save pay the first-save staging cost again. The
waiting calls must still wait: main renames tmp_step_N to step_N, and prunes old checkpoints,
right after its wait_fn returns. Note: in main's grpo loop the checkpointer thread usually
submits its finalize_async_save to the actor before the next refit's offload, and a default Ray
actor runs one call at a time, so the actor may still wait there (without releasing, now).
"""

from __future__ import annotations

import logging
import sys

from colo_shim.checkpoint import state

log = logging.getLogger("colo_shim.megatron")

OFFLOADS = ("offload_before_refit", "offload_after_refit")
_FLAG = "_async_checkpoint_cuda_cache_active"
_DEPTH = 16
_stats = {"offload_skipped": 0, "release_kept": 0, "unchanged": 0}


def _in_offload(instance) -> bool:
    frame = sys._getframe(2)
    for _ in range(_DEPTH):
        if frame is None:
            return False
        if frame.f_code.co_name in OFFLOADS and frame.f_locals.get("self") is instance:
            return True
        frame = frame.f_back
    return False


def host_only() -> bool:
    """This rank's verdict: stage is on and no queue it knows has a write that may hold CUDA memory."""
    from colo_shim.checkpoint import stage

    return stage.active() and not any(state.must_wait(q) for q in state.live_queues())


def _agreed(mine: bool) -> bool:
    """Every rank takes the same branch: main's finalize runs collectives."""
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
        return mine
    device = f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"
    flag = torch.tensor([1 if mine else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def finalize_async_save(wrapped, instance, args, kwargs):
    from colo_shim.checkpoint import stage

    if not stage.active():  # the same on every rank (env): no collective added to main's path
        _stats["unchanged"] += 1
        return wrapped(*args, **kwargs)
    try:
        offload = _in_offload(instance)
        skip = _agreed(host_only())
    except Exception as exc:  # the shim's own logic never decides against main's code
        log.warning("colo_shim: NeMo-RL finalize_async_save left unchanged: %s: %s", type(exc).__name__, exc)
        skip = offload = False
    if not skip or (not offload and not hasattr(instance, _FLAG)):
        _stats["unchanged"] += 1
        return wrapped(*args, **kwargs)
    if offload:
        _stats["offload_skipped"] += 1
        log.info("colo_shim: offload leaves %d host-only checkpoint write(s) writing (stage)",
                 sum(state.pending(q) for q in state.live_queues()))
        return None
    active = getattr(instance, _FLAG)
    setattr(instance, _FLAG, False)  # main then finalizes with terminate=False and keeps its caches
    try:
        _stats["release_kept"] += 1
        return wrapped(*args, **kwargs)
    finally:
        if getattr(instance, _FLAG) is False:
            setattr(instance, _FLAG, active)


def report() -> dict:
    return {"nemo_rl_main": dict(_stats)}
