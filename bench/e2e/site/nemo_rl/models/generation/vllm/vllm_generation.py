"""nemo_rl/models/generation/vllm/vllm_generation.py: the driver-side `VllmGeneration`.

Upstream fans each call out to its Ray worker group; here one engine actor (bench/e2e/rpc.py).
finish_generation / prepare_for_generation keep upstream's control flow: colocated
finish_generation calls the workers' `sleep` (no arguments), prepare_for_generation forwards its
kwargs (`tags`) to `wake_up`, and both print and swallow worker exceptions, returning False.
colo-shim wraps both methods and update_weights_via_ipc_zmq through this module's path.
"""

from __future__ import annotations

import traceback


class VllmGeneration:
    def __init__(self, cluster, config: dict, name_prefix: str = "vllm_policy"):
        self.cfg = config
        self.worker = cluster.start_engine(config)

    def prepare_refit_info(self, state_dict_info: dict) -> None:
        self.worker.call("prepare_refit_info", state_dict_info)

    def prepare_for_generation(self, *args, **kwargs) -> bool:
        try:
            self.worker.call("wake_up", **kwargs)
            return True
        except Exception:  # upstream: print and carry on
            traceback.print_exc()
            return False

    def finish_generation(self, *args, **kwargs) -> bool:
        try:
            if self.cfg["colocated"]["enabled"]:
                self.worker.call("sleep")
            else:
                self.worker.call("reset_prefix_cache")
            return True
        except Exception:
            traceback.print_exc()
            return False

    def update_weights_via_ipc_zmq(self) -> list:
        """Futures of the workers' receive (the trainer streams at the same time)."""
        return [self.worker.submit("update_weights_via_ipc_zmq")]

    def generate(self, data: dict, greedy: bool = False) -> dict:
        return self.worker.call("generate", data, greedy)

    def shutdown(self) -> None:
        self.worker.close()
