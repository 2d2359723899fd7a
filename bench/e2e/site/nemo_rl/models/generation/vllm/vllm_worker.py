"""nemo_rl/models/generation/vllm/vllm_worker.py: `VllmGenerationWorkerImpl`, the engine actor's body.

Owns one `vllm.LLM` (engine core in this process: VLLM_ENABLE_V1_MULTIPROCESSING=0, as NeMo-RL
sets), built with `enable_sleep_mode=True`, `load_format="dummy"` and NeMo-RL's worker extension.
`sleep()` is upstream's: reset the prefix cache, `llm.sleep(level=1)`, gc, empty_cache; colo-shim's
engine wrappers (vllm.entrypoints.llm.LLM) may turn it into level 2. The measurement probes
(bench/e2e/probes.py) are called by the harness, not by the loop.
"""

from __future__ import annotations

import gc
import os

from bench.e2e import engine, probes


class VllmGenerationWorkerImpl:
    def __init__(self, config: dict):
        self.cfg = config
        self.llm = engine.build_llm(config)
        self.probe = probes.EngineProbe(self)

    def prepare_refit_info(self, state_dict_info: dict) -> None:
        self.llm.collective_rpc("prepare_refit_info", args=(state_dict_info,))

    def wake_up(self, **kwargs):
        with self.probe.wake(kwargs.get("tags")):
            self.llm.wake_up(**kwargs)

    def sleep(self):
        self.llm.reset_prefix_cache()
        self.llm.sleep(level=1)
        gc.collect()
        engine.empty_cache()
        self.probe.after_sleep()

    def reset_prefix_cache(self):
        self.llm.reset_prefix_cache()

    def update_weights_via_ipc_zmq(self) -> bool:
        return all(self.llm.collective_rpc("update_weights_via_ipc_zmq", args=(os.environ["E2E_ZMQ_ADDR"],)))

    def generate(self, data: dict, greedy: bool = False) -> dict:
        self.probe.check_awake()
        return engine.generate(self.llm, data, greedy, self.cfg)

    # ---- measurement only (bench/e2e/probes.py)
    def report(self, what: str, *args):
        return getattr(self.probe, what)(*args)
