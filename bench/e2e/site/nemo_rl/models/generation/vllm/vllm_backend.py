"""nemo_rl/models/generation/vllm/vllm_backend.py: `VllmInternalWorkerExtension` (worker_extension_cls).

The colocated refit as NeMo-RL v0.5+ receives it: a ZMQ REP socket connected to the trainer's;
per message a CUDA IPC handle of a packed uint8 buffer (rebuilt on this process's device), the
names, shapes and offsets of the tensors in it; views are sliced and handed to
`model_runner.model.load_weights`, then synchronize and ACK; on "COMPLETE",
`process_weights_after_loading` and empty_cache. The method name starts with `update_weights`, so
colo-shim learns refit coverage from it. With tensor parallelism every worker runs these methods
(`collective_rpc`), each connected to the trainer rank on its own GPU (`self.rank`: worker i on
GPU i, as trainer rank i). Both ends of the refit are bench/e2e/refit.py; vLLM
(or, in the CPU smoke, bench/e2e/fake_engine.py) imports this class by its dotted name.
"""

from __future__ import annotations

from bench.e2e import refit


class VllmInternalWorkerExtension:
    def prepare_refit_info(self, state_dict_info: dict) -> None:
        self.state_dict_info = state_dict_info

    def update_weights_via_ipc_zmq(self, address: str) -> bool:
        return refit.receive_weights(self, refit.rank_address(address, getattr(self, "rank", 0)))

    def e2e_weights_digest(self) -> dict:
        """Measurement only: per-HF-name digests of the weights this worker holds now (its part of
        them under tensor parallelism)."""
        tp = (getattr(self, "rank", 0), self.vllm_config.parallel_config.tensor_parallel_size) \
            if hasattr(self, "vllm_config") else (0, 1)
        return refit.weights_digest(self.model_runner.model, self.state_dict_info, tp)

    def e2e_pinned_bytes(self) -> int:
        """Measurement only: pinned host memory of this worker's process (its level-1 backup)."""
        from bench.e2e.probes import pinned_bytes

        return pinned_bytes()
