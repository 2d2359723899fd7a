"""nemo_rl/models/policy/lm_policy.py: the driver-side `Policy` over the Megatron worker actors.

As upstream's `RayWorkerGroup`: every call goes to all ranks (`run_all_workers_single_data`: each
gets the whole batch and works on its data-parallel share) and the results are collected in rank
order; the streaming refit returns one future per rank. The ranks are bench/e2e/rpc.py's Group.
Method names are upstream's.
"""

from __future__ import annotations


class Policy:
    def __init__(self, cluster, config: dict):
        self.cfg = config
        self.worker = cluster.start_trainer(config)

    def _all(self, method: str, *args, **kwargs) -> list:
        """run_all_workers_single_data + ray.get: the call reaches every rank before any is awaited."""
        return self.worker.call(method, *args, **kwargs)

    def prepare_refit_info(self) -> dict:
        return self._all("prepare_refit_info")[0]

    def get_free_memory_bytes(self) -> int:
        return min(self._all("get_free_memory_bytes"))

    def offload_before_refit(self) -> None:
        self._all("offload_before_refit")

    def offload_after_refit(self) -> None:
        self._all("offload_after_refit")

    def stream_weights_via_ipc_zmq(self, buffer_size_bytes: int) -> list:
        return self.worker.submit("stream_weights_via_ipc_zmq", buffer_size_bytes=buffer_size_bytes)  # one per rank

    def prepare_for_lp_inference(self) -> None:
        self._all("prepare_for_lp_inference")

    def get_logprobs(self, data: dict) -> dict:
        return {"logprobs": [row for out in self._all("get_logprobs", data) for row in out["logprobs"]]}

    def prepare_for_training(self) -> None:
        self._all("prepare_for_training")

    def train(self, data: dict, loss_fn=None) -> dict:
        results = self._all("train", data)
        return {"loss": sum(r["loss"] for r in results) / len(results)}

    def finish_training(self) -> None:
        self._all("finish_training")

    def save_checkpoint(self, weights_path: str, optimizer_path: str | None = None, **kwargs) -> list:
        return self._all("save_checkpoint", weights_path, optimizer_path)

    def finalize_async_save(self) -> None:
        self._all("finalize_async_save")

    def shutdown(self) -> None:
        self.worker.close()
