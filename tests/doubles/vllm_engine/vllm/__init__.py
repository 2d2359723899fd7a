"""Test double of vLLM (see tests/doubles/README.md): mirrors vllm/__init__.py's LLM, SamplingParams exports."""

from vllm.entrypoints.llm import LLM
from vllm.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams"]
