"""Test double of NeMo-RL v0.4.0 nemo_rl/models/generation/vllm/vllm_worker_async.py.

`@ray.remote class VllmAsyncGenerationWorker(BaseVllmGenerationWorker)` on vLLM's AsyncLLM;
sleep_async calls `await self.llm.sleep(level=1)`.
The methods' code is nemo_rl_common/vllm_worker.py (shared with v0.7.0, whose Impl class holds
them), imported under a private name: no VllmAsyncGenerationWorkerImpl here, as upstream v0.4.0.
"""

from __future__ import annotations

import ray

from nemo_rl.models.generation.vllm.vllm_worker import BaseVllmGenerationWorker  # noqa: F401 (as upstream)
from nemo_rl_common.vllm_worker import VllmAsyncGenerationWorkerImpl as _AsyncWorkerMethods


@ray.remote  # pragma: no cover
class VllmAsyncGenerationWorker(_AsyncWorkerMethods):
    pass


__all__ = ["VllmAsyncGenerationWorker"]
