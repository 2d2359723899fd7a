"""STAND-IN, not NeMo-RL: the one method bench/offload measures, at NeMo-RL main's module path.

`MegatronPolicyWorkerImpl.move_optimizer` is NeMo-RL main's body (read 2026-08,
nemo_rl/models/policy/workers/megatron_policy_worker.py): per optimizer state tensor
`v.to("cpu")` / `v.to("cuda")`, Adam state only (the fp32 main params stay on the GPU). It lives at
NeMo-RL's module and class names so that colo-shim's offload family patches it as it patches the
real worker; everything else of the real worker (Ray, Megatron-Bridge, the model setup) is left out.
"""

import torch
from megatron.core.optimizer import ChainedOptimizer


class MegatronPolicyWorkerImpl:
    def __init__(self, optimizer):
        self.optimizer = optimizer

    def move_optimizer(self, device: str):
        """What NeMo-RL main does: a ChainedOptimizer's `state`, else `_get_state()`; each tensor not
        already there moves with `.to(device)`, one synchronous copy into fresh memory at a time."""
        if device not in ("cpu", "cuda"):
            raise ValueError(f"Invalid device: {device}")
        chained = isinstance(self.optimizer, ChainedOptimizer)
        for _, state in (self.optimizer.state if chained else self.optimizer._get_state()).items():
            for key, value in state.items():
                if torch.is_tensor(value) and value.is_cuda == (device == "cpu"):
                    state[key] = value.to(device)
