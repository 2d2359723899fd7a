"""Test double of NeMo-RL v0.4.0 nemo_rl/models/generation/vllm/vllm_worker_async.py.

`@ray.remote class VllmAsyncGenerationWorker(BaseVllmGenerationWorker)` on vLLM's AsyncLLM;
sleep_async calls `await self.llm.sleep(level=1)`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import ray

from nemo_rl.models.generation.vllm.vllm_worker import BaseVllmGenerationWorker


@ray.remote  # pragma: no cover
class VllmAsyncGenerationWorker(BaseVllmGenerationWorker):
    def _create_engine(self, llm_kwargs: dict[str, Any]) -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self.llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**llm_kwargs))

    async def post_init_async(self):
        pass

    async def generate_async(self, data: dict, greedy: bool = False):
        """Yield (original index, single-sample result) as each request finishes."""
        prompts = self._prompts(data)
        for i, prompt in enumerate(prompts):
            params = self._build_sampling_params(greedy=greedy, seed=self._prompt_seed(prompt, i))
            final = None
            async for out in self.llm.generate({"prompt_token_ids": prompt}, params, f"req-{i}"):
                final = out
            yield i, self._pack([prompt], [list(final.outputs[0].token_ids)])

    async def report_device_id_async(self) -> list[str]:
        return await self.llm.collective_rpc("report_device_id", args=tuple())

    async def prepare_refit_info_async(self, state_dict_info: dict[str, Any]) -> None:
        await self.llm.collective_rpc("prepare_refit_info", args=(state_dict_info,))

    async def update_weights_via_ipc_zmq_async(self) -> bool:
        """Async version of update_weights_via_ipc_zmq."""
        try:
            result_or_coro = await self.llm.collective_rpc("update_weights_via_ipc_zmq", args=tuple())
            worker_results = await result_or_coro if asyncio.iscoroutine(result_or_coro) else result_or_coro
            if not worker_results[0]:
                print(f"Error: Worker failed to update weights. Result: {worker_results[0]}")
                return False
            return True
        except Exception as e:
            print(f"Exception during collective_rpc for weight update: {e}")
            return False

    async def update_weights_from_collective_async(self) -> bool:
        try:
            worker_results = await self.llm.collective_rpc("update_weights_from_collective", args=tuple())
            return bool(worker_results[0])
        except Exception as e:
            print(f"Exception during collective_rpc for weight update: {e}")
            return False

    async def reset_prefix_cache_async(self):
        await self.llm.reset_prefix_cache()

    async def sleep_async(self):
        """Async version of sleep."""
        assert self.llm is not None, "Attempting to sleep with either an uninitialized vLLM or non-model-owner"
        if not self.cfg["vllm_cfg"]["async_engine"]:
            raise RuntimeError("sleep_async can only be used with async_engine=True. Use sleep instead.")
        await self.llm.reset_prefix_cache()
        await self.llm.sleep(level=1)

    async def wake_up_async(self, **kwargs):
        """Async version of wake_up."""
        assert self.llm is not None, "Attempting to wake up with either an uninitialized vLLM or non-model-owner"
        tags = kwargs.get("tags")
        wake_up_args = {}
        if tags is not None:
            wake_up_args["tags"] = tags
        await self.llm.wake_up(**wake_up_args)

    async def shutdown(self) -> bool:
        self.llm = None
        return True

    def engine_stats(self) -> dict:
        """Test-only probe: what the engine double recorded (not an upstream method)."""
        import sys

        core = self.llm.core
        shim = sys.modules.get("colo_shim")
        details = [s["details"] for s in shim.status() if s["name"] == "vllm"][:1] if shim else []
        guard = sys.modules.get("colo_shim.discard_guard")
        return {"events": core.events, "nan_generations": core.nan_generations, "cpu_bytes": core.cpu_bytes_held(),
                "shim": details[0] if details else None,
                "engine_shim": guard.state_for(self.llm).report() if guard and details else None}
