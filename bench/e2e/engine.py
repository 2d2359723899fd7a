"""The engine actor's vLLM work and probes (called by the site's VllmGenerationWorkerImpl and its extension).

GPU: real vLLM (0.26.0 / 0.25.1): `LLM(load_format="dummy", enable_sleep_mode=True,
enforce_eager=True, skip_tokenizer_init=True, kv_cache_memory_bytes=..., worker_extension_cls=
NeMo-RL's extension)`, engine core in this process. CPU smoke (E2E_FAKE_ENGINE=1): FakeLLM, an
engine for the generation side only: it receives the same ZMQ refit (as bytes), holds the HF
weights, and "generates" ids derived from them; there is no vLLM and no colo-shim engine side.

Probes measure, at the moments the harness needs: free device memory before each wake-up and
what it asks for, wake-up failures (CUDA out of memory) and, after each sleep, the pinned host
memory of this process (torch's caching host allocator: the level-1 backup) and the level colo-shim
really used.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from types import SimpleNamespace

import torch

GIB = float(1 << 30)


def fake() -> bool:
    return os.environ.get("E2E_FAKE_ENGINE") == "1"


def empty_cache():
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def build_llm(cfg: dict):
    if fake():
        return FakeLLM(cfg)
    import vllm

    kw = dict(model=cfg["model_dir"], load_format="dummy", enable_sleep_mode=True, enforce_eager=True, seed=0,
              dtype="bfloat16", max_model_len=cfg["max_model_len"], max_num_seqs=cfg["max_num_seqs"],
              skip_tokenizer_init=True, gpu_memory_utilization=cfg.get("gpu_memory_utilization", 0.95),
              worker_extension_cls="nemo_rl.models.generation.vllm.vllm_backend.VllmInternalWorkerExtension")
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


# ---------------------------------------------------------------------------- refit (engine side)

def receive_weights(ext, address: str) -> bool:
    """NeMo-RL's update_weights_via_ipc_zmq: REP socket, per buffer rebuild/slice/load_weights/ACK."""
    import zmq

    sock = getattr(ext, "_e2e_sock", None)
    if sock is None:
        sock = ext._e2e_sock = zmq.Context.instance().socket(zmq.REP)
        sock.connect(address)
    model = ext.model_runner.model
    device = next(model.parameters()).device
    while True:
        msg = sock.recv_pyobj()
        if msg == "COMPLETE":
            break
        (kind, payload), metas, used = msg
        if kind == "cuda":
            from torch.multiprocessing.reductions import rebuild_cuda_tensor

            args = list(payload)
            args[6] = device.index if device.index is not None else torch.cuda.current_device()
            buf = rebuild_cuda_tensor(*args)
        else:
            buf = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        weights = []
        for name, offset, shape, dtype in metas:
            dt = getattr(torch, dtype)
            n = dt.itemsize
            for s in shape:
                n *= s
            weights.append((name, buf[offset:offset + n].view(dt).view(shape)))
        model.load_weights(weights=weights)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        del weights, buf
        sock.send_pyobj("ACK")
    _post_process(ext)
    empty_cache()
    if torch.cuda.is_available():
        torch.cuda.ipc_collect()
    sock.send_pyobj("DONE")
    return True


def _post_process(ext) -> None:
    model = ext.model_runner.model
    try:
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.utils import process_weights_after_loading
    except ImportError:  # FakeLLM
        return
    device = next(model.parameters()).device
    with set_current_vllm_config(ext.model_runner.vllm_config):
        process_weights_after_loading(model, ext.model_config, device)


