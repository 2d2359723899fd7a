"""Test double of NeMo-RL v0.7.0 nemo_rl/models/generation/vllm/vllm_backend.py (VllmInternalWorkerExtension).

The code is the shared nemo_rl_common/vllm_backend.py, with the post-processing v0.5.0+ run after a refit.
"""

from __future__ import annotations

from nemo_rl_common.vllm_backend import VllmInternalWorkerExtension as _Common

__all__ = ["VllmInternalWorkerExtension"]


class VllmInternalWorkerExtension(_Common):
    POST_PROCESS = True  # v0.7.0: update_weights_via_ipc_zmq ends with process_weights_after_loading
