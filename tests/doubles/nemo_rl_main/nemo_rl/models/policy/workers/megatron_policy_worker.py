"""Test double of NeMo-RL main (2026-08) `nemo_rl/models/policy/workers/megatron_policy_worker.py`.

main adds `finalize_async_save()` (PR #3322), called first in offload_before_refit and
offload_after_refit: it finalizes the async save (Megatron-Bridge's maybe_finalize_async_save,
blocking, terminate=release), and on release cleanup_tensor_caches, gc, ipc_collect, empty_cache;
release = `_async_checkpoint_cuda_cache_active and _requires_nvrx_cuda_cache_release()` (async nvrx,
persistent worker, constant structure, not async_ckpt_use_cpu_shm, colocated), the flag set by
save_checkpoint. save_checkpoint keeps main's order: set the flag, blocking finalize of the previous
save, then the save. Here the queue is the real NVRx AsyncCallsQueue a test puts in
`async_calls_queue` (upstream keeps it in Megatron-Bridge's GlobalState), `config["checkpoint"]`
holds the Megatron checkpoint config keys main reads (a dict, upstream a dataclass), and the save
itself is the test's `save_fn(weights_path)` (Megatron-Bridge's save_checkpoint is not installed).

Otherwise the layout of v0.7 (plain `MegatronPolicyWorkerImpl`, thin `@ray.remote` subclass). The two refit
offloads carry upstream's `@wrap_with_nvtx_name` (a closure without `__wrapped__`).

NEMO_RL_DOUBLE_MAIN=pre3322 gives main as it was from PR #2828 (async saves, `finalize_async_save`) to the commit
before #3322 (16662da37, 83 commits): offloads that never call `finalize_async_save`, which only waits for the
write (no terminate, no cleanup), and no `_async_checkpoint_cuda_cache_active` / `_requires_nvrx_cuda_cache_release`.
"""

import gc
import os
from typing import Any, Optional

import ray
from nemo_rl.models.policy import PolicyConfig
import torch
from nemo_rl.utils.nsys import wrap_with_nvtx_name
from nemo_rl_common.megatron_policy_worker import MegatronPolicyWorkerV05, init_storage

PRE_3322 = os.environ.get("NEMO_RL_DOUBLE_MAIN") == "pre3322"


class MegatronPolicyWorkerImpl(MegatronPolicyWorkerV05):
    def __init__(self, config: PolicyConfig, tokenizer, weights_path: Optional[str] = None, optimizer_path: Optional[str] = None,
                 init_optimizer: bool = True, init_reference_model: bool = True, *, worker_sharding_annotations,
                 skip_weight_load: bool = False, **kwargs: Any):
        init_storage(self, config)
        self.async_calls_queue = None
        if not PRE_3322:
            self._async_checkpoint_cuda_cache_active = False

    def prepare_for_lp_inference(self, keep_train_buffers: bool = False) -> None:
        """As upstream main: no finalize_async_save here (only the two refit offloads have it);
        the grad buffers go first (move_model cpu, params kept), then the optimizer state."""
        self.model = self.move_model(self.model, "cuda", move_grads=False)
        self.model.eval()
        if not keep_train_buffers:
            self.model = self.move_model(self.model, "cpu", move_params=False, move_grads=True)
        if not keep_train_buffers and getattr(self, "optimizer", None) is not None:
            self.move_optimizer("cpu")

    @wrap_with_nvtx_name("megatron_policy_worker/offload_before_refit")
    def offload_before_refit(self):
        """Offload the optimizer and buffers to the CPU."""
        self.finalize_async_save()
        super().offload_before_refit()

    @wrap_with_nvtx_name("megatron_policy_worker/offload_after_refit")
    def offload_after_refit(self):
        """Offload as much as possible on the CPU."""
        self.finalize_async_save()
        super().offload_after_refit()

    def save_checkpoint(self, weights_path: str, optimizer_path: Optional[str] = None, **kwargs):
        """Returns after scheduling when async (the write goes on in NVRx's worker)."""
        is_async = self.cfg.get("checkpoint", {}).get("async_save", False)
        if is_async and not PRE_3322 and self._requires_nvrx_cuda_cache_release():
            self._async_checkpoint_cuda_cache_active = True
        self._maybe_finalize_async_save(blocking=True)  # the previous save, fully written
        self.save_fn(weights_path)
        if not is_async:
            self._maybe_finalize_async_save(blocking=True)

    def _maybe_finalize_async_save(self, blocking: bool, terminate: bool = False):
        """Megatron-Bridge's maybe_finalize_async_save on the worker's queue: collective across ranks,
        as upstream (no_dist=False); a lone rank uses no_dist, NVRx's collectives needing CUDA there."""
        queue = self.async_calls_queue
        if queue is None:
            return
        multi = torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1
        queue.maybe_finalize_async_calls(blocking=blocking, no_dist=not multi)
        if terminate:
            queue.close()

    def _requires_nvrx_cuda_cache_release(self) -> bool:
        ckpt = self.cfg.get("checkpoint", {})
        colocated = (self.cfg.get("generation") or {}).get("colocated") or {}
        return bool(ckpt.get("async_save") and ckpt.get("async_strategy", "nvrx") == "nvrx"
                    and ckpt.get("use_persistent_ckpt_worker", False)
                    and ckpt.get("ckpt_assume_constant_structure", False)
                    and not ckpt.get("async_ckpt_use_cpu_shm", False) and colocated.get("enabled", False))

    def finalize_async_save(self):
        """Finalize an async write and release the writer's CUDA IPC cache when it has one."""
        release = bool(self._async_checkpoint_cuda_cache_active and self._requires_nvrx_cuda_cache_release())
        self._maybe_finalize_async_save(blocking=True, terminate=release)
        if release:
            from nvidia_resiliency_ext.checkpointing.async_ckpt.filesystem_async import FileSystemWriterAsync

            cleanup = getattr(FileSystemWriterAsync, "cleanup_tensor_caches", None)
            if cleanup is not None:
                cleanup()
            else:
                getattr(FileSystemWriterAsync, "_cached_identifiers", set()).clear()
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.ipc_collect()
                torch.cuda.empty_cache()
            self._async_checkpoint_cuda_cache_active = False
        self.events.append("finalize_async_save")

    if PRE_3322:  # main from #2828 to the commit before #3322: its code names no finalize in the offloads
        del _requires_nvrx_cuda_cache_release

        @wrap_with_nvtx_name("megatron_policy_worker/offload_before_refit")
        def offload_before_refit(self):  # noqa: F811
            """Offload the optimizer and buffers to the CPU."""
            super().offload_before_refit()

        @wrap_with_nvtx_name("megatron_policy_worker/offload_after_refit")
        def offload_after_refit(self):  # noqa: F811
            """Offload as much as possible on the CPU."""
            super().offload_after_refit()

        def finalize_async_save(self):  # noqa: F811
            """Block until the in-flight async write completes; the persistent worker stays alive."""
            self._maybe_finalize_async_save(blocking=True)
            self.events.append("finalize_async_save")


@ray.remote
class MegatronPolicyWorker(MegatronPolicyWorkerImpl):
    pass
