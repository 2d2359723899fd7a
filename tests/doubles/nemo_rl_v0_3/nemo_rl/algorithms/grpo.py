"""Test double of NeMo-RL v0.3.1 nemo_rl/algorithms/grpo.py (setup's init_vllm, refit_policy_generation,
grpo_train, validate; v0.3.1 has no dynamic sampling).

grpo_train follows upstream's call order exactly where it concerns the generation engine:
POLICY_GENERATION_STALE starts True; val_at_start refits (or prepares) then validate() then
finish_generation(); each step refits when stale, else offload_after_refit + prepare (no tags);
rollouts; finish_generation(); training sets STALE; validation every val_period steps refits, validates,
finish_generation(). Everything unrelated (logging, checkpointing, metrics) is left out.
Configs use item access (`master_config["grpo"][...]`) as v0.3.1 does; the refit goes through
CUDA-IPC handles (prepare_weights_for_ipc / get_weights_ipc_handles / update_weights_from_ipc_handles).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from nemo_rl.algorithms.utils import repeat_batch
from nemo_rl.distributed.worker_groups import get
from nemo_rl.experience.rollouts import run_multi_turn_rollout
from nemo_rl.models.generation.vllm import VllmGeneration  # v0.3: one module


def setup(master_config, cluster) -> VllmGeneration:
    """The generation part of upstream's setup(): build VllmGeneration and put it to sleep."""
    generation_config = master_config["policy"]["generation"]

    def init_vllm():
        pg = VllmGeneration(cluster=cluster, config=generation_config)
        pg.finish_generation()
        return pg

    return init_vllm()


def refit_policy_generation(policy, policy_generation, colocated_inference: bool,
                            _refit_buffer_size_gb: Optional[float] = None, timer=None,
                            kv_scales: Optional[dict[str, float]] = None) -> None:
    """Refit the policy generation interface with the latest policy weights."""
    if colocated_inference:
        policy.offload_before_refit()
        policy_generation.prepare_for_generation(tags=["weights"])
    if colocated_inference:
        grouped_param_keys = policy.prepare_weights_for_ipc(_refit_buffer_size_gb=_refit_buffer_size_gb)
        update_success = False
        for keys in grouped_param_keys:
            ipc_handles = policy.get_weights_ipc_handles(keys)
            update_success = policy_generation.update_weights_from_ipc_handles(ipc_handles)
            if not update_success:
                break
    else:
        futures_train = policy.broadcast_weights_for_collective(kv_scales=kv_scales)
        futures_inference = policy_generation.update_weights_from_collective()
        get(futures_train)
        results = get(futures_inference)
        update_success = all(result for result in results if result is not None)
    if not update_success:
        raise RuntimeError("Error: Updating weights for the generation policy failed during refit.")
    if colocated_inference:
        policy.offload_after_refit()
        policy_generation.prepare_for_generation(tags=["kv_cache"])


def validate(policy_generation, val_dataloader, tokenizer, val_task_to_env, step: int, master_config,
             logger=None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run validation on the validation dataset (greedy rollouts)."""
    if val_dataloader is None:
        return {}, {}
    rewards = []
    for val_batch in val_dataloader:
        batch, _ = run_multi_turn_rollout(policy_generation, val_batch, tokenizer, val_task_to_env,
                                          max_seq_len=master_config["policy"]["max_total_sequence_length"],
                                          greedy=True)
        rewards.append(batch["total_reward"])
    return {"accuracy": float(torch.cat(rewards).mean())}, {"total_validation_time": 0.0}


def grpo_train(policy, policy_generation, wrapped_dataloader, val_dataloader, tokenizer, loss_fn,
               task_to_env, val_task_to_env, logger, checkpointer, grpo_save_state, master_config) -> None:
    """Run GRPO training algorithm."""
    NEED_REFIT = True
    POLICY_GENERATION_STALE = True
    current_step = grpo_save_state["current_step"]
    total_steps = grpo_save_state["total_steps"]
    max_num_steps = master_config["grpo"]["max_num_steps"]
    val_at_start = master_config["grpo"]["val_at_start"]
    val_period = master_config["grpo"]["val_period"]
    colocated_inference = master_config["policy"]["generation"]["colocated"]["enabled"]

    if val_at_start and current_step == 0:
        if NEED_REFIT and POLICY_GENERATION_STALE:
            refit_policy_generation(policy, policy_generation, colocated_inference)
            POLICY_GENERATION_STALE = False
        else:
            policy_generation.prepare_for_generation()
        val_metrics, validation_timings = validate(policy_generation, val_dataloader, tokenizer, val_task_to_env,
                                                   step=0, master_config=master_config, logger=logger)
        policy_generation.finish_generation()
        logger.log_metrics(val_metrics, current_step, prefix="validation")

    for batch in wrapped_dataloader:
        if NEED_REFIT and POLICY_GENERATION_STALE:
            refit_policy_generation(policy, policy_generation, colocated_inference)
            POLICY_GENERATION_STALE = False
        else:
            if colocated_inference:
                policy.offload_after_refit()
            policy_generation.prepare_for_generation()
        repeated_batch = repeat_batch(batch, master_config["grpo"]["num_generations_per_prompt"])
        repeated_batch, rollout_metrics = run_multi_turn_rollout(
            policy_generation=policy_generation, input_batch=repeated_batch, tokenizer=tokenizer,
            task_to_env=task_to_env, max_seq_len=master_config["policy"]["max_total_sequence_length"],
            max_rollout_turns=master_config["grpo"]["max_rollout_turns"], greedy=False)
        policy_generation.finish_generation()

        policy.prepare_for_training()
        POLICY_GENERATION_STALE = True
        policy.train(repeated_batch, loss_fn)
        policy.finish_training()

        if val_period > 0 and (total_steps + 1) % val_period == 0:
            if NEED_REFIT and POLICY_GENERATION_STALE:
                refit_policy_generation(policy, policy_generation, colocated_inference)
                POLICY_GENERATION_STALE = False
            else:
                if colocated_inference:
                    policy.offload_after_refit()
                policy_generation.prepare_for_generation()
            val_metrics, validation_timings = validate(policy_generation, val_dataloader, tokenizer,
                                                       val_task_to_env, step=total_steps + 1,
                                                       master_config=master_config, logger=logger)
            policy_generation.finish_generation()
            logger.log_metrics(val_metrics, total_steps + 1, prefix="validation")

        current_step += 1
        total_steps += 1
        if total_steps >= max_num_steps:
            break
