"""Test double of NeMo-RL main (2026-08) `nemo_rl/models/policy/workers/megatron_policy_worker.py`.

main adds `finalize_async_save()` (PR #3322), called first in offload_before_refit and
offload_after_refit: it finalizes the async save (Megatron-Bridge's maybe_finalize_async_save,
blocking, terminate when the writer cached CUDA tensors), then cleanup_tensor_caches, gc,
ipc_collect, empty_cache. Here the queue is the real NVRx AsyncCallsQueue a test puts in
`async_calls_queue` (upstream keeps it in Megatron-Bridge's GlobalState).

Since v0.6 the code lives in the plain class `MegatronPolicyWorkerImpl`; `MegatronPolicyWorker` is a thin
`@ray.remote` subclass (decorating does not start Ray). Signatures of the wrapped
methods are upstream's; bodies move real storage in miniature: `config["model"]` is a real
megatron-core DistributedDataParallel or any torch module, `config["optimizer"]` a real optimizer.
"""

import gc
from typing import Any, Optional

import ray
import torch


def _device(device: str) -> str:
    return device if device == "cpu" or torch.cuda.is_available() else "cpu"


class MegatronPolicyWorkerImpl:
    def __init__(self, config, tokenizer, weights_path: Optional[str] = None, optimizer_path: Optional[str] = None,
                 init_optimizer: bool = True, init_reference_model: bool = True, *, worker_sharding_annotations,
                 skip_weight_load: bool = False, **kwargs: Any):
        self.cfg = config
        self.model = config["model"]
        self.optimizer = config.get("optimizer")
        self.events = []
        self.async_calls_queue = None
        self._async_checkpoint_cuda_cache_active = False

    def prepare_for_lp_inference(self, keep_train_buffers: bool = False) -> None:
        self.model = self.move_model(self.model, "cuda", move_grads=False)
        self.model.eval()
        if not keep_train_buffers:
            self.move_optimizer("cpu")

    def prepare_for_training(self, *args, **kwargs):
        self.model = self.move_model(self.model, "cuda", move_grads=True, move_params=True)
        self.model.train()
        self.move_optimizer("cuda")
        self.events.append("prepare_for_training")

    def offload_before_refit(self):
        """Offload the optimizer and buffers to the CPU."""
        self.finalize_async_save()
        self.model = self.move_model(self.model, "cpu", move_params=False, move_grads=True)
        self.move_optimizer("cpu")
        self.events.append("offload_before_refit")

    def offload_after_refit(self):
        """Offload as much as possible on the CPU."""
        self.finalize_async_save()
        self.model = self.move_model(self.model, "cpu")
        self.model.eval()
        self.events.append("offload_after_refit")

    @torch.no_grad()
    def move_model(self, model: torch.nn.Module, device: str, move_params: bool = True,
                   move_grads: bool = True) -> torch.nn.Module:
        buffers = getattr(model, "buffers", None)
        if isinstance(buffers, list):  # megatron-core DDP: upstream walks its buffers
            for buffer in buffers + list(getattr(model, "expert_parallel_buffers", [])):
                if device == "cpu":
                    buffer.offload_to_cpu(move_params=move_params, move_grads=move_grads)
                else:
                    buffer.reload_from_cpu(move_params=move_params, move_grads=move_grads)
        elif move_params:
            model.to(_device(device))
        return model

    def move_optimizer(self, device: str):
        if self.optimizer is None:
            return
        for state in self.optimizer.state.values():
            for k, v in state.items():
                if isinstance(v, torch.Tensor):
                    state[k] = v.to(_device(device))
        self.events.append(f"move_optimizer({device})")

    def save_checkpoint(self, weights_path: str, optimizer_path: Optional[str] = None, **kwargs):
        raise NotImplementedError("tests drive NVRx directly and mark CUDA-cache use")

    def finalize_async_save(self):
        """Finalize an async write and release the writer's CUDA IPC cache when it has one."""
        queue = self.async_calls_queue
        if queue is None:
            return
        release = self._async_checkpoint_cuda_cache_active
        queue.maybe_finalize_async_calls(blocking=True, no_dist=True)
        if release:
            queue.close()
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


@ray.remote
class MegatronPolicyWorker(MegatronPolicyWorkerImpl):
    pass
