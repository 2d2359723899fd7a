"""Test double of NeMo-RL v0.7.0 nemo_rl/algorithms/ppo.py (ppo_train with critic warm-up, validate).

Upstream's generation call order: refit when POLICY_GENERATION_STALE else offload_after_refit +
prepare; rollouts; finish_generation(); the critic always trains; the policy trains (and the
generation turns stale) only once `total_steps >= policy_training_start_step`, so warm-up
finishes are followed by a plain prepare_for_generation(), not a refit.
"""

from __future__ import annotations

from typing import Any


from nemo_rl.algorithms.grpo import refit_policy_generation
from nemo_rl.algorithms.utils import repeat_batch
from nemo_rl.experience.rollouts import run_multi_turn_rollout
from nemo_rl_common import grpo as _shared


def validate(policy_generation, val_dataloader, tokenizer, val_task_to_env, step: int, master_config,
             logger=None) -> tuple[dict[str, Any], dict[str, Any]]:
    return _shared.validation_results(policy_generation, val_dataloader, tokenizer, val_task_to_env,
                                      master_config.policy["max_total_sequence_length"], {})


def ppo_train(policy, policy_generation, value_model, dataloader, val_dataloader, tokenizer, loss_fn, value_loss_fn,
              task_to_env, val_task_to_env, logger, checkpointer, ppo_save_state, master_config) -> None:
    NEED_REFIT = True
    POLICY_GENERATION_STALE = True
    current_step = ppo_save_state["current_step"]
    total_steps = ppo_save_state["total_steps"]
    max_num_steps = master_config.ppo["max_num_steps"]
    policy_training_start_step = master_config.ppo["policy_training_start_step"]
    val_period = master_config.ppo["val_period"]
    colocated_inference = master_config.policy["generation"]["colocated"]["enabled"]
    if master_config.ppo["val_at_start"] and current_step == 0:
        POLICY_GENERATION_STALE = _shared.refit_or_prepare(refit_policy_generation, policy, policy_generation,
                                                           colocated_inference, NEED_REFIT, POLICY_GENERATION_STALE,
                                                           offload=False)
        validate(policy_generation, val_dataloader, tokenizer, val_task_to_env, step=0, master_config=master_config)
        policy_generation.finish_generation()
    for batch in dataloader:
        POLICY_GENERATION_STALE = _shared.refit_or_prepare(refit_policy_generation, policy, policy_generation,
                                                           colocated_inference, NEED_REFIT, POLICY_GENERATION_STALE)
        repeated_batch = repeat_batch(batch, master_config.ppo["num_generations_per_prompt"])
        repeated_batch, _ = run_multi_turn_rollout(policy_generation, repeated_batch, tokenizer, task_to_env,
                                                   max_seq_len=master_config.policy["max_total_sequence_length"],
                                                   greedy=False)
        policy_generation.finish_generation()
        value_model.prepare_for_training()
        value_model.train(repeated_batch, value_loss_fn)
        value_model.finish_training()
        if total_steps >= policy_training_start_step:
            policy.prepare_for_training()
            POLICY_GENERATION_STALE = True
            policy.train(repeated_batch, loss_fn)
            policy.finish_training()
        if val_period > 0 and (total_steps + 1) % val_period == 0:
            POLICY_GENERATION_STALE = _shared.refit_or_prepare(refit_policy_generation, policy, policy_generation,
                                                               colocated_inference, NEED_REFIT, POLICY_GENERATION_STALE)
            validate(policy_generation, val_dataloader, tokenizer, val_task_to_env, step=total_steps + 1,
                     master_config=master_config)
            policy_generation.finish_generation()
        current_step += 1
        total_steps += 1
        if total_steps >= max_num_steps:
            break
