"""Test double of vLLM's vllm/config (set_current_vllm_config: the context NeMo-RL's refit enters)."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def set_current_vllm_config(vllm_config, check_compile: bool = False, prefix: str | None = None):
    yield
