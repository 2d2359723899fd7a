"""Which fixes exist, where their declarations live, and which imports wake them.

The core learns about the fixes only through this table of names, never by importing a fix, so
the registry stays usable on its own (tests register test-only families) and a broken fix cannot
take the core down. TRIGGERS lists, per family, the top-level packages whose first import
installs the shim (colo_shim.core.deferred); tests/core/test_deferred.py checks it covers every
declared target.

The order of FAMILIES is the order the registry applies them in (one install, a post-import hook,
a Ray actor's class), each wrapping what is already there: where two families wrap one attribute,
the later one's wrapper runs first. `offload` stands before `megatron` so that at every offload
entry point the checkpoint fence runs before the offload copy; the offload wrappers also check it
at each call (colo_shim/offload/megatron.py), for a process that installed them the other way round.
"""

FAMILIES = ("nvrx", "offload", "megatron", "vllm")
MODULES = {
    "nvrx": "colo_shim.checkpoint.nvrx",
    "offload": "colo_shim.offload.megatron",
    "megatron": "colo_shim.checkpoint.megatron",
    "vllm": "colo_shim.discard.vllm",
}
TRIGGERS = {
    "nvrx": ("nvidia_resiliency_ext",),
    "offload": ("megatron", "nemo_rl"),
    "megatron": ("megatron", "nemo_rl"),
    "vllm": ("nemo_rl", "vllm"),
}
