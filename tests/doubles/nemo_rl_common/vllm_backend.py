"""Shared body of VllmInternalWorkerExtension: v0.3.1 nemo_rl/models/generation/vllm_backend.py and
v0.4.0 / v0.7.0 nemo_rl/models/generation/vllm/vllm_backend.py (the same class in each).

Runs inside vLLM's worker, next to the model. The refit's tensors arrive through a file named by
NRL_DOUBLE_REFIT_PATH instead of CUDA IPC / ZMQ (no GPU here); like upstream, the update calls
`self.model_runner.model.load_weights(weights=...)` with HF-format names.
"""

from __future__ import annotations

import os
from typing import Any

import torch


def _load_refit() -> list[tuple[str, torch.Tensor]]:
    return list(torch.load(os.environ["NRL_DOUBLE_REFIT_PATH"]).items())


class VllmInternalWorkerExtension:
    def report_device_id(self) -> str:
        return f"cpu-{self.rank}"

    def prepare_refit_info(self, state_dict_info: dict[str, Any]) -> None:
        self.state_dict_info = state_dict_info

    def update_weights_via_ipc_zmq(self) -> bool:
        self.model_runner.model.load_weights(weights=_load_refit())
        return True

    def update_weights_from_collective(self) -> bool:
        self.model_runner.model.load_weights(weights=_load_refit())
        return True

    def update_weights_from_local_ipc_handles(self, local_device_ipc_handles) -> bool:
        self.model_runner.model.load_weights(weights=_load_refit())
        return True

    def update_weights_from_global_ipc_handles(self, global_device_ipc_handles) -> bool:
        self.model_runner.model.load_weights(weights=_load_refit())
        return True

    def cleanup(self) -> None:
        pass
