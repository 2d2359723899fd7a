"""Test double of NeMo-RL v0.7.0 nemo_rl/algorithms/ppo.py (ppo_train with critic warm-up, validate).

v0.7.0's PPOConfig is a TypedDict: `master_config.ppo` is a dict (item access). ppo_train's body
and its generation call order (critic warm-up finishes are followed by a plain
prepare_for_generation(), not a refit): nemo_rl_common/loops.py, defined here by release.define.
"""

from __future__ import annotations

from typing import Any


from nemo_rl.algorithms.grpo import refit_policy_generation
from nemo_rl.algorithms.utils import repeat_batch
from nemo_rl.experience.rollouts import run_multi_turn_rollout
from nemo_rl_common import grpo as _shared
from nemo_rl_common import loops as _loops
from nemo_rl_common.release import define

_field = _shared.item  # section values: v0.7.0's sections are dicts


def validate(policy_generation, val_dataloader, tokenizer, val_task_to_env, step: int, master_config,
             logger=None) -> tuple[dict[str, Any], dict[str, Any]]:
    return _shared.validation_results(policy_generation, val_dataloader, tokenizer, val_task_to_env,
                                      master_config.policy["max_total_sequence_length"], {})


define(globals(), _loops.ppo_train)
