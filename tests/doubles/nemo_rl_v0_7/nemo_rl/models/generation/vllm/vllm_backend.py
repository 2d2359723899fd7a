"""Test double of NeMo-RL v0.7.0 nemo_rl/models/generation/vllm/vllm_backend.py (VllmInternalWorkerExtension).

The code is the same in the v0.3.1, v0.4.0 and v0.7.0 doubles: nemo_rl_common/vllm_backend.py.
"""

from __future__ import annotations

from nemo_rl_common.vllm_backend import VllmInternalWorkerExtension

__all__ = ["VllmInternalWorkerExtension"]
