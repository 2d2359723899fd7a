"""Shared body of VllmGeneration: v0.3.1 nemo_rl/models/generation/vllm.py and v0.4.0 / v0.7.0
nemo_rl/models/generation/vllm/vllm_generation.py.

`VllmGeneration` here is the v0.4.0+ class (the same in v0.4.0 and v0.7.0; both release modules
re-export it, so colo-shim's `...vllm_generation:VllmGeneration.*` targets patch this class, once
per process: each test process loads one release root). v0.3.1 subclasses `_VllmGenerationCore`
and adds its CUDA-IPC weight update. Each VllmGeneration holds prepare_for_generation and
finish_generation in its own class dict, as upstream, since colo-shim wraps those entries. Same method names and signatures as upstream;
finish_generation / prepare_for_generation keep upstream's control flow exactly (colocated ->
sleep / wake_up on every worker, not colocated -> reset_prefix_cache; kwargs dropped; every
exception printed and swallowed), which is what colo-shim has to live with. Data are plain dicts
instead of BatchedDataDict.
"""

from __future__ import annotations

from typing import Any, Optional, Union

from nemo_rl_common.release import upstream_module
from nemo_rl_common.virtual_cluster import RayVirtualCluster
from nemo_rl_common.worker_groups import RayWorkerBuilder, RayWorkerGroup, get

GenerationInterface = object
VllmConfig = dict
WORKER_FQN = "nemo_rl.models.generation.vllm.vllm_worker.VllmGenerationWorker"
ASYNC_WORKER_FQN = "nemo_rl.models.generation.vllm.vllm_worker_async.VllmAsyncGenerationWorker"


class _VllmGenerationCore(GenerationInterface):
    _worker_fqn = WORKER_FQN
    _async_worker_fqn = ASYNC_WORKER_FQN

    def __init__(self, cluster: RayVirtualCluster, config: VllmConfig, name_prefix: str = "vllm_policy",
                 workers_per_node: Optional[Union[int, list[int]]] = None):
        self.cfg = config
        worker_cls = self._async_worker_fqn if self.cfg["vllm_cfg"]["async_engine"] else self._worker_fqn
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

    def _run_update(self, method: str) -> list:
        method_name = f"{method}_async" if self.cfg["vllm_cfg"]["async_engine"] else method
        return self.worker_group.run_all_workers_single_data(
            method_name, run_rank_0_only_axes=["tensor_parallel", "pipeline_parallel"])


class VllmGeneration(_VllmGenerationCore):
    # in the class's own dict, as upstream: colo-shim wraps these entries
    prepare_for_generation = _VllmGenerationCore.prepare_for_generation
    finish_generation = _VllmGenerationCore.finish_generation

    def _checked_update(self, method: str) -> list:
        if not self.worker_group or not self.worker_group.workers:
            raise RuntimeError("Worker group is not initialized")
        return self._run_update(method)

    def update_weights_via_ipc_zmq(self) -> list:
        """Update weights of the policy using IPC handles via ZMQ socket."""
        return self._checked_update("update_weights_via_ipc_zmq")

    def update_weights_from_collective(self) -> list:
        """Update weights of the policy using collective communication."""
        return self._checked_update("update_weights_from_collective")


upstream_module("nemo_rl.models.generation.vllm.vllm_generation", VllmGeneration)  # v0.4.0+ path; v0.3.1 defines its own
