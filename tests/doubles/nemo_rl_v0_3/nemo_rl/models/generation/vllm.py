"""Test double of NeMo-RL v0.3.1 nemo_rl/models/generation/vllm.py (VllmGenerationWorker and VllmGeneration in one module).

Same class, method names and signatures as upstream; finish_generation / prepare_for_generation
keep upstream's control flow exactly (colocated -> sleep / wake_up on every worker, not
colocated -> reset_prefix_cache; kwargs dropped; every exception printed and swallowed), which
is what colo-shim has to live with. Data are plain dicts instead of BatchedDataDict.
The worker is one `@ray.remote class VllmGenerationWorker` with sync and async methods, as in
v0.3.1; gc.collect()/torch.cuda.empty_cache() after sleep are left out (no GPU).
The methods every release shares are nemo_rl_common/vllm_worker.py and vllm_generation.py; this
module adds v0.3.1's own: one engine factory for both engines, the CUDA-IPC weight updates, and
the v0.3.1 module paths (worker FQN, worker_extension_cls).
"""

from __future__ import annotations

from typing import Any

import ray

from nemo_rl.distributed.worker_groups import get
from nemo_rl_common.vllm_generation import GenerationInterface, VllmConfig, _VllmGenerationCore  # noqa: F401
from nemo_rl_common.vllm_worker import (
    BaseVllmGenerationWorker,
    _AsyncEngineMethods,
    _create_async_llm,
    _create_llm,
    _SyncEngineMethods,
)

WORKER_FQN = "nemo_rl.models.generation.vllm.VllmGenerationWorker"
ASYNC_WORKER_FQN = "nemo_rl.models.generation.vllm.VllmGenerationWorker"


@ray.remote  # pragma: no cover
class VllmGenerationWorker(_SyncEngineMethods, _AsyncEngineMethods, BaseVllmGenerationWorker):
    _worker_extension_cls = "nemo_rl.models.generation.vllm_backend.VllmInternalWorkerExtension"

    def _create_engine(self, llm_kwargs: dict[str, Any]) -> None:
        self.llm = (_create_async_llm if self.cfg["vllm_cfg"]["async_engine"] else _create_llm)(llm_kwargs)

    def update_weights_from_ipc_handles(self, ipc_handles: dict[str, Any]) -> bool:
        """Update weights from IPC handles by delegating to the vLLM Worker implementation."""
        return self._update_weights_rpc("update_weights_from_ipc_handles", "update_weights_from_local_ipc_handles",
                                        lambda: (ipc_handles["cpu-0"],))

    async def update_weights_from_ipc_handles_async(self, ipc_handles: dict[str, Any]) -> bool:
        """Async version of update_weights_from_ipc_handles."""
        return await self._update_weights_rpc_async("update_weights_from_global_ipc_handles", (ipc_handles,))


class VllmGeneration(_VllmGenerationCore):
    _worker_fqn = WORKER_FQN
    _async_worker_fqn = ASYNC_WORKER_FQN
    # in the class's own dict, as upstream: colo-shim wraps these entries
    prepare_for_generation = _VllmGenerationCore.prepare_for_generation
    finish_generation = _VllmGenerationCore.finish_generation

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
        return self._run_update("update_weights_from_collective")
