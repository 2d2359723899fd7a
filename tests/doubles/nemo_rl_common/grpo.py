"""Shared bodies of nemo_rl/algorithms/grpo.py (v0.3.1, v0.4.0, v0.7.0 doubles) and helpers of the
v0.7.0 distillation / ppo / grpo_sync loop doubles.

`setup`, `refit_policy_generation`, `dynamic_sampling`, `validate` and `grpo_train` are defined in
each release's nemo_rl/algorithms/grpo.py by nemo_rl_common.release.define: they run with that
module's globals, so they read there, at call time, the names upstream's code reads there
(`validate`, `refit_policy_generation`, `dynamic_sampling`, `VllmGeneration`, ... - colo-shim
wraps some of them by module attribute) plus what differs between releases:
- `_section(master_config, name)`: item access (`master_config["grpo"]`, v0.3.1 / v0.4.0) or
  attribute access (`master_config.grpo`, v0.7.0, main): `item` or `attr` below;
- `_field(section, name)`: a value of a section: item access on v0.3.1-v0.7.0's dict sections
  (`master_config.grpo["use_dynamic_sampling"]`), attribute access on main's pydantic sections
  (`master_config.grpo.use_dynamic_sampling`, PR #2518): `item` or `attr` again;
- `_colocated_weight_update(policy, policy_generation, _refit_buffer_size_gb) -> bool`: the
  colocated refit's transfer (v0.3.1 CUDA-IPC handles, v0.4.0+ ZMQ stream);
- `_DYNAMIC_SAMPLING`: v0.4.0+ run DAPO's dynamic_sampling after each rollout; v0.3.1 has none;
- `_shared`: this module.
The remaining functions are plain helpers, called as `_shared.<name>` or from the v0.7.0 loops.

grpo_train follows upstream's call order exactly where it concerns the generation engine:
POLICY_GENERATION_STALE starts True; val_at_start refits (or prepares) then validate() then
finish_generation(); each step refits when stale, else offload_after_refit + prepare (no tags);
rollouts; finish_generation(); dynamic sampling (DAPO, v0.4.0+) `continue`s on an incomplete batch
without training; training sets STALE; validation every val_period steps refits, validates,
finish_generation(). Everything unrelated (logging, checkpointing, metrics) is left out.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from nemo_rl_common.rollouts import run_multi_turn_rollout
from nemo_rl_common.worker_groups import get


def item(master_config, name: str):
    """Config section (v0.3.1, v0.4.0) or section value (v0.3.1-v0.7.0) by item access."""
    return master_config[name]


def attr(master_config, name: str):
    """Config section (v0.7.0, main) or section value (main's pydantic sections) by attribute access."""
    return getattr(master_config, name)


def refit_or_prepare(refit, policy, policy_generation, colocated_inference: bool, need_refit: bool, stale: bool,
                     offload: bool = True) -> bool:
    """Upstream's `if NEED_REFIT and STALE: refit` / `else: [offload_after_refit +] prepare_for_generation()`.

    `refit` is the caller's refit_policy_generation, read by the caller at call time; returns the
    generation's new staleness (False after a refit).
    """
    if need_refit and stale:
        refit(policy, policy_generation, colocated_inference)
        return False
    if offload and colocated_inference:
        policy.offload_after_refit()
    policy_generation.prepare_for_generation()
    return stale


def validation_results(policy_generation, val_dataloader, tokenizer, val_task_to_env, max_seq_len: int,
                       timings: dict) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every release's validate() body: greedy rollouts over the validation data -> (metrics, timings)."""
    if val_dataloader is None:
        return {}, {}
    rewards = []
    for val_batch in val_dataloader:
        batch, _ = run_multi_turn_rollout(policy_generation, val_batch, tokenizer, val_task_to_env,
                                          max_seq_len=max_seq_len, greedy=True)
        rewards.append(batch["total_reward"])
    return {"accuracy": float(torch.cat(rewards).mean())}, dict(timings)


def update_weights_via_ipc_zmq(policy, policy_generation, _refit_buffer_size_gb: Optional[float]) -> bool:
    """v0.4.0+ colocated transfer: stream the weights through ZMQ."""
    buffer_size_bytes = int(policy.get_free_memory_bytes() * 0.3)
    futures_train = policy.stream_weights_via_ipc_zmq(buffer_size_bytes=buffer_size_bytes)
    futures_inference = policy_generation.update_weights_via_ipc_zmq()
    get(futures_train)
    results = get(futures_inference)
    return all(result for result in results if result is not None)


def update_weights_from_ipc_handles(policy, policy_generation, _refit_buffer_size_gb: Optional[float]) -> bool:
    """v0.3.1 colocated transfer: CUDA-IPC handles, one group of parameters at a time."""
    grouped_param_keys = policy.prepare_weights_for_ipc(_refit_buffer_size_gb=_refit_buffer_size_gb)
    update_success = False
    for keys in grouped_param_keys:
        ipc_handles = policy.get_weights_ipc_handles(keys)
        update_success = policy_generation.update_weights_from_ipc_handles(ipc_handles)
        if not update_success:
            break
    return update_success


# ----------------------------------------------------------------------------- defined in each release's grpo.py

def setup(master_config, cluster) -> VllmGeneration:  # noqa: F821 (the release module's)
    """The generation part of upstream's setup(): build VllmGeneration and put it to sleep."""
    generation_config = _section(master_config, "policy")["generation"]  # noqa: F821

    def init_vllm():
        pg = VllmGeneration(cluster=cluster, config=generation_config)  # noqa: F821
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
        update_success = _colocated_weight_update(policy, policy_generation, _refit_buffer_size_gb)  # noqa: F821
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


def dynamic_sampling(repeated_batch: dict, std: torch.Tensor, baseline: torch.Tensor,
                     dynamic_sampling_num_gen_batches: int, master_config, timer=None, batch_cache=None):
    """Keep prompts with non-zero reward std; the batch is complete once enough are cached."""
    grpo_cfg = _section(master_config, "grpo")  # noqa: F821
    is_batch_complete = True
    if _field(grpo_cfg, "use_dynamic_sampling"):  # noqa: F821
        keep = torch.nonzero(std != 0).flatten()
        batch_cache = concat_rows(batch_cache, select_rows(repeated_batch, keep))  # noqa: F821
        train_prompts_size = _field(grpo_cfg, "num_prompts_per_step") * _field(grpo_cfg, "num_generations_per_prompt")
        if len(batch_cache["total_reward"]) < train_prompts_size:
            if dynamic_sampling_num_gen_batches < _field(grpo_cfg, "dynamic_sampling_max_gen_batches"):
                is_batch_complete = False
            else:
                raise ValueError("Dynamic sampling reached the maximum number of generation batches")
        else:
            repeated_batch = select_rows(batch_cache, torch.arange(train_prompts_size))  # noqa: F821
            batch_cache = None
    return repeated_batch, is_batch_complete, batch_cache, {}


def validate(policy_generation, val_dataloader, tokenizer, val_task_to_env, step: int, master_config,
             logger=None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run validation on the validation dataset (greedy rollouts)."""
    max_seq_len = _section(master_config, "policy")["max_total_sequence_length"]  # noqa: F821
    return _shared.validation_results(policy_generation, val_dataloader, tokenizer, val_task_to_env,  # noqa: F821
                                      max_seq_len, {"total_validation_time": 0.0})


def grpo_train(policy, policy_generation, wrapped_dataloader, val_dataloader, tokenizer, loss_fn,
               task_to_env, val_task_to_env, logger, checkpointer, grpo_save_state, master_config) -> None:
    """Run GRPO training algorithm."""
    NEED_REFIT = True
    POLICY_GENERATION_STALE = True
    current_step = grpo_save_state["current_step"]
    total_steps = grpo_save_state["total_steps"]
    grpo_cfg = _section(master_config, "grpo")  # noqa: F821
    max_num_steps = _field(grpo_cfg, "max_num_steps")
    val_at_start = _field(grpo_cfg, "val_at_start")
    val_period = _field(grpo_cfg, "val_period")
    colocated_inference = _section(master_config, "policy")["generation"]["colocated"]["enabled"]  # noqa: F821
    max_seq_len = _section(master_config, "policy")["max_total_sequence_length"]  # noqa: F821
    refit_or_prepare = _shared.refit_or_prepare  # noqa: F821

    if val_at_start and current_step == 0:
        POLICY_GENERATION_STALE = refit_or_prepare(refit_policy_generation, policy, policy_generation,
                                                   colocated_inference, NEED_REFIT, POLICY_GENERATION_STALE,
                                                   offload=False)
        val_metrics, validation_timings = validate(policy_generation, val_dataloader, tokenizer, val_task_to_env,
                                                   step=0, master_config=master_config, logger=logger)
        policy_generation.finish_generation()
        logger.log_metrics(val_metrics, current_step, prefix="validation")

    batch_cache = None
    dynamic_sampling_num_gen_batches = 0
    for batch in wrapped_dataloader:
        POLICY_GENERATION_STALE = refit_or_prepare(refit_policy_generation, policy, policy_generation,
                                                   colocated_inference, NEED_REFIT, POLICY_GENERATION_STALE)
        dynamic_sampling_num_gen_batches += 1
        repeated_batch = repeat_batch(batch, _field(grpo_cfg, "num_generations_per_prompt"))  # noqa: F821
        repeated_batch, rollout_metrics = run_multi_turn_rollout(
            policy_generation=policy_generation, input_batch=repeated_batch, tokenizer=tokenizer,
            task_to_env=task_to_env, max_seq_len=max_seq_len,
            max_rollout_turns=_field(grpo_cfg, "max_rollout_turns"), greedy=False)
        policy_generation.finish_generation()

        if _DYNAMIC_SAMPLING:  # noqa: F821 (v0.4.0+; v0.3.1 trains on every batch)
            rewards = repeated_batch["total_reward"]
            baseline, std = calculate_baseline_and_std_per_prompt(  # noqa: F821
                repeated_batch["input_ids"], rewards, torch.ones_like(rewards))
            repeated_batch, is_batch_complete, batch_cache, ds_metrics = dynamic_sampling(
                repeated_batch, std, baseline, dynamic_sampling_num_gen_batches, master_config, None, batch_cache)
            if not is_batch_complete:
                continue

        policy.prepare_for_training()
        POLICY_GENERATION_STALE = True
        policy.train(repeated_batch, loss_fn)
        policy.finish_training()
        dynamic_sampling_num_gen_batches = 0

        if val_period > 0 and (total_steps + 1) % val_period == 0:
            POLICY_GENERATION_STALE = refit_or_prepare(refit_policy_generation, policy, policy_generation,
                                                       colocated_inference, NEED_REFIT, POLICY_GENERATION_STALE)
            val_metrics, validation_timings = validate(policy_generation, val_dataloader, tokenizer,
                                                       val_task_to_env, step=total_steps + 1,
                                                       master_config=master_config, logger=logger)
            policy_generation.finish_generation()
            logger.log_metrics(val_metrics, total_steps + 1, prefix="validation")

        current_step += 1
        total_steps += 1
        if total_steps >= max_num_steps:
            break

