"""Test double of vLLM's vllm/engine/arg_utils.py (AsyncEngineArgs: keeps the keyword arguments)."""

from __future__ import annotations


class AsyncEngineArgs:
    def __init__(self, **kwargs):
        self.kwargs = kwargs
