"""Shared body of nemo_rl/experience/rollouts.py, the same in the v0.3.1, v0.4.0 and v0.7.0 doubles.

Calls `policy_generation.generate(batch, greedy)` (sync engine) or iterates
`policy_generation.generate_async(batch, greedy)` (async engine), then asks the task's
environment for rewards: `task_to_env["math"].step(output_ids, metadata)` returns one reward per
sample (a simplification of EnvironmentInterface.step's message logs).
"""

from __future__ import annotations

import asyncio

import torch

from nemo_rl_common.release import upstream_module


def _generate(policy_generation, batch: dict, greedy: bool) -> dict:
    if not policy_generation.cfg["vllm_cfg"]["async_engine"]:
        return policy_generation.generate(batch, greedy=greedy)

    async def collect():
        return [item async for item in policy_generation.generate_async(batch, greedy=greedy)]

    items = sorted(asyncio.run(collect()), key=lambda item: item[0])
    rows = [item[1]["output_ids"][0].tolist() for item in items]
    width = max(len(r) for r in rows)
    return {"output_ids": torch.tensor([r + [0] * (width - len(r)) for r in rows])}


def run_multi_turn_rollout(policy_generation, input_batch: dict, tokenizer, task_to_env: dict,
                           max_seq_len: int, max_rollout_turns: int = 999999, greedy: bool = False):
    out = _generate(policy_generation, input_batch, greedy)
    rewards = task_to_env["math"].step(out["output_ids"], input_batch.get("metadata"))
    batch = dict(input_batch)
    batch["output_ids"] = out["output_ids"]
    batch["total_reward"] = torch.as_tensor(rewards, dtype=torch.float32)
    return batch, {"mean_gen_tokens_per_sample": float(out["output_ids"].shape[1])}


upstream_module("nemo_rl.experience.rollouts", _generate, run_multi_turn_rollout)
