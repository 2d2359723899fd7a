"""Test double of NeMo-RL main (7ea279abf) nemo_rl/algorithms/grpo_sync.py (grpo_train_sync, validate_sync).

As in v0.7.0, but `master_config` is grpo's pydantic MasterConfig (imported from grpo, as upstream):
`master_config.grpo` is a GRPOConfig read by attribute, also inside the SyncRolloutActor, which
receives the pickled model. grpo_train_sync's body (DAPO filtering in the trainer included):
nemo_rl_common/loops.py, defined here by release.define.
"""

from __future__ import annotations

import os  # noqa: F401 (read by the shared body)
from typing import Any

import ray  # noqa: F401
import torch  # noqa: F401

from nemo_rl.algorithms.grpo import MasterConfig, dynamic_sampling, refit_policy_generation  # noqa: F401
from nemo_rl.algorithms.utils import calculate_baseline_and_std_per_prompt, repeat_batch  # noqa: F401
from nemo_rl.experience.sync_rollout_actor import SyncRolloutActor  # noqa: F401
from nemo_rl_common import grpo as _shared
from nemo_rl_common import loops as _loops
from nemo_rl_common.release import define

_field = _shared.attr  # section values: pydantic sections


def validate_sync(policy_generation, val_dataloader, tokenizer, val_task_to_env, step: int, master_config,
                  logger=None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Caller owns prepare_for_generation / finish_generation around the call."""
    return _shared.validation_results(policy_generation, val_dataloader, tokenizer, val_task_to_env,
                                      master_config.policy["max_total_sequence_length"], {})


define(globals(), _loops.grpo_train_sync)
