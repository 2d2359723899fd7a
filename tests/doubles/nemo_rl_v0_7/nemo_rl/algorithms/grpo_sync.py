"""Test double of NeMo-RL v0.7.0 nemo_rl/algorithms/grpo_sync.py (grpo_train_sync, validate_sync).

The trainer re-imports refit_policy_generation from grpo by name and drives validation itself
(validate_sync, then finish_generation() with no refit), while each step's rollout and its
finish_generation() run inside the SyncRolloutActor Ray actor.
"""

from __future__ import annotations

import os
from typing import Any

import ray

from nemo_rl.algorithms.grpo import refit_policy_generation
from nemo_rl.algorithms.utils import repeat_batch
from nemo_rl.experience.sync_rollout_actor import SyncRolloutActor
from nemo_rl_common import grpo as _shared


def validate_sync(policy_generation, val_dataloader, tokenizer, val_task_to_env, step: int, master_config,
                  logger=None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Caller owns prepare_for_generation / finish_generation around the call."""
    return _shared.validation_results(policy_generation, val_dataloader, tokenizer, val_task_to_env,
                                      master_config.policy["max_total_sequence_length"], {})


def grpo_train_sync(policy, policy_generation, wrapped_dataloader, val_dataloader, tokenizer, loss_fn, task_to_env,
                    val_task_to_env, logger, checkpointer, grpo_save_state, master_config) -> None:
    NEED_REFIT = True
    POLICY_GENERATION_STALE = True
    total_steps = grpo_save_state["total_steps"]
    max_num_steps = master_config.grpo["max_num_steps"]
    val_period = master_config.grpo["val_period"]
    colocated_inference = master_config.policy["generation"]["colocated"]["enabled"]
    env_vars = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}  # as init_ray / make_actor_runtime_env
    rollout_actor = SyncRolloutActor.options(runtime_env={"env_vars": env_vars}).remote(
        policy_generation, tokenizer, task_to_env, master_config, {})
    if master_config.grpo["val_at_start"] and grpo_save_state["current_step"] == 0:
        refit_policy_generation(policy, policy_generation, colocated_inference)
        POLICY_GENERATION_STALE = False
        validate_sync(policy_generation, val_dataloader, tokenizer, val_task_to_env, step=0, master_config=master_config)
        policy_generation.finish_generation()
    for batch in wrapped_dataloader:
        POLICY_GENERATION_STALE = _shared.refit_or_prepare(refit_policy_generation, policy, policy_generation,
                                                           colocated_inference, NEED_REFIT, POLICY_GENERATION_STALE)
        repeated_batch = repeat_batch(batch, master_config.grpo["num_generations_per_prompt"])
        repeated_batch, _ = ray.get(rollout_actor.rollout_to_tq.remote(
            repeated_batch, partition_id=f"step-{total_steps}", finish_generation=True))
        policy.prepare_for_training()
        POLICY_GENERATION_STALE = True
        policy.train(repeated_batch, loss_fn)
        if val_period > 0 and (total_steps + 1) % val_period == 0:
            POLICY_GENERATION_STALE = _shared.refit_or_prepare(refit_policy_generation, policy, policy_generation,
                                                               colocated_inference, NEED_REFIT, POLICY_GENERATION_STALE,
                                                               offload=False)
            validate_sync(policy_generation, val_dataloader, tokenizer, val_task_to_env, step=total_steps + 1,
                          master_config=master_config)
            policy_generation.finish_generation()
        total_steps += 1
        if total_steps >= max_num_steps:
            break
    grpo_save_state["rollout_actor"] = rollout_actor
