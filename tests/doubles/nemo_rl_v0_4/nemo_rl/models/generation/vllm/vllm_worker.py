"""Test double of NeMo-RL v0.4.0 nemo_rl/models/generation/vllm/vllm_worker.py.

BaseVllmGenerationWorker and `@ray.remote class VllmGenerationWorker(BaseVllmGenerationWorker)`
which itself defines sleep / wake_up (no Impl class before v0.7, so the methods live behind the
ActorClass). sleep() calls `self.llm.sleep(level=1)`; wake_up(**kwargs) forwards only `tags`.
The methods' code is nemo_rl_common/vllm_worker.py (shared with v0.7.0, whose Impl class holds
them), imported under a private name: this module has no VllmGenerationWorkerImpl, as upstream
v0.4.0, so colo-shim's v0.7 worker targets stay absent here.
"""

from __future__ import annotations

import ray

from nemo_rl_common.vllm_worker import BaseVllmGenerationWorker
from nemo_rl_common.vllm_worker import VllmGenerationWorkerImpl as _SyncWorkerMethods


@ray.remote  # pragma: no cover
class VllmGenerationWorker(_SyncWorkerMethods):
    pass


__all__ = ["BaseVllmGenerationWorker", "VllmGenerationWorker"]
