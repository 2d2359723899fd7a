"""Test double of vLLM's vllm/v1/engine/async_llm.py (class AsyncLLM: async sleep/wake_up/generate/collective_rpc).

Same coroutine signatures as vLLM 0.10-0.25; `generate` is an async generator yielding the
final RequestOutput. The behaviour lives in vllm/_double_core.py (sleep mode needs a GPU).
"""

from __future__ import annotations

import asyncio

from vllm._double_core import EngineCore
from vllm.outputs import CompletionOutput, RequestOutput


class AsyncLLM:
    def __init__(self, model: str, *, seed: int = 0, enable_sleep_mode: bool = False,
                 worker_extension_cls: str | None = None, speculative_config: dict | None = None,
                 **kwargs):
        self.core = EngineCore(model, worker_extension_cls, bool(speculative_config), seed)

    @classmethod
    def from_engine_args(cls, engine_args, **kwargs) -> "AsyncLLM":
        return cls(**engine_args.kwargs)

    async def sleep(self, level: int = 1) -> None:
        await self.reset_prefix_cache()
        self.core.sleep(level)

    async def wake_up(self, tags: list[str] | None = None) -> None:
        self.core.wake_up(tags)

    async def reset_prefix_cache(self, device=None) -> bool:
        return True

    async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        await asyncio.sleep(0)
        return self.core.collective_rpc(method, timeout, args, kwargs)

    async def generate(self, prompt, sampling_params, request_id: str, **kwargs):
        await asyncio.sleep(0)
        ids = list(prompt["prompt_token_ids"])
        toks = self.core.generate_one(ids, sampling_params.max_tokens, sampling_params.seed,
                                      sampling_params.temperature == 0.0)
        yield RequestOutput(request_id, ids, [CompletionOutput(0, toks)])

    def shutdown(self) -> None:
        pass
