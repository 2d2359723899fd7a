"""Test double of NeMo-RL (see tests/doubles/README.md)."""

from nemo_rl.models.generation.vllm.vllm_generation import VllmGeneration
from nemo_rl.models.generation.vllm.vllm_worker import VllmGenerationWorker
from nemo_rl.models.generation.vllm.vllm_worker_async import VllmAsyncGenerationWorker

__all__ = ["VllmGeneration", "VllmGenerationWorker", "VllmAsyncGenerationWorker"]
