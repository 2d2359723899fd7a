"""vLLM worker extension for the real-engine discard benchmark (bench/real_vllm/scenarios.py).

Runs inside vLLM's engine-core process, next to the model, the way NeMo-RL's
VllmInternalWorkerExtension does. `update_weights_from_path(step, mode)` is the refit: its name
starts with `update_weights` like NeMo-RL's, so colo-shim learns coverage from it. The weights are
the checkpoint's, with every matrix except the embeddings scaled by a factor that changes per
step: a refit that sent the loaded weights again would hide stale derived tensors.

mode "nemo": `model.load_weights(...)` then `process_weights_after_loading(...)`, as NeMo-RL
v0.5+ finishes `update_weights_via_ipc_zmq`. mode "reload": vLLM's own
`model_runner.reload_weights(weights_iterator=...)`, the refit path vLLM supports for online
quantization (it reprocesses each layer and copies the result into the original storage).

Also here: read-only probes (pinned host memory of this process, digests of the drafter).
"""

from __future__ import annotations

import glob
import hashlib
import os

import torch

FACTORS = (1.0, 1.2, 0.85, 1.1, 0.9, 1.25, 0.8, 1.15, 0.95, 1.3)


def factor(step: int) -> float:
    return FACTORS[step % len(FACTORS)]


def _scaled(name: str) -> bool:
    return name.endswith(".weight") and "embed" not in name and "norm" not in name and "lm_head" not in name


class RefitExtension:
    def _base_weights(self) -> dict:
        """The checkpoint, read straight onto the GPU on every refit: nothing stays in host memory
        (a trainer's weights arrive through CUDA IPC, they are not held by the engine process)."""
        path = self.model_config.model
        if not os.path.isdir(path):  # the engine double (CPU smoke run of this script)
            from vllm._double_core import hf_checkpoint

            return {k: v for k, v in hf_checkpoint(0).items() if not k.startswith("drafter.")}
        from safetensors.torch import load_file

        device = str(next(self.model_runner.model.parameters()).device)
        base = {}
        for f in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
            base.update(load_file(f, device=device))
        return base

    def update_weights_from_path(self, step: int, mode: str = "nemo") -> bool:
        f = factor(step)
        weights = [(n, (t * f).to(t.dtype) if _scaled(n) and t.dim() == 2 else t)
                   for n, t in self._base_weights().items()]
        runner = self.model_runner
        if mode == "reload":
            runner.reload_weights(weights_iterator=iter(weights))
            return True
        runner.model.load_weights(weights=weights)
        try:
            from vllm.config import set_current_vllm_config
            from vllm.model_executor.model_loader.utils import process_weights_after_loading
        except ImportError:  # the engine double: its model post-processes itself
            runner.model.process_weights_after_loading()
            return True
        device = next(runner.model.parameters()).device
        with set_current_vllm_config(runner.vllm_config):
            process_weights_after_loading(runner.model, self.model_config, device)
        return True


def host_pinned_rpc(worker) -> dict:
    """torch's caching host allocator in this (the engine's) process: held vs in use, bytes."""
    try:
        stats = torch.cuda.host_memory_stats()
    except Exception as exc:  # CPU smoke run
        return {"error": f"{type(exc).__name__}: {exc}"}
    held = int(stats.get("allocated_bytes.current", stats.get("reserved_bytes.current", 0)))
    active = int(stats.get("active_bytes.current", held))
    return {"held": held, "active": active, "pid": os.getpid(),
            "keys": sorted(k for k in stats if k.endswith(".current"))}


def _digest(tensors) -> str:
    h = hashlib.sha1()
    for name, t in tensors:
        h.update(name.encode())
        h.update(t.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def drafter_digest_rpc(worker) -> dict | None:
    """Digest of the speculative drafter's parameters and buffers (None when there is none)."""
    owner = getattr(worker.model_runner, "drafter", None)
    model = getattr(owner, "model", None) if owner is not None else None
    if model is None:
        return None
    params = sorted(model.named_parameters())
    buffers = sorted(model.named_buffers())
    return {"params": _digest(params), "buffers": _digest(buffers), "n_params": len(params),
            "n_buffers": len(buffers), "bytes": sum(t.numel() * t.element_size() for _, t in params + buffers)}


def derived_rpc(worker) -> dict:
    """Names and dtypes of the main model's tensors whose names look post-processed (fp8 scales)."""
    model = worker.model_runner.model
    names = [n for n, _ in model.named_parameters() if "scale" in n]
    dtypes = sorted({str(p.dtype) for p in model.parameters()})
    return {"scale_params": len(names), "example": names[:3], "dtypes": dtypes}
