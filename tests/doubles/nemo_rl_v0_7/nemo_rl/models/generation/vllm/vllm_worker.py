"""Test double of NeMo-RL v0.7.0 nemo_rl/models/generation/vllm/vllm_worker.py.

BaseVllmGenerationWorker, VllmGenerationWorkerImpl (the methods) and the thin
`@ray.remote class VllmGenerationWorker(VllmGenerationWorkerImpl)`, as in v0.7.0. sleep() calls
`self.llm.sleep(level=1)` and wake_up(**kwargs) forwards only `tags`, like upstream.
gc.collect()/torch.cuda.empty_cache() after sleep are left out (no GPU; they dominate CPU test time).
The two classes' code is nemo_rl_common/vllm_worker.py (shared with v0.4.0 and v0.3.1); colo-shim
patches VllmGenerationWorkerImpl.sleep through this module.
"""

from __future__ import annotations

import ray

from nemo_rl_common.vllm_worker import BaseVllmGenerationWorker, VllmGenerationWorkerImpl


@ray.remote  # pragma: no cover
class VllmGenerationWorker(VllmGenerationWorkerImpl):
    pass


__all__ = ["BaseVllmGenerationWorker", "VllmGenerationWorkerImpl", "VllmGenerationWorker"]
