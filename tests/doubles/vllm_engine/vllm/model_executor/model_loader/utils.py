"""Test double of vLLM's vllm/model_executor/model_loader/utils.py (process_weights_after_loading).

Upstream walks the modules and lets each quantization method recompute its derived tensors (FP8
scales, repacked layouts); the engine double's model does that in its own
`process_weights_after_loading()` (it recreates `qkv_scale` from the freshly loaded qkv weights).
"""

from __future__ import annotations


def process_weights_after_loading(model, model_config, target_device) -> None:
    model.process_weights_after_loading()
