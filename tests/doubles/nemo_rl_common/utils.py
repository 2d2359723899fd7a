"""Shared body of nemo_rl/algorithms/utils.py, the same in the v0.3.1, v0.4.0 and v0.7.0 doubles.

Baseline and std of the rewards of each prompt's group (samples sharing a prompt), as upstream;
`select_rows` / `concat_rows` stand in for BatchedDataDict.select_indices / from_batches.
"""

from __future__ import annotations

import torch

from nemo_rl_common.release import upstream_module


def calculate_baseline_and_std_per_prompt(prompts: torch.Tensor, rewards: torch.Tensor, valid_mask: torch.Tensor,
                                          leave_one_out_baseline: bool = True, std_rewards=None):
    baseline = torch.zeros_like(rewards)
    std = torch.zeros_like(rewards)
    keys = [tuple(row.tolist()) for row in prompts]
    for key in set(keys):
        idx = torch.tensor([i for i, k in enumerate(keys) if k == key])
        group = rewards[idx]
        baseline[idx] = group.mean()
        std[idx] = group.std() if len(idx) > 1 else 0.0
    return baseline, std


def select_rows(batch: dict, index: torch.Tensor) -> dict:
    return {k: (v[index] if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}


def concat_rows(a: dict | None, b: dict) -> dict:
    if a is None:
        return dict(b)
    out = {}
    for k, v in b.items():
        if isinstance(v, torch.Tensor) and isinstance(a.get(k), torch.Tensor):
            if v.dim() == 2 and a[k].shape[1] != v.shape[1]:
                width = max(a[k].shape[1], v.shape[1])
                pad = lambda t: torch.nn.functional.pad(t, (0, width - t.shape[1]))  # noqa: E731
                out[k] = torch.cat([pad(a[k]), pad(v)])
            else:
                out[k] = torch.cat([a[k], v])
        else:
            out[k] = v
    return out


def repeat_batch(batch: dict, n: int) -> dict:
    return {k: (v.repeat_interleave(n, dim=0) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}


upstream_module("nemo_rl.algorithms.utils", calculate_baseline_and_std_per_prompt, select_rows, concat_rows, repeat_batch)
