"""Test double of NeMo-RL v0.3.1 nemo_rl/models/generation/vllm.py (VllmGenerationWorker and VllmGeneration in one module).

Same class, method names and signatures as upstream; finish_generation / prepare_for_generation
keep upstream's control flow exactly (colocated -> sleep / wake_up on every worker, not
colocated -> reset_prefix_cache; kwargs dropped; every exception printed and swallowed), which
is what colo-shim has to live with. Data are plain dicts instead of BatchedDataDict.
The worker is one `@ray.remote class VllmGenerationWorker` with sync and async methods, as in
v0.3.1; gc.collect()/torch.cuda.empty_cache() after sleep are left out (no GPU).
"""

from __future__ import annotations

import asyncio
from typing import Any, Optional, Union

import ray
import torch

from nemo_rl.distributed.virtual_cluster import RayVirtualCluster
from nemo_rl.distributed.worker_groups import RayWorkerBuilder, RayWorkerGroup, get

GenerationInterface = object
VllmConfig = dict
WORKER_FQN = "nemo_rl.models.generation.vllm.VllmGenerationWorker"
ASYNC_WORKER_FQN = "nemo_rl.models.generation.vllm.VllmGenerationWorker"


@ray.remote  # pragma: no cover
class VllmGenerationWorker:
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
            worker_extension_cls="nemo_rl.models.generation.vllm_backend.VllmInternalWorkerExtension",
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

    def _create_engine(self, llm_kwargs: dict[str, Any]) -> None:
        if self.cfg["vllm_cfg"]["async_engine"]:
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM

            self.llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**llm_kwargs))
        else:
            import vllm

            self.llm = vllm.LLM(**llm_kwargs)

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

    def update_weights_from_ipc_handles(self, ipc_handles: dict[str, Any]) -> bool:
        """Update weights from IPC handles by delegating to the vLLM Worker implementation."""
        try:
            assert self.llm is not None, "Attempting to update weights with either an uninitialized vLLM or non-model-owner"
            if self.cfg["vllm_cfg"]["async_engine"]:
                raise RuntimeError("update_weights_from_ipc_handles cannot be used with async_engine=True.")
            worker_result = self.llm.collective_rpc(
                "update_weights_from_local_ipc_handles", args=(ipc_handles["cpu-0"],))[0]
            if not worker_result:
                print(f"Error: Worker failed to update weights. Result: {worker_result}")
                return False
            return True
        except Exception as e:
            print(f"Exception during collective_rpc for weight update: {e}")
            return False

    def update_weights_from_collective(self) -> bool:
        """Update the model weights from collective communication."""
        try:
            worker_result = self.llm.collective_rpc("update_weights_from_collective", args=tuple())[0]
            if not worker_result:
                print(f"Error: Worker failed to update weights. Result: {worker_result}")
                return False
            return True
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
        tags = kwargs.get("tags")
        wake_up_args = {}
        if tags is not None:
            wake_up_args["tags"] = tags
        self.llm.wake_up(**wake_up_args)

    def shutdown(self) -> bool:
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

    async def update_weights_from_ipc_handles_async(self, ipc_handles: dict[str, Any]) -> bool:
        """Async version of update_weights_from_ipc_handles."""
        try:
            result_or_coro = await self.llm.collective_rpc(
                "update_weights_from_global_ipc_handles", args=(ipc_handles,))
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


