"""Engine core shared by the LLM and AsyncLLM doubles (no upstream file of this name).

vLLM's sleep mode needs CUDA (CuMemAllocator), so it cannot run on the CPU machines the tests
use; this double reproduces its memory semantics on a real small torch model instead, per the
vLLM version read from the installed distribution metadata (tests put a `vllm-<ver>.dist-info`
on the path):

- level 1: every tensor allocated while loading (parameters, buffers, tensors created in
  `process_weights_after_loading`) is copied to CPU and restored on `wake_up(["weights"])`.
- level >= 2: nothing is copied, the GPU memory is gone (here: overwritten with NaN); since 0.8.5
  named buffers are saved to CPU and restored with the weights; since 0.31 parameters matching
  `model_config.sleep_preserve_parameter_names` globs are saved too. A weight update restores
  only what it writes, like `model.load_weights`.

The model has parameters the refit never sends (a layer-scale vector `ls1`, a speculative
drafter) and a derived parameter created after loading (`qkv_scale`), the three cases
upstream broke on (NeMo-RL #2658, vLLM #52479, #25800). A model named `tiny-plain-<seed>` has no
derived parameter, and its trainer exports `ls1`: the refit then covers every parameter.

As in vLLM (v1/worker/gpu_model_runner.py), the drafter is `model_runner.drafter.model`, a module
of its own outside `model_runner.model`, loaded once from the checkpoint; it lives in the same
sleep-mode pool, so level 2 destroys it, and vLLM's level-2 buffer saving (gpu_worker.sleep)
covers `model_runner.model.named_buffers()` only, not the drafter's buffers.

Level-1 backups are pinned host memory from torch's caching host allocator (vllm/_double_host.py:
freed blocks stay cached until `torch._C._host_emptyCache()`).
"""

from __future__ import annotations

import fnmatch
import importlib
import math
from importlib import metadata

import torch
from torch import nn

from vllm._double_host import HOST_CACHE

VOCAB, HIDDEN, LAYERS = 64, 32, 2
torch.set_num_threads(1)  # tiny tensors: thread hand-off costs more than the math on 2-core CI


def engine_version() -> tuple[int, ...]:
    try:
        raw = metadata.version("vllm")
    except metadata.PackageNotFoundError:
        raw = "0.20.0"
    return tuple(int(p) for p in raw.split(".")[:3] if p.isdigit())


