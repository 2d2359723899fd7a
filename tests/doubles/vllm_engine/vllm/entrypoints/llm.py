"""Test double of vLLM's vllm/entrypoints/llm.py (class LLM: sleep, wake_up, generate, collective_rpc).

Signatures follow vLLM 0.10-0.25: `sleep(level=1)`, `wake_up(tags=None)`,
`collective_rpc(method, timeout=None, args=(), kwargs=None)`; the behaviour lives in
vllm/_double_core.py because sleep mode cannot run without a GPU.
"""

from __future__ import annotations

from vllm._double_core import EngineCore
from vllm.outputs import CompletionOutput, RequestOutput


class _LLMEngine:
    def __init__(self, core: EngineCore):
        self.core = core

    def reset_prefix_cache(self) -> bool:
        return True


class LLM:
    def __init__(self, model: str, *, seed: int = 0, enable_sleep_mode: bool = False,
                 worker_extension_cls: str | None = None, speculative_config: dict | None = None,
                 **kwargs):
        self.core = EngineCore(model, worker_extension_cls, bool(speculative_config), seed)
        self.llm_engine = _LLMEngine(self.core)

    def sleep(self, level: int = 1):
        self.reset_prefix_cache()
        self.core.sleep(level)

    def wake_up(self, tags: list[str] | None = None):
        self.core.wake_up(tags)

    def reset_prefix_cache(self, device=None) -> bool:
        return True

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        return self.core.collective_rpc(method, timeout, args, kwargs)

    def generate(self, prompts, sampling_params=None, *, use_tqdm=True, **kwargs):
        prompts = prompts if isinstance(prompts, list) else [prompts]
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        outs = []
        for i, (prompt, sp) in enumerate(zip(prompts, params)):
            ids = list(prompt["prompt_token_ids"])
            toks = self.core.generate_one(ids, sp.max_tokens, sp.seed, sp.temperature == 0.0)
            outs.append(RequestOutput(str(i), ids, [CompletionOutput(0, toks)]))
        return outs
