"""Which fixes exist, where their declarations live, and which imports wake them.

The core learns about the fixes only through this table of names, never by importing a fix, so
the registry stays usable on its own (tests register test-only families) and a broken fix cannot
take the core down. TRIGGERS lists, per family, the top-level packages whose first import
installs the shim (colo_shim.core.deferred); tests/core/test_deferred.py checks it covers every
declared target.
"""

FAMILIES = ("nvrx", "megatron", "vllm")
MODULES = {
    "nvrx": "colo_shim.checkpoint.nvrx",
    "megatron": "colo_shim.checkpoint.megatron",
    "vllm": "colo_shim.discard.vllm",
}
TRIGGERS = {
    "nvrx": ("nvidia_resiliency_ext",),
    "megatron": ("megatron", "nemo_rl"),
    "vllm": ("nemo_rl", "vllm"),
}
