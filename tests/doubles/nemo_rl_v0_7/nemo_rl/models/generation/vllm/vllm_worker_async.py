"""Test double of NeMo-RL v0.7.0 nemo_rl/models/generation/vllm/vllm_worker_async.py.

VllmAsyncGenerationWorkerImpl (AsyncLLM engine; sleep_async calls `await self.llm.sleep(level=1)`)
and the thin `@ray.remote class VllmAsyncGenerationWorker(VllmAsyncGenerationWorkerImpl)`.
The Impl class's code is nemo_rl_common/vllm_worker.py (shared with v0.4.0 and v0.3.1); colo-shim
patches VllmAsyncGenerationWorkerImpl.sleep_async through this module.
"""

from __future__ import annotations

import ray

from nemo_rl.models.generation.vllm.vllm_worker import BaseVllmGenerationWorker  # noqa: F401 (as upstream)
from nemo_rl_common.vllm_worker import VllmAsyncGenerationWorkerImpl


@ray.remote  # pragma: no cover
class VllmAsyncGenerationWorker(VllmAsyncGenerationWorkerImpl):
    pass


__all__ = ["VllmAsyncGenerationWorkerImpl", "VllmAsyncGenerationWorker"]