_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def weights_digest(model, info: dict) -> dict:
    """Per-HF-name [sum, sum of squares] (float64) of the weights the engine holds, slicing vLLM's
    fused qkv_proj / gate_up_proj by the shapes the trainer announced in prepare_refit_info;
    engine parameters the refit does not name are listed (a refit must cover every one)."""
    out, uncovered = {}, []
    for name, p in model.named_parameters():
        t = p.detach()
        if name in info:
            rows = info[name][0][0]
            out[name] = _digest(t[:rows])  # vLLM pads vocab rows; the refit writes the real ones
            continue
        key = next((k for k in _FUSED if f".{k}." in name), None)
        if key is None:
            uncovered.append(name)
            continue
        offset = 0
        for part in _FUSED[key]:
            hf = name.replace(key, part)
            if hf not in info:
                uncovered.append(name)
                break
            rows = info[hf][0][0]
            out[hf] = _digest(t[offset:offset + rows])
            offset += rows
    return {"digests": out, "uncovered": uncovered}


def _digest(t: torch.Tensor) -> list:
    t = t.reshape(-1)
    return [t.sum(dtype=torch.float64).item(), (t.double() ** 2).sum().item()]


# ---------------------------------------------------------------------------- probes

def pinned_bytes() -> int:
    """Pinned host memory torch's caching host allocator holds in this process (a level-1 backup)."""
    try:
        stats = torch.cuda.host_memory_stats()
        return int(stats.get("allocated_bytes.current", stats.get("reserved_bytes.current", 0)))
    except Exception:
        return 0


class EngineProbe:
    def __init__(self, worker):
        self.worker, self.awake, self.last_wake, self.sleeps = worker, True, None, []

    @contextlib.contextmanager
    def wake(self, tags):
        control = bool(tags) and all(str(t).startswith("colo_shim:") for t in tags)
        free = torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else 0
        t0 = time.perf_counter()
        rec = {"tags": tags, "free_before": free, "ok": True}
        try:
            yield
        except BaseException as exc:
            rec.update(ok=False, error=f"{type(exc).__name__}: {str(exc)[:400]}")
            if not control:
                self.awake = False
            raise
        finally:
            rec["s"] = round(time.perf_counter() - t0, 3)
            if not control:
                rec["requested"] = self._requested(tags)
                self.last_wake = rec
                if rec["ok"] and (tags is None or "kv_cache" in tags):
                    self.awake = True

    def _requested(self, tags) -> int:
        cfg = self.worker.cfg
        kv = int(cfg.get("kv_cache_memory_bytes") or 0)
        weights = int(cfg.get("weights_bytes") or 0)
        if tags is None:
            return kv + weights
        return (kv if "kv_cache" in tags else 0) + (weights if "weights" in tags else 0)

    def check_awake(self):
        if not self.awake:
            raise RuntimeError(f"engine not awake: the last wake_up failed ({self.last_wake})")

    def after_sleep(self):
        self.awake = False
        level = 1
        try:
            from colo_shim.discard import guard

            hist = guard.state_for(self.worker.llm).history
            if hist:
                level = hist[-1]["level"]
        except Exception:
            pass
        self.sleeps.append({"level": level, "pinned": pinned_bytes()})

    def last_sleep(self):
        return self.sleeps[-1] if self.sleeps else None

    def version(self):
        if fake():
            return "fake (CPU smoke)"
        import vllm

        return vllm.__version__

    def wake_record(self):
        return self.last_wake

    def digest(self):
        return self.worker.llm.collective_rpc("e2e_weights_digest")[0]

    def memory(self):
        out = {"pinned": pinned_bytes()}
        if torch.cuda.is_available():
            free, total = torch.cuda.mem_get_info()
            out.update(free=free, total=total)
        return out

    def shim_report(self):
        try:
            from colo_shim.discard import guard

            return guard.state_for(self.worker.llm).report()
        except Exception as exc:
            return {"unavailable": f"{type(exc).__name__}: {exc}"}


# ---------------------------------------------------------------------------- the CPU smoke's engine

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

    def __init__(self, cfg):
        from nemo_rl.models.generation.vllm.vllm_backend import VllmInternalWorkerExtension

        worker = type("FakeWorker", (VllmInternalWorkerExtension,), {})()
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
