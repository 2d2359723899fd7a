"""Test double of NeMo-RL v0.5.0 `nemo_rl/models/policy/workers/megatron_policy_worker.py`.

v0.5 moved the module under `workers/` and added `move_optimizer(device)`; the class is still
`@ray.remote class MegatronPolicyWorker` (decorating does not start Ray). Signatures of the wrapped
methods are upstream's; bodies move real storage in miniature: `config["model"]` is a real
megatron-core DistributedDataParallel or any torch module, `config["optimizer"]` a real optimizer.
"""

from typing import Any, Optional

import ray
from nemo_rl.models.policy import PolicyConfig
from nemo_rl_common.megatron_policy_worker import MegatronPolicyWorkerV05, init_storage


@ray.remote
class MegatronPolicyWorker(MegatronPolicyWorkerV05):
    def __init__(self, config: PolicyConfig, tokenizer, weights_path: Optional[str] = None, optimizer_path: Optional[str] = None,
                 init_optimizer: bool = True, init_reference_model: bool = True, *, worker_sharding_annotations,
                 pre_init_communication_queue, **kwargs: Any):
        init_storage(self, config)

    def save_checkpoint(self, weights_path: str, optimizer_path: Optional[str] = None, **kwargs):
        raise NotImplementedError("v0.5 saves synchronously; tests drive NVRx directly")
