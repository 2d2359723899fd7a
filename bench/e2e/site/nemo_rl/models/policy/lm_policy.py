"""nemo_rl/models/policy/lm_policy.py: the driver-side `Policy` over the Megatron worker actor.

Upstream shards data over a Ray worker group and returns futures for the streaming refit; here
one trainer actor (bench/e2e/rpc.py). Method names are upstream's.
"""

from __future__ import annotations


class Policy:
    def __init__(self, cluster, config: dict):
        self.cfg = config
        self.worker = cluster.start_trainer(config)

    def prepare_refit_info(self) -> dict:
        return self.worker.call("prepare_refit_info")

    def get_free_memory_bytes(self) -> int:
        return self.worker.call("get_free_memory_bytes")

    def offload_before_refit(self) -> None:
        self.worker.call("offload_before_refit")

    def offload_after_refit(self) -> None:
        self.worker.call("offload_after_refit")

    def stream_weights_via_ipc_zmq(self, buffer_size_bytes: int) -> list:
        return [self.worker.submit("stream_weights_via_ipc_zmq", buffer_size_bytes=buffer_size_bytes)]

    def prepare_for_lp_inference(self) -> None:
        self.worker.call("prepare_for_lp_inference")

    def get_logprobs(self, data: dict) -> dict:
        return self.worker.call("get_logprobs", data)

    def prepare_for_training(self) -> None:
        self.worker.call("prepare_for_training")

    def train(self, data: dict, loss_fn=None) -> dict:
        return self.worker.call("train", data)

    def finish_training(self) -> None:
        self.worker.call("finish_training")

    def save_checkpoint(self, weights_path: str, optimizer_path: str | None = None, **kwargs) -> dict:
        return self.worker.call("save_checkpoint", weights_path, optimizer_path)

    def finalize_async_save(self) -> None:
        self.worker.call("finalize_async_save")

    def shutdown(self) -> None:
        self.worker.close()
