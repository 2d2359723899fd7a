"""The CPU smoke's engine (E2E_FAKE_ENGINE=1): the generation side only, without vLLM.

It loads NeMo-RL's worker extension by its dotted name, as vLLM does with `worker_extension_cls`,
so the smoke receives the real ZMQ refit through the real extension code (and the extension,
which imports refit.py, never has to import the engine back). It holds the HF weights it was sent
and "generates" ids derived from them, so a refit that changed nothing would show in the ids.
Sleep and wake only flip a flag: no device memory, no colo-shim engine side.

With `ranks` > 1 it has one worker per trainer rank, as vLLM with tensor parallelism has one per
GPU: `collective_rpc` reaches each (refit from its own trainer rank, digests, pinned memory), and a
sleep at the level colo-shim asked for (its control tags on wake_up) drops every worker's weights at
level 2, so a discard that no refit follows would show in that worker's digests and in generate.
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
        self.workers = []
        for rank in range(int(cfg.get("ranks", 1))):
            worker = type("FakeWorker", (extension,), {})()
            worker.model_runner, worker.rank = SimpleNamespace(model=_FakeModel()), rank
            self.workers.append(worker)
        self.worker, self.cfg, self.asleep, self.pending_level = self.workers[0], cfg, False, 1

    def collective_rpc(self, method, args=(), kwargs=None):
        return [getattr(worker, method)(*args, **(kwargs or {})) for worker in self.workers]

    def sleep(self, level=1):
        self.asleep = True
        if len(self.workers) > 1 and max(level, self.pending_level) >= 2:
            for worker in self.workers:  # level 2: the weights are gone until the next refit
                worker.model_runner.model.params.clear()
        self.pending_level = 1

    def wake_up(self, tags=None):
        if tags and all(str(t).startswith("colo_shim:") for t in tags):
            levels = [int(t.split("=", 1)[1]) for t in tags if str(t).startswith("colo_shim:sleep_level=")]
            self.pending_level = 1 if "colo_shim:cancel" in tags else (levels or [self.pending_level])[-1]
            return
        self.asleep = False

    def reset_prefix_cache(self):
        return True

    def generate(self, prompts, params, use_tqdm=False):
        if len(self.workers) > 1 and any(not w.model_runner.model.params for w in self.workers):
            raise RuntimeError("fake engine: a worker generates on discarded weights (no refit since its level-2 sleep)")
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
