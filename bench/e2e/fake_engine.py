"""The CPU smoke's engine (E2E_FAKE_ENGINE=1): the generation side only, without vLLM.

It loads NeMo-RL's worker extension by its dotted name, as vLLM does with `worker_extension_cls`,
so the smoke receives the real ZMQ refit through the real extension code (and the extension,
which imports refit.py, never has to import the engine back). It holds the HF weights it was sent
and "generates" ids derived from them, so a refit that changed nothing would show in the ids.
Sleep and wake only flip a flag: no device memory, no colo-shim engine side.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from types import SimpleNamespace

import torch


class _FakeModel:
    def __init__(self):
        self.params = {}

    def named_parameters(self):
        return iter(sorted(self.params.items()))

    def parameters(self):
        return iter([torch.zeros(1)] + list(self.params.values()))

    def load_weights(self, weights):
        for name, t in weights:
            self.params[name] = t.clone()


class FakeLLM:
    """Generation side only, for the CPU smoke: same worker-extension refit, ids derived from the weights."""

    def __init__(self, cfg, worker_extension_cls: str):
        module, _, name = worker_extension_cls.rpartition(".")
        extension = getattr(importlib.import_module(module), name)
        worker = type("FakeWorker", (extension,), {})()
        worker.model_runner = SimpleNamespace(model=_FakeModel())
        self.worker, self.cfg, self.asleep = worker, cfg, False

    def collective_rpc(self, method, args=(), kwargs=None):
        return [getattr(self.worker, method)(*args, **(kwargs or {}))]

    def sleep(self, level=1):
        self.asleep = True

    def wake_up(self, tags=None):
        if tags and all(str(t).startswith("colo_shim:") for t in tags):
            return
        self.asleep = False

    def reset_prefix_cache(self):
        return True

    def generate(self, prompts, params, use_tqdm=False):
        state = hashlib.sha1(json.dumps({k: round(float(v.double().sum()), 6) for k, v in
                                         self.worker.model_runner.model.params.items()}).encode()).digest()
        vocab = self.cfg["vocab"]
        outs = []
        for prompt, sp in zip(prompts, params):
            seed = 0 if sp["greedy"] else sp["seed"]
            ids = [(state[(j + seed) % len(state)] * 31 + sum(prompt["prompt_token_ids"]) + j) % vocab
                   for j in range(sp["max_tokens"])]
            outs.append(SimpleNamespace(outputs=[SimpleNamespace(token_ids=ids)]))
        return outs
