"""Patch families, one module each; every module starts with its PATCH declaration."""

FAMILIES = ("nvrx", "megatron", "vllm")
