"""Test double of vLLM's vllm/sampling_params.py (SamplingParams; only the fields NeMo-RL sets)."""

from __future__ import annotations


class SamplingParams:
    def __init__(self, temperature: float = 1.0, top_p: float = 1.0, top_k: int = -1,
                 max_tokens: int = 16, seed: int | None = None, logprobs: int | None = None,
                 stop: list[str] | None = None, **kwargs):
        self.temperature, self.top_p, self.top_k = temperature, top_p, top_k
        self.max_tokens, self.seed, self.logprobs, self.stop = max_tokens, seed, logprobs, stop
