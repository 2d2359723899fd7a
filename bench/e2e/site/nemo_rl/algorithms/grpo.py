"""nemo_rl/algorithms/grpo.py: setup, refit_policy_generation, validate, grpo_train (colocated path).

Call order as NeMo-RL main's grpo.py where it concerns the engine, the trainer's storage and the
checkpoint: setup builds the engine first and puts it to sleep (`init_vllm` -> finish_generation),
then the policy, then `prepare_refit_info`. Each step: refit when the generation is stale
(offload_before_refit -> prepare_for_generation(tags=["weights"]) -> stream + receive ->
offload_after_refit -> prepare_for_generation(tags=["kv_cache"])), else offload_after_refit +
prepare_for_generation(); rollouts; finish_generation(); logprobs (prepare_for_lp_inference);
prepare_for_training, train, finish_training; every val_period steps a refit, validate(),
finish_generation(); then the checkpoint: save_checkpoint (async on main: returns once scheduled,
so the write is still in flight at the next refit's offload) and `checkpointer.begin_finalization`.
Rewards, advantages and metrics are reduced to what the step needs (bench/e2e/rollouts.py).
The `timer` and `logger` are the harness's (NeMo-RL passes its Timer and Logger the same way).
"""

from __future__ import annotations

from typing import Any, Optional

from nemo_rl.experience.rollouts import run_multi_turn_rollout
from nemo_rl.models.generation.vllm import VllmGeneration
from nemo_rl.models.policy.lm_policy import Policy


def _get(futures):
    return [f.get() for f in futures]


def setup(master_config: dict, cluster):
    generation_config = master_config["policy"]["generation"]

    def init_vllm():
        pg = VllmGeneration(cluster=cluster, config=generation_config)
        pg.finish_generation()
        return pg

    policy_generation = init_vllm()
    policy = Policy(cluster=cluster, config=master_config["policy"])
    state_dict_info = policy.prepare_refit_info()
    policy_generation.prepare_refit_info(state_dict_info)
    return policy, policy_generation


def _colocated_weight_update(policy, policy_generation, _refit_buffer_size_gb: Optional[float]) -> bool:
    buffer_size_bytes = int(policy.get_free_memory_bytes() * 0.3)  # NRL_REFIT_BUFFER_MEMORY_RATIO
    futures_train = policy.stream_weights_via_ipc_zmq(buffer_size_bytes=buffer_size_bytes)
    futures_inference = policy_generation.update_weights_via_ipc_zmq()
    _get(futures_train)
    results = _get(futures_inference)
    return all(result for result in results if result is not None)


def refit_policy_generation(policy, policy_generation, colocated_inference: bool,
                            _refit_buffer_size_gb: Optional[float] = None, timer=None) -> None:
    """Refit the policy generation interface with the latest policy weights."""
    if colocated_inference:
        with timer.time("offload_before_refit"):
            policy.offload_before_refit()
        with timer.time("wake_weights"):
            policy_generation.prepare_for_generation(tags=["weights"])
    with timer.time("weight_transfer"):
        update_success = _colocated_weight_update(policy, policy_generation, _refit_buffer_size_gb)
    if not update_success:
        raise RuntimeError("Error: Updating weights for the generation policy failed during refit.")
    if colocated_inference:
        with timer.time("offload_after_refit"):
            policy.offload_after_refit()
        with timer.time("wake_kv_cache"):
            policy_generation.prepare_for_generation(tags=["kv_cache"])


def validate(policy_generation, val_dataloader, tokenizer, val_task_to_env, step: int, master_config,
             logger=None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Greedy rollouts over the validation prompts."""
    batch, metrics = run_multi_turn_rollout(policy_generation, val_dataloader, tokenizer, val_task_to_env,
                                            max_seq_len=master_config["policy"]["max_total_sequence_length"],
                                            greedy=True)
    return metrics, {}


def grpo_train(policy, policy_generation, dataloader, val_dataloader, tokenizer, loss_fn, task_to_env,
               val_task_to_env, logger, checkpointer, grpo_save_state, master_config, timer) -> None:
    """Run GRPO training algorithm."""
    NEED_REFIT = True
    POLICY_GENERATION_STALE = True
    total_steps = grpo_save_state["total_steps"]
    grpo_cfg = master_config["grpo"]
    val_period = grpo_cfg["val_period"]
    colocated_inference = master_config["policy"]["generation"]["colocated"]["enabled"]
    max_seq_len = master_config["policy"]["max_total_sequence_length"]

    for batch in dataloader:
        logger.begin_step(total_steps + 1)
        with timer.time("refit"):
            if NEED_REFIT and POLICY_GENERATION_STALE:
                refit_policy_generation(policy, policy_generation, colocated_inference, timer=timer)
                POLICY_GENERATION_STALE = False
            else:
                if colocated_inference:
                    with timer.time("offload_after_refit"):
                        policy.offload_after_refit()
                with timer.time("wake_kv_cache"):
                    policy_generation.prepare_for_generation()
        with timer.time("generation"):
            repeated_batch, rollout_metrics = run_multi_turn_rollout(
                policy_generation, batch, tokenizer, task_to_env, max_seq_len=max_seq_len, greedy=False)
        with timer.time("finish_generation"):
            policy_generation.finish_generation()
        logger.after_finish("rollout")

        with timer.time("logprobs"):
            policy.prepare_for_lp_inference()
            repeated_batch["prev_logprobs"] = policy.get_logprobs(repeated_batch)["logprobs"]
        with timer.time("train"):
            policy.prepare_for_training()
            POLICY_GENERATION_STALE = True
            train_results = policy.train(repeated_batch, loss_fn)
            policy.finish_training()

        if val_period > 0 and (total_steps + 1) % val_period == 0:
            with timer.time("validation"):
                if NEED_REFIT and POLICY_GENERATION_STALE:
                    refit_policy_generation(policy, policy_generation, colocated_inference, timer=timer)
                    POLICY_GENERATION_STALE = False
                else:
                    policy_generation.prepare_for_generation()
                val_metrics, _ = validate(policy_generation, val_dataloader, tokenizer, val_task_to_env,
                                          step=total_steps + 1, master_config=master_config, logger=logger)
                policy_generation.finish_generation()
            logger.after_finish("validation")
            policy.prepare_for_training()  # the validation refit offloaded the state the save reads

        if master_config["checkpointing"]["enabled"]:
            with timer.time("save_checkpoint"):
                checkpoint_path = checkpointer.init_tmp_checkpoint(total_steps + 1, {"step": total_steps + 1})
                saved = policy.save_checkpoint(weights_path=f"{checkpoint_path}/policy/weights")
                checkpointer.begin_finalization(checkpoint_path, saved)
        total_steps += 1
        logger.log_metrics({**rollout_metrics, **train_results}, total_steps)
