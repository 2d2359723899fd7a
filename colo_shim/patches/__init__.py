"""Patch families, one module each; every module starts with its PATCH declaration.

TRIGGERS lists, per family, the top-level packages whose first import installs the shim
(see colo_shim._deferred); tests/test_deferred.py checks it covers every declared target.
"""

FAMILIES = ("nvrx", "megatron", "vllm")
TRIGGERS = {
    "nvrx": ("nvidia_resiliency_ext",),
    "megatron": ("megatron", "nemo_rl"),
    "vllm": ("nemo_rl", "vllm"),
}
