"""Trainer-side stand-ins the NeMo-RL loop doubles are driven with (not doubles of upstream files).

The policy's weights start from the same tiny checkpoint vLLM loads and change on every train()
call, deterministically, so a run with colo-shim and an always-level-1 run must generate
bit-identical tokens. Like a real trainer's export, the refit state dict lacks what the
inference model has on top (layer scales `ls1`, the speculative drafter).
"""

from __future__ import annotations

import torch

from vllm._double_core import hf_checkpoint


def exported(name: str, plain: bool = False) -> bool:
    return not ((name.endswith(".ls1") and not plain) or name.startswith("drafter."))


class PolicyDouble:
    def __init__(self, refit_path: str, seed: int = 0, plain: bool = False):
        self.refit_path = refit_path
        self.state = {k: v.clone() for k, v in hf_checkpoint(seed).items() if exported(k, plain)}
        self.train_calls = 0
        self.calls: list[str] = []

    def _note(self, name):
        self.calls.append(name)

    def offload_before_refit(self):
        self._note("offload_before_refit")

    def offload_after_refit(self):
        self._note("offload_after_refit")

    def prepare_for_training(self):
        self._note("prepare_for_training")

    def prepare_for_lp_inference(self):
        self._note("prepare_for_lp_inference")

    def finish_training(self):
        self._note("finish_training")

    def get_free_memory_bytes(self) -> int:
        return 1 << 30

    def train(self, data, loss_fn, timer=None, **kwargs):
        self.train_calls += 1
        g = torch.Generator().manual_seed(1000 + self.train_calls)
        for name in sorted(self.state):
            self.state[name] += 0.05 * torch.randn(self.state[name].shape, generator=g)
        return {"loss": 0.0}

    def _publish(self):
        torch.save(self.state, self.refit_path)
        return []

    def stream_weights_via_ipc_zmq(self, buffer_size_bytes: int = 0, kv_scales=None):  # v0.5.0 / main pass kv_scales
        return self._publish()

    def broadcast_weights_for_collective(self, kv_scales=None):
        return self._publish()

    def prepare_weights_for_ipc(self, _refit_buffer_size_gb=None):
        self._publish()
        return [sorted(self.state)]

    def get_weights_ipc_handles(self, keys):
        return {"cpu-0": list(keys)}


class ValueDouble(PolicyDouble):
    """PPO critic: trains every step, never refits a generation engine."""


class EnvDouble:
    """Reward = parity of the sampled tokens; keeps every output it scored, in order."""

    def __init__(self):
        self.outputs: list[list[list[int]]] = []

    def step(self, output_ids, metadata=None):
        self.outputs.append(output_ids.tolist())
        return [float(int(row.sum()) % 2) for row in output_ids]


class Config(dict):
    """master_config that supports both v0.7's attribute access and v0.3/v0.4's item access."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError as exc:
            raise AttributeError(name) from exc


class Logger:
    def __init__(self):
        self.metrics = []

    def log_metrics(self, metrics, step, prefix=""):
        self.metrics.append((prefix, step, metrics))


def generation_config(async_engine=False, speculative=False, ep=1, lora=False, colocated=True, plain=False) -> dict:
    vllm_kwargs = {}
    if speculative:
        vllm_kwargs["speculative_config"] = {"method": "draft_head", "num_speculative_tokens": 1}
    if lora:
        vllm_kwargs["enable_lora"] = True
    return {"backend": "vllm", "model_name": "tiny-plain-0" if plain else "tiny-0", "temperature": 1.0,
            "max_new_tokens": 4,
            "colocated": {"enabled": colocated}, "vllm_kwargs": vllm_kwargs,
            "vllm_cfg": {"async_engine": async_engine, "expert_parallel_size": ep, "tensor_parallel_size": 1,
                         "pipeline_parallel_size": 1}}


def master_config(algo="grpo", steps=20, val_period=5, val_at_start=True, dapo=False, warmup=0, **gen) -> Config:
    section = {"max_num_steps": steps, "val_period": val_period, "val_at_start": val_at_start,
               "num_generations_per_prompt": 4, "num_prompts_per_step": 3, "max_rollout_turns": 1,
               "use_dynamic_sampling": dapo, "dynamic_sampling_max_gen_batches": 10,
               "policy_training_start_step": warmup}
    return Config({algo: section, "grpo": section,
                   "policy": {"generation": generation_config(**gen), "max_total_sequence_length": 16}})


def batches(n: int, prompts: int = 3, seed: int = 7) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(1, 60, (prompts, 5), generator=g)
        out.append({"input_ids": ids, "input_lengths": torch.full((prompts,), 5)})
    return out
