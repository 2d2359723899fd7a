"""Test double of NeMo-RL v0.3.1 `nemo_rl/models/policy/megatron_policy_worker.py` (also the v0.4 layout).

Mirrors upstream's module path, the `@ray.remote` class `MegatronPolicyWorker` (decorating does not
start Ray) and the signatures of the methods colo-shim wraps. Bodies do to storage what upstream
does, in miniature: `config["model"]` is a real megatron-core DistributedDataParallel or any torch
module, `config["optimizer"]` a real optimizer whose state moves like upstream's loops move it.
"""

from typing import Any, Optional

import ray
import torch


def _device(device: str) -> str:
    return device if device == "cpu" or torch.cuda.is_available() else "cpu"


@ray.remote
class MegatronPolicyWorker:
    def __init__(self, config, tokenizer, weights_path: Optional[str] = None, optimizer_path: Optional[str] = None,
                 init_optimizer: bool = True, init_reference_model: bool = True, *, worker_sharding_annotations,
                 pre_init_communication_queue, **kwargs: Any):
        self.cfg = config
        self.model = config["model"]
        self.optimizer = config.get("optimizer")
        self.events = []

    def prepare_for_lp_inference(self):
        self.model = self.move_model(self.model, "cuda", move_grads=False)
        self.model.eval()
        self.offload_before_refit()

    def prepare_for_training(self, *args, **kwargs):
        self.model = self.move_model(self.model, "cuda", move_grads=True, move_params=True)
        self.model.train()
        self._move_optimizer_state("cuda")
        self.events.append("prepare_for_training")

    def offload_before_refit(self):
        """Offload the optimizer and buffers to the CPU."""
        self.model = self.move_model(self.model, "cpu", move_params=False, move_grads=True)
        self._move_optimizer_state("cpu")
        self.events.append("offload_before_refit")

    def offload_after_refit(self):
        self.model = self.move_model(self.model, "cpu")
        self.model.eval()
        self.events.append("offload_after_refit")

    @torch.no_grad()
    def move_model(self, model, device: str, move_params=True, move_grads=True):
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

    def _move_optimizer_state(self, device: str):
        if self.optimizer is None:
            return
        for state in self.optimizer.state.values():
            for k, v in state.items():
                if isinstance(v, torch.Tensor):
                    state[k] = v.to(_device(device))

    def save_checkpoint(self, weights_path: str, optimizer_path: Optional[str] = None, **kwargs):
        raise NotImplementedError("v0.3 saves synchronously; tests drive NVRx directly")
