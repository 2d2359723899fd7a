"""Shared bodies of ppo_train (nemo_rl/algorithms/ppo.py) and grpo_train_sync (grpo_sync.py), v0.7.0 and main.

Defined in each release's module by nemo_rl_common.release.define, like nemo_rl_common/grpo.py:
they run in frames of that module (colo-shim's discard policy recognises the loop by them) and
read there, at call time, `refit_policy_generation`, `validate` / `validate_sync`, ... plus
`_field(section, name)`, the release's way to read a config value: item access on v0.7.0's dict
sections (`master_config.ppo["max_num_steps"]`), attribute access on main's pydantic sections
(`master_config.ppo.max_num_steps`, NeMo-RL PR #2518). `master_config.policy` is a dict in both.

Upstream's generation call order is kept:
- ppo_train: refit when POLICY_GENERATION_STALE else offload_after_refit + prepare; rollouts;
  finish_generation(); the critic always trains; the policy trains (and the generation turns
  stale) only once `total_steps >= policy_training_start_step`, so critic warm-up finishes are
  followed by a plain prepare_for_generation(), not a refit. (Upstream's PPOConfig has
  use_dynamic_sampling, but ppo_train never calls dynamic_sampling.)
- grpo_train_sync: each step's rollout and its finish_generation() run inside the SyncRolloutActor
  Ray actor; the trainer refits and validates (validate_sync, then finish_generation() with no
  refit) itself; DAPO (`grpo.use_dynamic_sampling`) filters in the trainer after the actor's finish
  and `continue`s on an incomplete batch without training, as upstream's `_apply_dynamic_sampling`.
"""

from __future__ import annotations

import os

import ray
import torch

from nemo_rl_common import grpo as _shared


def ppo_train(policy, policy_generation, value_model, dataloader, val_dataloader, tokenizer, loss_fn, value_loss_fn,
              task_to_env, val_task_to_env, logger, checkpointer, ppo_save_state, master_config) -> None:
    NEED_REFIT = True
    POLICY_GENERATION_STALE = True
    ppo_cfg = master_config.ppo
    current_step = ppo_save_state["current_step"]
    total_steps = ppo_save_state["total_steps"]
    max_num_steps = _field(ppo_cfg, "max_num_steps")  # noqa: F821 (the release module's)
    policy_training_start_step = _field(ppo_cfg, "policy_training_start_step")  # noqa: F821
    val_period = _field(ppo_cfg, "val_period")  # noqa: F821
    colocated_inference = master_config.policy["generation"]["colocated"]["enabled"]
    if _field(ppo_cfg, "val_at_start") and current_step == 0:  # noqa: F821
        POLICY_GENERATION_STALE = _shared.refit_or_prepare(refit_policy_generation, policy, policy_generation,  # noqa: F821
                                                           colocated_inference, NEED_REFIT, POLICY_GENERATION_STALE,
                                                           offload=False)
        validate(policy_generation, val_dataloader, tokenizer, val_task_to_env, step=0, master_config=master_config)  # noqa: F821
        policy_generation.finish_generation()
    for batch in dataloader:
        POLICY_GENERATION_STALE = _shared.refit_or_prepare(refit_policy_generation, policy, policy_generation,  # noqa: F821
                                                           colocated_inference, NEED_REFIT, POLICY_GENERATION_STALE)
        repeated_batch = repeat_batch(batch, _field(ppo_cfg, "num_generations_per_prompt"))  # noqa: F821
        repeated_batch, _ = run_multi_turn_rollout(policy_generation, repeated_batch, tokenizer, task_to_env,  # noqa: F821
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
            POLICY_GENERATION_STALE = _shared.refit_or_prepare(refit_policy_generation, policy, policy_generation,  # noqa: F821
                                                               colocated_inference, NEED_REFIT, POLICY_GENERATION_STALE)
            validate(policy_generation, val_dataloader, tokenizer, val_task_to_env, step=total_steps + 1,  # noqa: F821
                     master_config=master_config)
            policy_generation.finish_generation()
        current_step += 1
        total_steps += 1
        if total_steps >= max_num_steps:
            break


def grpo_train_sync(policy, policy_generation, wrapped_dataloader, val_dataloader, tokenizer, loss_fn, task_to_env,
                    val_task_to_env, logger, checkpointer, grpo_save_state, master_config) -> None:
    NEED_REFIT = True
    POLICY_GENERATION_STALE = True
    grpo_cfg = master_config.grpo
    total_steps = grpo_save_state["total_steps"]
    max_num_steps = _field(grpo_cfg, "max_num_steps")  # noqa: F821 (the release module's)
    val_period = _field(grpo_cfg, "val_period")  # noqa: F821
    colocated_inference = master_config.policy["generation"]["colocated"]["enabled"]
    env_vars = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}  # as init_ray / make_actor_runtime_env
    rollout_actor = SyncRolloutActor.options(runtime_env={"env_vars": env_vars}).remote(  # noqa: F821
        policy_generation, tokenizer, task_to_env, master_config, {})
    if _field(grpo_cfg, "val_at_start") and grpo_save_state["current_step"] == 0:  # noqa: F821
        refit_policy_generation(policy, policy_generation, colocated_inference)  # noqa: F821
        POLICY_GENERATION_STALE = False
        validate_sync(policy_generation, val_dataloader, tokenizer, val_task_to_env, step=0,  # noqa: F821
                      master_config=master_config)
        policy_generation.finish_generation()
    batch_cache = None
    dynamic_sampling_num_gen_batches = 0
    for batch in wrapped_dataloader:
        POLICY_GENERATION_STALE = _shared.refit_or_prepare(refit_policy_generation, policy, policy_generation,  # noqa: F821
                                                           colocated_inference, NEED_REFIT, POLICY_GENERATION_STALE)
        dynamic_sampling_num_gen_batches += 1
        repeated_batch = repeat_batch(batch, _field(grpo_cfg, "num_generations_per_prompt"))  # noqa: F821
        repeated_batch, _ = ray.get(rollout_actor.rollout_to_tq.remote(
            repeated_batch, partition_id=f"step-{total_steps}", finish_generation=True))
        if _field(grpo_cfg, "use_dynamic_sampling"):  # noqa: F821
            rewards = repeated_batch["total_reward"]
            baseline, std = calculate_baseline_and_std_per_prompt(  # noqa: F821
                repeated_batch["input_ids"], rewards, torch.ones_like(rewards))
            repeated_batch, is_complete, batch_cache, _ = dynamic_sampling(  # noqa: F821
                repeated_batch, std, baseline, dynamic_sampling_num_gen_batches, master_config, None, batch_cache)
            if not is_complete:
                continue
        policy.prepare_for_training()
        POLICY_GENERATION_STALE = True
        policy.train(repeated_batch, loss_fn)
        dynamic_sampling_num_gen_batches = 0
        if val_period > 0 and (total_steps + 1) % val_period == 0:
            POLICY_GENERATION_STALE = _shared.refit_or_prepare(refit_policy_generation, policy, policy_generation,  # noqa: F821
                                                               colocated_inference, NEED_REFIT, POLICY_GENERATION_STALE,
                                                               offload=False)
            validate_sync(policy_generation, val_dataloader, tokenizer, val_task_to_env, step=total_steps + 1,  # noqa: F821
                          master_config=master_config)
            policy_generation.finish_generation()
        total_steps += 1
        if total_steps >= max_num_steps:
            break
    grpo_save_state["rollout_actor"] = rollout_actor
