"""nemo_rl/experience/rollouts.py: one-turn rollouts against a toy reward (the e2e harness's environment).

The reward (fraction of response tokens in the lower half of the vocabulary) only has to give the
policy-gradient step non-zero advantages; what the harness measures is the engine and trainer
around it.
"""

from __future__ import annotations

import hashlib
import json


def run_multi_turn_rollout(policy_generation, input_batch: dict, tokenizer, task_to_env, max_seq_len: int,
                           max_rollout_turns: int = 1, greedy: bool = False):
    out = policy_generation.generate(input_batch, greedy=greedy)
    vocab = input_batch["vocab_size"]
    rewards = [sum(1 for t in ids if t < vocab // 2) / max(1, len(ids)) for ids in out["output_ids"]]
    digest = hashlib.sha1(json.dumps(out["output_ids"]).encode()).hexdigest()[:16]
    batch = {"prompt_ids": input_batch["prompt_ids"], "output_ids": out["output_ids"], "total_reward": rewards,
             "group": input_batch["group"]}
    return batch, {"ids_digest": digest, "mean_reward": sum(rewards) / max(1, len(rewards)),
                   "tokens": sum(len(ids) for ids in out["output_ids"])}
