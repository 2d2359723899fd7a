"""v0.4+ package layout: VllmGeneration lives in vllm_generation (colo-shim patches it there)."""

from nemo_rl.models.generation.vllm.vllm_generation import VllmGeneration

__all__ = ["VllmGeneration"]
