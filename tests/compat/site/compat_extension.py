"""vLLM worker extension for the compat run's engine double (tests/doubles/vllm_engine).

The real NeMo-RL VllmInternalWorkerExtension receives weights over CUDA IPC / ZMQ, which needs
a GPU; this one loads the trainer's state dict from the file the policy double writes
(NRL_DOUBLE_REFIT_PATH) and calls `model.load_weights`, then, from v0.5 on (as every later
vllm_backend.py does on IPCProtocol.COMPLETE), `process_weights_after_loading`, under every update
method name the releases call.
"""

import os

from nemo_rl_common.vllm_backend import VllmInternalWorkerExtension, _load_refit


class CompatWorkerExtension(VllmInternalWorkerExtension):
    def _load(self) -> bool:
        model = self.model_runner.model
        model.load_weights(weights=_load_refit())
        if os.environ.get("COLO_SHIM_COMPAT_RELEASE", "main") not in ("v0.3.1", "v0.4.0"):
            model.process_weights_after_loading()
        return True

    def update_weights_via_ipc_zmq(self) -> bool:
        return self._load()

    def update_weights_from_collective(self) -> bool:
        return self._load()

    def update_weights_from_ipc_handles(self, ipc_handles=None) -> bool:
        return self._load()
