"""Test double of NeMo-RL v0.7.0 nemo_rl/algorithms/distillation.py (distillation_train, validate).

Same generation call order as upstream: `refit_policy_generation` imported by name from grpo;
refit when stale else prepare; student rollouts; finish_generation(); teacher scoring and
student training mark the generation stale; validation every val_period steps ends with
finish_generation() and no refit.
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


def distillation_train(student_policy, teacher_policy, student_generation, dataloader, val_dataloader, tokenizer,
                       loss_fn, task_to_env, val_task_to_env, logger, checkpointer, distillation_save_state,
                       master_config) -> None:
    NEED_REFIT = True
    STUDENT_GENERATION_STALE = True
    step = distillation_save_state["current_step"]
    max_steps = master_config.distillation["max_num_steps"]
    val_period = master_config.distillation["val_period"]
    colocated_inference = master_config.policy["generation"]["colocated"]["enabled"]
    if master_config.distillation["val_at_start"] and step == 0:
        STUDENT_GENERATION_STALE = _shared.refit_or_prepare(refit_policy_generation, student_policy, student_generation,
                                                            colocated_inference, NEED_REFIT, STUDENT_GENERATION_STALE,
                                                            offload=False)
        val_metrics, _ = validate(student_generation, val_dataloader, tokenizer, val_task_to_env, step=0,
                                  master_config=master_config, logger=logger)
        student_generation.finish_generation()
    for batch in dataloader:
        STUDENT_GENERATION_STALE = _shared.refit_or_prepare(refit_policy_generation, student_policy, student_generation,
                                                            colocated_inference, NEED_REFIT, STUDENT_GENERATION_STALE,
                                                            offload=False)
        repeated_batch = repeat_batch(batch, master_config.distillation["num_generations_per_prompt"])
        repeated_batch, _ = run_multi_turn_rollout(student_generation, repeated_batch, tokenizer, task_to_env,
                                                   max_seq_len=master_config.policy["max_total_sequence_length"],
                                                   greedy=False)
        student_generation.finish_generation()
        teacher_policy.prepare_for_lp_inference()
        student_policy.prepare_for_training()
        STUDENT_GENERATION_STALE = True
        student_policy.train(repeated_batch, loss_fn)
        if val_period > 0 and (step + 1) % val_period == 0:
            STUDENT_GENERATION_STALE = _shared.refit_or_prepare(
                refit_policy_generation, student_policy, student_generation, colocated_inference, NEED_REFIT,
                STUDENT_GENERATION_STALE, offload=False)
            val_metrics, _ = validate(student_generation, val_dataloader, tokenizer, val_task_to_env,
                                      step=step + 1, master_config=master_config, logger=logger)
            student_generation.finish_generation()
        step += 1
        if step >= max_steps:
            break
