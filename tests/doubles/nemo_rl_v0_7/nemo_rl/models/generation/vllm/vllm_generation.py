"""Test double of NeMo-RL v0.7.0 nemo_rl/models/generation/vllm/vllm_generation.py (class VllmGeneration).

Same class, method names and signatures as upstream; finish_generation / prepare_for_generation
keep upstream's control flow exactly (colocated -> sleep / wake_up on every worker, not
colocated -> reset_prefix_cache; kwargs dropped; every exception printed and swallowed), which
is what colo-shim has to live with. Data are plain dicts instead of BatchedDataDict.
"""

from __future__ import annotations

from typing import Any, Optional, Union

from nemo_rl.distributed.virtual_cluster import RayVirtualCluster
from nemo_rl.distributed.worker_groups import RayWorkerBuilder, RayWorkerGroup, get

GenerationInterface = object
VllmConfig = dict
WORKER_FQN = "nemo_rl.models.generation.vllm.vllm_worker.VllmGenerationWorker"
ASYNC_WORKER_FQN = "nemo_rl.models.generation.vllm.vllm_worker_async.VllmAsyncGenerationWorker"


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

    def update_weights_via_ipc_zmq(self) -> list:
        """Update weights of the policy using IPC handles via ZMQ socket."""
        if not self.worker_group or not self.worker_group.workers:
            raise RuntimeError("Worker group is not initialized")
        method_name = ("update_weights_via_ipc_zmq_async" if self.cfg["vllm_cfg"]["async_engine"]
                       else "update_weights_via_ipc_zmq")
        return self.worker_group.run_all_workers_single_data(
            method_name, run_rank_0_only_axes=["tensor_parallel", "pipeline_parallel"])

    def update_weights_from_collective(self) -> list:
        """Update weights of the policy using collective communication."""
        if not self.worker_group or not self.worker_group.workers:
            raise RuntimeError("Worker group is not initialized")
        method_name = ("update_weights_from_collective_async" if self.cfg["vllm_cfg"]["async_engine"]
                       else "update_weights_from_collective")
        return self.worker_group.run_all_workers_single_data(
            method_name, run_rank_0_only_axes=["tensor_parallel", "pipeline_parallel"])