class VllmGeneration(GenerationInterface):
    def __init__(self, cluster: RayVirtualCluster, config: VllmConfig, name_prefix: str = "vllm_policy",
                 workers_per_node: Optional[Union[int, list[int]]] = None):
        self.cfg = config
        worker_cls = ASYNC_WORKER_FQN if self.cfg["vllm_cfg"]["async_engine"] else WORKER_FQN
        worker_builder = RayWorkerBuilder(worker_cls, config)
        self.worker_group = RayWorkerGroup(cluster, worker_builder, name_prefix=name_prefix,
                                           workers_per_node=workers_per_node, env_vars={})
        self.dp_size = self.worker_group.dp_size

    def generate(self, data: dict, greedy: bool = False) -> dict:
        """Generate a batch of data using vLLM."""
        future_bundle = self.worker_group.run_all_workers_sharded_data(
            "generate", data=[data], in_sharded_axes=["data_parallel"], replicate_on_axes=None,
            output_is_replicated=None, common_kwargs={"greedy": greedy})
        return self.worker_group.get_all_worker_results(future_bundle)[0]

    async def generate_async(self, data: dict, greedy: bool = False):
        """Yield (index, result) per sample from the async engine."""
        results = self.worker_group.run_all_workers_sharded_data(
            "generate_async", data=[data], common_kwargs={"greedy": greedy})
        for item in get(results)[0]:
            yield item

    def prepare_for_generation(self, *args: Any, **kwargs: Any) -> bool:
        """Wake workers up for colocated inference."""
        if not self.cfg["colocated"]["enabled"]:
            return True
        try:
            method_name = "wake_up_async" if self.cfg["vllm_cfg"]["async_engine"] else "wake_up"
            futures = self.worker_group.run_all_workers_single_data(
                method_name, run_rank_0_only_axes=["tensor_parallel", "pipeline_parallel"], **kwargs)
            results = get(futures)
            return all(result for result in results if result is not None)
        except Exception as e:
            print(f"Error during policy preparation: {e}")
            return False

    def finish_generation(self, *args: Any, **kwargs: Any) -> bool:
        """Sleep workers and reset prefix cache."""
        try:
            if self.cfg["colocated"]["enabled"]:
                method_name = "sleep_async" if self.cfg["vllm_cfg"]["async_engine"] else "sleep"
            else:
                method_name = ("reset_prefix_cache_async" if self.cfg["vllm_cfg"]["async_engine"]
                               else "reset_prefix_cache")
            futures = self.worker_group.run_all_workers_single_data(
                method_name, run_rank_0_only_axes=["tensor_parallel", "pipeline_parallel"])
            results = get(futures)
            return all(result for result in results if result is not None)
        except Exception as e:
            print(f"Error during policy preparation: {e}")
            return False

    def shutdown(self) -> bool:
        try:
            return self.worker_group.shutdown(cleanup_method="shutdown")
        except Exception as e:
            print(f"Error during policy shutdown: {e}")
            return False

    def prepare_refit_info(self, state_dict_info: dict[str, Any]) -> None:
        method_name = "prepare_refit_info_async" if self.cfg["vllm_cfg"]["async_engine"] else "prepare_refit_info"
        get(self.worker_group.run_all_workers_single_data(
            method_name, state_dict_info=state_dict_info, run_rank_0_only_axes=["tensor_parallel", "pipeline_parallel"]))

    def update_weights_from_ipc_handles(self, ipc_handles: dict[str, Any]) -> bool:
        """Update weights of the policy using IPC handles, considering tensor parallelism."""
        if not self.worker_group or not self.worker_group.workers:
            return False
        method_name = ("update_weights_from_ipc_handles_async" if self.cfg["vllm_cfg"]["async_engine"]
                       else "update_weights_from_ipc_handles")
        try:
            futures = self.worker_group.run_all_workers_multiple_data(
                method_name, ipc_handles=[ipc_handles for _ in self.worker_group.workers],
                run_rank_0_only_axes=["tensor_parallel", "pipeline_parallel"])
            results = get(futures)
            return all(result for result in results if result is not None)
        except Exception as e:
            print(f"Error during update weights: {e}")
            return False

    def update_weights_from_collective(self) -> list:
        method_name = ("update_weights_from_collective_async" if self.cfg["vllm_cfg"]["async_engine"]
                       else "update_weights_from_collective")
        return self.worker_group.run_all_workers_single_data(
            method_name, run_rank_0_only_axes=["tensor_parallel", "pipeline_parallel"])
