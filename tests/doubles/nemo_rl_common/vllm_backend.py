"""Shared body of VllmInternalWorkerExtension: v0.3.1 nemo_rl/models/generation/vllm_backend.py and
v0.4.0 / v0.7.0 nemo_rl/models/generation/vllm/vllm_backend.py (the same class in each).

Runs inside vLLM's worker, next to the model. The refit's tensors arrive through a file named by
NRL_DOUBLE_REFIT_PATH instead of CUDA IPC / ZMQ (no GPU here); like upstream, the update calls
`self.model_runner.model.load_weights(weights=...)` with HF-format names; from v0.5.0 on,
update_weights_via_ipc_zmq then runs vLLM's process_weights_after_loading, as upstream does.
"""

from __future__ import annotations

import os
from typing import Any

import torch


def _load_refit() -> list[tuple[str, torch.Tensor]]:
    return list(torch.load(os.environ["NRL_DOUBLE_REFIT_PATH"]).items())


class VllmInternalWorkerExtension:
    # v0.5.0+ finish update_weights_via_ipc_zmq with process_weights_after_loading (FP8/KV scales
    # and every other derived tensor are recomputed from the new weights); v0.3/v0.4 do not.
    POST_PROCESS = False

    def _process_weights_after_loading(self) -> None:
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.utils import process_weights_after_loading

        with set_current_vllm_config(self.model_runner.vllm_config):
            process_weights_after_loading(self.model_runner.model, self.model_config, self.device)

    def report_device_id(self) -> str:
        return f"cpu-{self.rank}"

    def prepare_refit_info(self, state_dict_info: dict[str, Any]) -> None:
        self.state_dict_info = state_dict_info

    def update_weights_via_ipc_zmq(self) -> bool:
        self.model_runner.model.load_weights(weights=_load_refit())
        if self.POST_PROCESS:
            self._process_weights_after_loading()
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
