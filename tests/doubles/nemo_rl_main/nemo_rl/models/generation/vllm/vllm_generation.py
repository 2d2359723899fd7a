"""Test double of NeMo-RL main (7ea279abf) nemo_rl/models/generation/vllm/vllm_generation.py (class VllmGeneration).

Upstream's class is unchanged from v0.4.0: both doubles re-export nemo_rl_common/vllm_generation.py's
VllmGeneration (same methods and signatures; finish_generation / prepare_for_generation keep
upstream's control flow), which colo-shim patches through this module's path.
"""

from __future__ import annotations

from nemo_rl_common.vllm_generation import ASYNC_WORKER_FQN, WORKER_FQN, GenerationInterface, VllmConfig, VllmGeneration

__all__ = ["ASYNC_WORKER_FQN", "WORKER_FQN", "GenerationInterface", "VllmConfig", "VllmGeneration"]