def hf_checkpoint(seed: int = 0) -> dict[str, torch.Tensor]:
    """HF-format weights of the tiny model, including what a trainer would not export."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=0.3):
        return (torch.randn(*shape, generator=g) * scale).float()

    sd = {"model.embed_tokens.weight": rnd(VOCAB, HIDDEN, scale=1.0)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            sd[p + f"self_attn.{name}.weight"] = rnd(HIDDEN, HIDDEN)
        sd[p + "input_layernorm.weight"] = 1.0 + rnd(HIDDEN, scale=0.05)
        sd[p + "ls1"] = 1.0 + rnd(HIDDEN, scale=0.1)  # vision-tower style scale, never exported
    sd["model.norm.weight"] = 1.0 + rnd(HIDDEN, scale=0.05)
    sd["lm_head.weight"] = rnd(VOCAB, HIDDEN)
    sd["drafter.weight"] = rnd(VOCAB, HIDDEN)  # speculative drafter head, never refit
    return sd


class _Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv_proj = nn.Linear(HIDDEN, 3 * HIDDEN, bias=False)
        self.o_proj = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.input_layernorm = nn.Parameter(torch.ones(HIDDEN))
        self.ls1 = nn.Parameter(torch.ones(HIDDEN))

    def forward(self, h, inv_freq):
        x = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.input_layernorm
        q, k, v = self.qkv_proj(x).chunk(3, dim=-1)
        q = q * torch.cos(inv_freq)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(HIDDEN), dim=-1)
        mask = torch.ones(att.shape[-2:], dtype=torch.bool).triu(1)
        att = att.masked_fill(mask, 0.0)
        scale = self.qkv_scale.mean() if hasattr(self, "qkv_scale") else 1.0
        out = self.o_proj(att @ v) * scale
        return h + out * self.ls1


class _Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList(_Layer() for _ in range(LAYERS))
        self.norm = nn.Parameter(torch.ones(HIDDEN))
        self.register_buffer("inv_freq", torch.linspace(0.1, 1.0, HIDDEN), persistent=False)


class TinyForCausalLM(nn.Module):
    """vLLM-style model: stacked qkv_proj, load_weights returning the names it wrote."""

    def __init__(self, derived: bool = True):
        super().__init__()
        self.derived = derived
        self.model = _Inner()
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def _target(self, name: str):
        """Map an HF checkpoint name to (vLLM parameter name, shard slice or None)."""
        if name.startswith("model.layers."):
            i, rest = name[len("model.layers."):].split(".", 1)
            base = f"model.layers.{i}."
            if rest.startswith("self_attn.") and rest.split(".")[1] in ("q_proj", "k_proj", "v_proj"):
                shard = ("q_proj", "k_proj", "v_proj").index(rest.split(".")[1])
                return base + "qkv_proj.weight", slice(shard * HIDDEN, (shard + 1) * HIDDEN)
            if rest == "self_attn.o_proj.weight":
                return base + "o_proj.weight", None
            if rest == "input_layernorm.weight":
                return base + "input_layernorm", None
            return base + rest, None
        if name == "model.norm.weight":
            return "model.norm", None
        if name.startswith("drafter."):  # the drafter's own checkpoint, not this model's
            return None, None
        return name, None

    @torch.no_grad()
    def load_weights(self, weights) -> set[str]:
        params = dict(self.named_parameters())
        loaded = set()
        for name, tensor in weights:
            target, shard = self._target(name)
            if target is None:
                continue
            param = params[target]
            (param.data[shard] if shard is not None else param.data).copy_(tensor)
            loaded.add(target)
        return loaded

    @torch.no_grad()
    def process_weights_after_loading(self):
        if not self.derived:
            return
        for layer in self.model.layers:
            layer.qkv_scale = nn.Parameter(layer.qkv_proj.weight.abs().amax(dim=1).clone())

    @torch.no_grad()
    def next_logits(self, ids: torch.Tensor, drafter=None) -> torch.Tensor:
        h = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            h = layer(h, self.model.inv_freq)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.model.norm
        logits = self.lm_head(h[-1])
        if drafter is not None:  # greedy verification keeps the target's argmax, but NaN drafts poison it
            logits = logits + drafter(h[-1])
        return logits


class _DraftModel(nn.Module):
    """vLLM's draft-model drafter: its own weights and its own (non-persistent) buffer."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)
        self.register_buffer("logit_scale", torch.full((VOCAB,), 1e-3), persistent=False)

    def forward(self, h):
        return self.head(h) * self.logit_scale


class _Drafter:
    """vllm.v1.spec_decode.draft_model.DraftModelProposer: the module is `.model`."""

    def __init__(self):
        self.model = _DraftModel()


class _ModelConfig:
    def __init__(self, model: str):
        self.model = model
        self.sleep_preserve_parameter_names: list[str] | None = None


class _ModelRunner:
    def __init__(self, model, drafter=None):
        self.model = model
        self.vllm_config = None
        if drafter is not None:
            self.drafter = drafter


class GPUWorker:
    """Stands in for vllm.v1.worker.gpu_worker.Worker: owns the model; extension methods mix in."""

    def __init__(self, model_name: str, speculative: bool, seed: int):
        torch.manual_seed(seed)
        model = TinyForCausalLM(derived="plain" not in model_name)
        checkpoint = hf_checkpoint(int(model_name.rsplit("-", 1)[-1]) if model_name[-1].isdigit() else 0)
        model.load_weights(checkpoint.items())
        model.process_weights_after_loading()
        drafter = None
        if speculative:
            drafter = _Drafter()
            with torch.no_grad():
                drafter.model.head.weight.copy_(checkpoint["drafter.weight"])
        self.model_runner = _ModelRunner(model, drafter)
        self.model_config = _ModelConfig(model_name)
        self.device = torch.device("cpu")
        self.rank = 0


def _tensors(model) -> dict[str, torch.Tensor]:
    out = dict(model.named_parameters())
    out.update(model.named_buffers())
    return out


def _pool(runner) -> dict[str, torch.Tensor]:
    """Everything allocated while loading (vLLM's "weights" pool): the model and the drafter."""
    out = _tensors(runner.model)
    drafter = getattr(runner, "drafter", None)
    if drafter is not None:
        out.update({f"drafter.model.{n}": t for n, t in _tensors(drafter.model).items()})
    return out


