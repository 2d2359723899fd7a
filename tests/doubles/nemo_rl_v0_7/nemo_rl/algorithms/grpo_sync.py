"""Test double of NeMo-RL v0.7.0 nemo_rl/algorithms/grpo_sync.py (grpo_train_sync, validate_sync).

The trainer re-imports refit_policy_generation from grpo by name and drives validation itself
(validate_sync, then finish_generation() with no refit), while each step's rollout and its
finish_generation() run inside the SyncRolloutActor Ray actor; DAPO filters in the trainer.
grpo_train_sync's body: nemo_rl_common/loops.py, defined here by release.define; v0.7.0's
`master_config.grpo` is a dict (item access).
"""

from __future__ import annotations

import os  # noqa: F401 (read by the shared body)
from typing import Any

import ray  # noqa: F401 (read by the shared body)
import torch  # noqa: F401

from nemo_rl.algorithms.grpo import dynamic_sampling, refit_policy_generation  # noqa: F401
from nemo_rl.algorithms.utils import calculate_baseline_and_std_per_prompt, repeat_batch  # noqa: F401
from nemo_rl.experience.sync_rollout_actor import SyncRolloutActor
from nemo_rl_common import grpo as _shared
from nemo_rl_common import loops as _loops
from nemo_rl_common.release import define

_field = _shared.item  # section values: v0.7.0's sections are dicts


def validate_sync(policy_generation, val_dataloader, tokenizer, val_task_to_env, step: int, master_config,
                  logger=None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Caller owns prepare_for_generation / finish_generation around the call."""
    return _shared.validation_results(policy_generation, val_dataloader, tokenizer, val_task_to_env,
                                      master_config.policy["max_total_sequence_length"], {})


define(globals(), _loops.grpo_train_sync)
