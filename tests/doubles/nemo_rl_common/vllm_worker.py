"""Shared bodies of NeMo-RL's vLLM generation workers (v0.3.1 nemo_rl/models/generation/vllm.py,
v0.4.0 and v0.7.0 nemo_rl/models/generation/vllm/vllm_worker.py and vllm_worker_async.py).

The release modules define or re-export upstream's names and add the `@ray.remote` classes:
- BaseVllmGenerationWorker: construction and request helpers (v0.4.0+ name; v0.3.1's single
  VllmGenerationWorker builds on it too, with its own worker_extension_cls path);
- VllmGenerationWorkerImpl / VllmAsyncGenerationWorkerImpl: the LLM / AsyncLLM methods (upstream
  names from v0.7.0; v0.4.0 keeps the same methods on its remote classes and imports these under
  private names, so that colo-shim's v0.7 targets stay absent there);
- _SyncEngineMethods / _AsyncEngineMethods: the methods every release has, which v0.3.1's one
  worker class combines with its CUDA-IPC weight updates.
sleep() calls `self.llm.sleep(level=1)` and wake_up(**kwargs) forwards only `tags`, like upstream.
gc.collect()/torch.cuda.empty_cache() after sleep are left out (no GPU; they dominate CPU test time).
"""

from __future__ import annotations

import asyncio
from typing import Any, Optional

import torch

from nemo_rl_common.release import upstream_module


class BaseVllmGenerationWorker:
    _worker_extension_cls = "nemo_rl.models.generation.vllm.vllm_backend.VllmInternalWorkerExtension"

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}"

    def __init__(self, config: dict, bundle_indices: Optional[list[int]] = None, fraction_of_gpus: float = 1.0,
                 seed: Optional[int] = None, extra_env_vars: Optional[list[str]] = None,
                 defer_model_load: bool = False):
        self.cfg = config
        self.llm = None
        vllm_kwargs = dict(self.cfg.get("vllm_kwargs", {}))
        llm_kwargs = dict(
            model=self.cfg["model_name"],
            seed=seed or 0,
            enable_sleep_mode=True,
            enable_expert_parallel=self.cfg["vllm_cfg"].get("expert_parallel_size", 1) > 1,
            worker_extension_cls=self._worker_extension_cls,
            **vllm_kwargs,
        )
        self._create_engine(llm_kwargs)

    def is_alive(self):
        return True

    def _build_sampling_params(self, *, greedy: bool, stop_strings=None, max_new_tokens: Optional[int] = None,
                               seed: Optional[int] = None):
        import vllm

        return vllm.SamplingParams(temperature=0.0 if greedy else self.cfg["temperature"],
                                   max_tokens=max_new_tokens or self.cfg["max_new_tokens"], seed=seed)

    @staticmethod
    def _prompt_seed(ids: list[int], index: int) -> int:
        """Per-request sampling seed from the prompt (the double's stand-in for vLLM's RNG state)."""
        return (sum((i + 1) * t for i, t in enumerate(ids)) * 7919 + index) % (2**31)

    def _prompts(self, data: dict) -> list[list[int]]:
        return [data["input_ids"][i, : int(data["input_lengths"][i])].tolist()
                for i in range(len(data["input_lengths"]))]

    @staticmethod
    def _pack(prompts: list[list[int]], generated: list[list[int]]) -> dict:
        width = max(len(p) + len(g) for p, g in zip(prompts, generated))
        return {"output_ids": torch.tensor([p + g + [0] * (width - len(p) - len(g)) for p, g in zip(prompts, generated)]),
                "generation_lengths": torch.tensor([len(g) for g in generated]),
                "unpadded_sequence_lengths": torch.tensor([len(p) + len(g) for p, g in zip(prompts, generated)]),
                "logprobs": torch.zeros(len(prompts), width)}

    def start_gpu_profiling(self) -> None:
        pass

    def stop_gpu_profiling(self) -> None:
        pass

    def engine_stats(self) -> dict:
        """Test-only probe: what the engine double recorded (not an upstream method)."""
        import sys

        core = self.llm.core
        shim = sys.modules.get("colo_shim")
        details = [s["details"] for s in shim.status() if s["name"] == "vllm"][:1] if shim else []
        guard = sys.modules.get("colo_shim.discard.guard")
        return {"events": core.events, "nan_generations": core.nan_generations, "cpu_bytes": core.cpu_bytes_held(),
                "shim": details[0] if details else None,
                "engine_shim": guard.state_for(self.llm).report() if guard and details else None}


def _create_llm(llm_kwargs: dict[str, Any]):
    import vllm

    return vllm.LLM(**llm_kwargs)


def _create_async_llm(llm_kwargs: dict[str, Any]):
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    return AsyncLLM.from_engine_args(AsyncEngineArgs(**llm_kwargs))


