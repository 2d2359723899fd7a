"""The engine actor's vLLM work (called by the site's VllmGenerationWorkerImpl).

GPU: real vLLM (0.26.0 / 0.25.1): `LLM(load_format="dummy", enable_sleep_mode=True,
enforce_eager=True, skip_tokenizer_init=True, kv_cache_memory_bytes=..., worker_extension_cls=
NeMo-RL's extension)`, engine core in this process; with ranks > 1 `tensor_parallel_size=ranks` over the
trainer's GPUs (worker processes of vLLM's mp executor, worker i on GPU i). CPU smoke (E2E_FAKE_ENGINE=1): fake_engine.py's
FakeLLM behind the same calls, with no vLLM and no colo-shim engine side. The extension's refit is
refit.py; what the harness measures in this actor, probes.py. The extension is named by its dotted
path only (vLLM imports it; so does FakeLLM), so this module and the extension never import each other.
"""

from __future__ import annotations

import os

import torch

EXTENSION = "nemo_rl.models.generation.vllm.vllm_backend.VllmInternalWorkerExtension"


def fake() -> bool:
    return os.environ.get("E2E_FAKE_ENGINE") == "1"


def empty_cache():
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def build_llm(cfg: dict):
    if fake():
        from bench.e2e.fake_engine import FakeLLM

        return FakeLLM(cfg, worker_extension_cls=EXTENSION)
    import vllm

    kw = dict(model=cfg["model_dir"], load_format="dummy", enable_sleep_mode=True, enforce_eager=True, seed=0,
              dtype="bfloat16", max_model_len=cfg["max_model_len"], max_num_seqs=cfg["max_num_seqs"],
              skip_tokenizer_init=True, gpu_memory_utilization=cfg.get("gpu_memory_utilization", 0.95),
              worker_extension_cls=EXTENSION)
    if int(cfg.get("ranks", 1)) > 1:  # one worker per trainer GPU, refitted from the rank on its GPU
        kw.update(tensor_parallel_size=int(cfg["ranks"]), distributed_executor_backend="mp")
    if cfg.get("kv_cache_memory_bytes"):
        kw["kv_cache_memory_bytes"] = int(cfg["kv_cache_memory_bytes"])
    return vllm.LLM(**kw)


def _sampling(greedy: bool, seed: int, max_tokens: int):
    if fake():
        return {"greedy": greedy, "seed": seed, "max_tokens": max_tokens}
    import vllm

    return vllm.SamplingParams(temperature=0.0 if greedy else 1.0, seed=None if greedy else seed,
                               max_tokens=max_tokens, min_tokens=max_tokens, ignore_eos=True, detokenize=False)


def generate(llm, data: dict, greedy: bool, cfg: dict) -> dict:
    prompts = [{"prompt_token_ids": list(p)} for p in data["prompt_ids"]]
    params = [_sampling(greedy, data["seed"] + i, data["max_new_tokens"]) for i in range(len(prompts))]
    outs = llm.generate(prompts, params, use_tqdm=False)
    return {"output_ids": [list(o.outputs[0].token_ids) for o in outs]}
