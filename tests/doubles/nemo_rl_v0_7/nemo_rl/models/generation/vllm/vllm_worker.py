"""Test double of NeMo-RL v0.7.0 nemo_rl/models/generation/vllm/vllm_worker.py.

BaseVllmGenerationWorker, VllmGenerationWorkerImpl (the methods) and the thin
`@ray.remote class VllmGenerationWorker(VllmGenerationWorkerImpl)`, as in v0.7.0. sleep() calls
`self.llm.sleep(level=1)` and wake_up(**kwargs) forwards only `tags`, like upstream.
gc.collect()/torch.cuda.empty_cache() after sleep are left out (no GPU; they dominate CPU test time).
"""

from __future__ import annotations

from typing import Any, Optional

import ray
import torch


class BaseVllmGenerationWorker:
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
            worker_extension_cls="nemo_rl.models.generation.vllm.vllm_backend.VllmInternalWorkerExtension",
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


class VllmGenerationWorkerImpl(BaseVllmGenerationWorker):
    def _create_engine(self, llm_kwargs: dict[str, Any]) -> None:
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

    def update_weights_via_ipc_zmq(self) -> bool:
        """Update weights from IPC handles via ZMQ socket."""
        try:
            assert self.llm is not None, "Attempting to update weights with either an uninitialized vLLM or non-model-owner"
            if self.cfg["vllm_cfg"]["async_engine"]:
                raise RuntimeError("update_weights_via_ipc_zmq cannot be used with async_engine=True.")
            worker_result = self.llm.collective_rpc("update_weights_via_ipc_zmq", args=tuple())[0]
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


@ray.remote  # pragma: no cover
class VllmGenerationWorker(VllmGenerationWorkerImpl):
    pass