class _SyncEngineMethods:
    """The vllm.LLM methods of every release's sync worker."""

    def post_init(self):
        pass

    def generate(self, data: dict, greedy: bool = False) -> dict:
        """Generate a batch of data using vLLM generation."""
        prompts = self._prompts(data)
        params = [self._build_sampling_params(greedy=greedy, seed=self._prompt_seed(p, i))
                  for i, p in enumerate(prompts)]
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], sampling_params=params, use_tqdm=False)
        return self._pack(prompts, [list(o.outputs[0].token_ids) for o in outputs])

    def report_device_id(self) -> list[str]:
        return self.llm.collective_rpc("report_device_id", args=tuple())

    def prepare_refit_info(self, state_dict_info: dict[str, Any]) -> None:
        self.llm.collective_rpc("prepare_refit_info", args=(state_dict_info,))

    def _update_weights_rpc(self, caller: str, method: str, make_args) -> bool:
        """Body of the colocated weight updates (v0.3.1 IPC handles, v0.4.0+ ZMQ), as upstream."""
        try:
            assert self.llm is not None, "Attempting to update weights with either an uninitialized vLLM or non-model-owner"
            if self.cfg["vllm_cfg"]["async_engine"]:
                raise RuntimeError(f"{caller} cannot be used with async_engine=True.")
            return self._check_worker_result(self.llm.collective_rpc(method, args=make_args())[0])
        except Exception as e:
            print(f"Exception during collective_rpc for weight update: {e}")
            return False

    @staticmethod
    def _check_worker_result(worker_result) -> bool:
        if not worker_result:
            print(f"Error: Worker failed to update weights. Result: {worker_result}")
            return False
        return True

    def update_weights_from_collective(self) -> bool:
        """Update the model weights from collective communication."""
        try:
            return self._check_worker_result(self.llm.collective_rpc("update_weights_from_collective", args=tuple())[0])
        except Exception as e:
            print(f"Exception during collective_rpc for weight update: {e}")
            return False

    def reset_prefix_cache(self):
        """Reset the prefix cache of vLLM engine."""
        self.llm.llm_engine.reset_prefix_cache()

    def sleep(self):
        """Put the vLLM engine to sleep."""
        assert self.llm is not None, "Attempting to sleep with either an uninitialized vLLM or non-model-owner"
        if self.cfg["vllm_cfg"]["async_engine"]:
            raise RuntimeError("sleep cannot be used with async_engine=True. Use sleep_async instead.")
        self.llm.llm_engine.reset_prefix_cache()
        self.llm.sleep(level=1)

    def wake_up(self, **kwargs):
        """Wake up the vLLM engine."""
        assert self.llm is not None, "Attempting to wake up with either an uninitialized vLLM or non-model-owner"
        if self.cfg["vllm_cfg"]["async_engine"]:
            raise RuntimeError("wake_up cannot be used with async_engine=True. Use wake_up_async instead.")
        self.llm.wake_up(**_wake_up_args(kwargs))

    def shutdown(self) -> bool:
        self.llm = None
        return True


def _wake_up_args(kwargs: dict) -> dict:
    """wake_up(**kwargs) / wake_up_async(**kwargs) forward only `tags`, like upstream."""
    tags = kwargs.get("tags")
    wake_up_args = {}
    if tags is not None:
        wake_up_args["tags"] = tags
    return wake_up_args


class _AsyncEngineMethods:
    """The AsyncLLM methods of every release's async worker."""

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

    async def _update_weights_rpc_async(self, method: str, args: tuple) -> bool:
        """Body of the async colocated weight updates (v0.3.1 IPC handles, v0.4.0+ ZMQ), as upstream."""
        try:
            result_or_coro = await self.llm.collective_rpc(method, args=args)
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
        await self.llm.wake_up(**_wake_up_args(kwargs))


class VllmGenerationWorkerImpl(_SyncEngineMethods, BaseVllmGenerationWorker):
    def _create_engine(self, llm_kwargs: dict[str, Any]) -> None:
        self.llm = _create_llm(llm_kwargs)

    def update_weights_via_ipc_zmq(self) -> bool:
        """Update weights from IPC handles via ZMQ socket."""
        return self._update_weights_rpc("update_weights_via_ipc_zmq", "update_weights_via_ipc_zmq", tuple)


class VllmAsyncGenerationWorkerImpl(_AsyncEngineMethods, BaseVllmGenerationWorker):
    def _create_engine(self, llm_kwargs: dict[str, Any]) -> None:
        self.llm = _create_async_llm(llm_kwargs)

    async def update_weights_via_ipc_zmq_async(self) -> bool:
        """Async version of update_weights_via_ipc_zmq."""
        return await self._update_weights_rpc_async("update_weights_via_ipc_zmq", tuple())

    async def shutdown(self) -> bool:
        self.llm = None
        return True


# v0.4.0+ paths (v0.4.0 has no Impl classes: pickling falls back to by-value there, as for any class
# its module does not name; v0.3.1's classes live in its own vllm.py)
upstream_module("nemo_rl.models.generation.vllm.vllm_worker", BaseVllmGenerationWorker, VllmGenerationWorkerImpl)
upstream_module("nemo_rl.models.generation.vllm.vllm_worker_async", VllmAsyncGenerationWorkerImpl)