class EngineCore:
    """Sleep/wake/generate/collective_rpc with vLLM's memory semantics (see module docstring)."""

    def __init__(self, model: str, worker_extension_cls: str | None, speculative: bool, seed: int):
        cls = GPUWorker
        if worker_extension_cls:
            mod, _, name = worker_extension_cls.rpartition(".")
            cls = type("WorkerWithExtension", (GPUWorker, getattr(importlib.import_module(mod), name)), {})
        self.worker = cls(model, speculative, seed)
        self.version = engine_version()
        self.sleeping_tags: set[str] = set()
        self.cpu_backup: dict[str, torch.Tensor] = {}
        self.pinned_blocks: list[torch.Tensor] = []
        self.kv_cache: torch.Tensor | None = torch.zeros(4, HIDDEN)
        self.events: list[dict] = []
        self.nan_generations = 0

    def cpu_bytes_held(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.cpu_backup.values())

    @torch.no_grad()
    def sleep(self, level: int = 1) -> None:
        if self.sleeping_tags:
            return
        runner = self.worker.model_runner
        model = runner.model
        tensors = _pool(runner)
        if level == 1:  # CuMemAllocator.sleep: a pinned torch.empty per allocation of the pool
            self.cpu_backup = {}
            for n, t in tensors.items():
                nbytes = t.numel() * t.element_size()
                block = HOST_CACHE.alloc(nbytes)
                self.pinned_blocks.append(block)
                self.cpu_backup[n] = block[:nbytes].view(t.dtype).view(t.shape)
                self.cpu_backup[n].copy_(t.detach())
        else:
            keep = {n: t for n, t in model.named_buffers()} if self.version >= (0, 8, 5) else {}
            globs = self.worker.model_config.sleep_preserve_parameter_names or []
            if self.version >= (0, 31) and globs:
                keep.update({n: p for n, p in model.named_parameters()
                             if any(fnmatch.fnmatchcase(n, g) for g in globs)})
            self.cpu_backup = {n: t.detach().to("cpu", copy=True) for n, t in keep.items()}
        for t in tensors.values():  # the GPU pages are unmapped: their content is gone
            t.data.fill_(float("nan"))
        self.kv_cache = None
        self.sleeping_tags = {"weights", "kv_cache"}
        self.events.append({"event": "sleep", "level": level, "cpu_bytes": self.cpu_bytes_held(),
                            "pinned_held": HOST_CACHE.held})

    @torch.no_grad()
    def wake_up(self, tags: list[str] | None = None) -> None:
        tags = ["weights", "kv_cache"] if tags is None else list(tags)
        if not self.sleeping_tags:
            return  # vLLM: "Executor is not sleeping", nothing to do
        if "weights" in tags and "weights" in self.sleeping_tags:
            tensors = _pool(self.worker.model_runner)
            for name, saved in self.cpu_backup.items():
                tensors[name].data.copy_(saved)
            self.cpu_backup = {}
            for block in self.pinned_blocks:  # the backup tensors die: their blocks stay cached
                HOST_CACHE.release(block)
            self.pinned_blocks = []
            self.sleeping_tags.discard("weights")
        if "kv_cache" in tags and "kv_cache" in self.sleeping_tags:
            self.kv_cache = torch.zeros(4, HIDDEN)
            self.sleeping_tags.discard("kv_cache")
        self.events.append({"event": "wake_up", "tags": tags})

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        fn = method if callable(method) else getattr(self.worker, method)
        if callable(method):
            return [fn(self.worker, *args, **(kwargs or {}))]
        return [fn(*args, **(kwargs or {}))]

    @torch.no_grad()
    def generate_one(self, prompt_ids: list[int], max_tokens: int, seed: int | None, greedy: bool) -> list[int]:
        if self.sleeping_tags:
            raise RuntimeError(f"vLLM double: generate while asleep ({sorted(self.sleeping_tags)})")
        runner = self.worker.model_runner
        model = runner.model
        drafter = getattr(runner, "drafter", None)
        if any(torch.isnan(t).any() for t in _pool(runner).values()):
            self.nan_generations += 1
        ids = torch.tensor(prompt_ids, dtype=torch.long)
        g = torch.Generator().manual_seed(seed if seed is not None else 0)
        out = []
        for _ in range(max_tokens):
            logits = model.next_logits(ids, drafter.model if drafter is not None else None)
            if greedy:
                tok = int(torch.argmax(torch.nan_to_num(logits, nan=0.0)))
            else:
                probs = torch.softmax(torch.nan_to_num(logits, nan=0.0), -1)
                tok = int(torch.multinomial(probs, 1, generator=g))
            out.append(tok)
            ids = torch.cat([ids, torch.tensor([tok])])
        return out

