"""Test double of vLLM's vllm/outputs.py (RequestOutput, CompletionOutput: the fields NeMo-RL reads)."""

from __future__ import annotations


class CompletionOutput:
    def __init__(self, index: int, token_ids: list[int]):
        self.index, self.token_ids = index, token_ids
        self.text = ""
        self.logprobs = None


class RequestOutput:
    def __init__(self, request_id: str, prompt_token_ids: list[int], outputs: list[CompletionOutput]):
        self.request_id, self.prompt_token_ids, self.outputs = request_id, prompt_token_ids, outputs
        self.finished = True
