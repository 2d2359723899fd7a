"""Test double of NeMo-RL v0.7.0 nemo_rl/experience/sync_rollout_actor.py (@ray.remote SyncRolloutActor).

The per-step rollout runs in this Ray actor, in its own process, and ends with
`self.policy_generation.finish_generation()` (unless the trainer passes finish_generation=False);
the trainer's refit runs in the driver. The data-plane (TQ) is replaced by returning the batch.
"""

from __future__ import annotations

from typing import Any, Optional

import ray

from nemo_rl.experience.rollouts import run_multi_turn_rollout


@ray.remote  # pragma: no cover
class SyncRolloutActor:
    def __init__(self, policy_generation, tokenizer: Any, task_to_env: dict, master_config: Any,
                 dp_cfg: dict[str, Any]) -> None:
        self.policy_generation = policy_generation
        self.tokenizer = tokenizer
        self.task_to_env = task_to_env
        self.master_config = master_config

    def rollout_to_tq(self, input_batch, *, partition_id: str, group_size: int = 1, first_iter: bool = True,
                      finish_generation: bool = True, task_to_env_override: Optional[dict] = None,
                      carry_keys: Optional[list[str]] = None):
        batch, metrics = run_multi_turn_rollout(
            policy_generation=self.policy_generation, input_batch=input_batch, tokenizer=self.tokenizer,
            task_to_env=task_to_env_override or self.task_to_env,
            max_seq_len=self.master_config.policy["max_total_sequence_length"], greedy=False)
        if finish_generation:
            self.policy_generation.finish_generation()
        return batch, metrics

    def task_env(self):
        """Test-only probe: the actor's copy of the environment (not an upstream method)."""
        return self.task_to_env

    def shim_status(self):
        """Test-only probe: colo-shim status in this actor's process (not an upstream method)."""
        import sys

        shim = sys.modules.get("colo_shim")
        return shim.status() if shim is not None else None
