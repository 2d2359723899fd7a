"""Test double of NeMo-RL v0.7.0 `nemo_rl/models/policy/workers/megatron_policy_worker.py`.

Since v0.6 the code lives in the plain class `MegatronPolicyWorkerImpl`; `MegatronPolicyWorker` is a thin
`@ray.remote` subclass (decorating does not start Ray). Signatures of the wrapped
methods are upstream's; bodies move real storage in miniature: `config["model"]` is a real
megatron-core DistributedDataParallel or any torch module, `config["optimizer"]` a real optimizer.
"""

from typing import Any, Optional

import ray
from nemo_rl.models.policy import PolicyConfig
from nemo_rl_common.megatron_policy_worker import MegatronPolicyWorkerV05, init_storage


class MegatronPolicyWorkerImpl(MegatronPolicyWorkerV05):
    def __init__(self, config: PolicyConfig, tokenizer, weights_path: Optional[str] = None, optimizer_path: Optional[str] = None,
                 init_optimizer: bool = True, init_reference_model: bool = True, *, worker_sharding_annotations,
                 **kwargs: Any):
        init_storage(self, config)

    def save_checkpoint(self, weights_path: str, optimizer_path: Optional[str] = None, **kwargs):
        raise NotImplementedError("v0.7 saves synchronously; tests drive NVRx directly")


@ray.remote
class MegatronPolicyWorker(MegatronPolicyWorkerImpl):
    pass
