"""Test double of NeMo-RL main (7ea279abf) nemo_rl/algorithms/ppo.py (configs, ppo_train, validate).

main's PPO configs are pydantic (PR #2518): `MasterConfig(BaseModel, extra="allow")` with
`ppo: PPOConfig(BaseModel, extra="allow")` (read by attribute; upstream's defaults, among them
`use_dynamic_sampling=False` and `policy_training_start_step=0`) and `policy` a plain dict.
ppo_train's body and generation call order: nemo_rl_common/loops.py, defined here.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from nemo_rl.algorithms.grpo import refit_policy_generation  # noqa: F401 (read by the shared body)
from nemo_rl.algorithms.utils import repeat_batch  # noqa: F401
from nemo_rl.experience.rollouts import run_multi_turn_rollout  # noqa: F401
from nemo_rl_common import grpo as _shared
from nemo_rl_common import loops as _loops
from nemo_rl_common.release import define


class PPOConfig(BaseModel, extra="allow"):
    num_prompts_per_step: int = 32
    num_generations_per_prompt: int = 16
    max_num_epochs: int = 100000
    max_num_steps: int = 100000
    max_rollout_turns: int = 1
    val_period: int = 20
    val_at_start: bool = True
    use_dynamic_sampling: bool = False
    dynamic_sampling_max_gen_batches: int = 10
    policy_training_start_step: int = 0


class MasterConfig(BaseModel, extra="allow"):
    policy: dict[str, Any]  # upstream: PolicyConfig, a TypedDict
    ppo: PPOConfig


_field = _shared.attr  # section values: pydantic sections


def validate(policy_generation, val_dataloader, tokenizer, val_task_to_env, step: int, master_config,
             logger=None) -> tuple[dict[str, Any], dict[str, Any]]:
    return _shared.validation_results(policy_generation, val_dataloader, tokenizer, val_task_to_env,
                                      master_config.policy["max_total_sequence_length"], {})


define(globals(), _loops.ppo_train)
