"""Test double of NeMo-RL v0.3.1 `nemo_rl/models/policy/megatron_policy_worker.py` (also the v0.4 layout).

Mirrors upstream's module path, the `@ray.remote` class `MegatronPolicyWorker` (decorating does not
start Ray) and the signatures of the methods colo-shim wraps. Bodies do to storage what upstream
does, in miniature: `config["model"]` is a real megatron-core DistributedDataParallel or any torch
module, `config["optimizer"]` a real optimizer whose state moves like upstream's loops move it.
"""

from typing import Any, Optional

import ray
from nemo_rl.models.policy import PolicyConfig
from nemo_rl_common.megatron_policy_worker import init_storage, move_model_storage, move_optimizer_state


@ray.remote
class MegatronPolicyWorker:
    def __init__(self, config: PolicyConfig, tokenizer, weights_path: Optional[str] = None, optimizer_path: Optional[str] = None,
                 init_optimizer: bool = True, init_reference_model: bool = True, *, worker_sharding_annotations,
                 pre_init_communication_queue, **kwargs: Any):
        init_storage(self, config)

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

    def move_model(self, model, device: str, move_params=True, move_grads=True):
        return move_model_storage(model, device, move_params, move_grads)

    def _move_optimizer_state(self, device: str):
        move_optimizer_state(self.optimizer, device)

    def save_checkpoint(self, weights_path: str, optimizer_path: Optional[str] = None, **kwargs):
        raise NotImplementedError("v0.3 saves synchronously; tests drive NVRx directly")
