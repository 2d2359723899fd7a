#!/usr/bin/env python3
"""What main's Megatron path needs from the GPU machine, checked in one device call before any GRPO run: TE's
sm_90-only core library and its freshly built torch extension run on the GPU (GEMM, fused attention), main's
Megatron worker and checkpoint modules import, and Megatron-Bridge turns the random Llama into a Megatron model that
runs a forward pass. Each step is timed and reported on its own, so one failure does not hide the next.

    python3 bench/nemo_rl/te_check.py [MODEL_DIR]      # under device.sh's env.sh; prints one JSON line per step
"""
import json
import os
import sys
import time
import traceback

MODEL = sys.argv[1] if len(sys.argv) > 1 else "/tmp/nemo/inputs/model"
STEPS = []


def step(fn):
    t0 = time.time()
    rec = {"step": fn.__name__}
    try:
        rec["result"] = fn()
        rec["ok"] = True
    except BaseException as exc:  # report and go on: the next step says something on its own
        rec["ok"] = False
        rec["error"] = f"{type(exc).__name__}: {exc}"[:600]
        rec["where"] = traceback.format_exc().splitlines()[-6:]
    rec["s"] = round(time.time() - t0, 2)
    STEPS.append(rec)
    print(json.dumps(rec, default=str), flush=True)
    return rec["ok"]


def versions():
    import importlib.metadata as md

    names = ["torch", "transformer-engine", "transformer_engine_torch", "megatron-core", "nvidia-resiliency-ext",
             "transformers", "ray", "nvidia-cublas", "nvidia-cudnn-cu13", "nvidia-nccl-cu13"]
    out = {}
    for n in names:
        try:
            out[n] = md.version(n)
        except Exception:
            out[n] = None
    import torch

    out["gpu"] = torch.cuda.get_device_name(0)
    return out


def te_linear():
    import torch
    import transformer_engine.pytorch as te

    lin = te.Linear(2048, 5632, params_dtype=torch.bfloat16).cuda()
    x = torch.randn(256, 2048, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = lin(x)
    y.float().pow(2).mean().backward()
    torch.cuda.synchronize()
    ref = x.detach() @ lin.weight.detach().t() + lin.bias.detach()
    return {"max_abs_diff_vs_torch": float((y.detach() - ref).abs().max()), "grad_finite": bool(x.grad.isfinite().all())}


def te_attention():
    import torch
    import transformer_engine.pytorch as te

    attn = te.DotProductAttention(16, 128, attn_mask_type="causal").cuda()
    q, k, v = (torch.randn(128, 2, 16, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = attn(q, k, v)
    torch.cuda.synchronize()
    return {"shape": list(out.shape), "finite": bool(out.isfinite().all())}


def main_imports():
    import importlib

    mods = ["megatron.core", "megatron.bridge", "megatron.bridge.models.conversion.auto_bridge",
            "megatron.bridge.training.checkpointing", "nemo_rl.models.policy.workers.megatron_policy_worker",
            "nemo_rl.models.megatron.setup", "nemo_rl.utils.checkpoint",
            "nvidia_resiliency_ext.checkpointing.async_ckpt.filesystem_async"]
    for m in mods:
        importlib.import_module(m)
    return mods


def bridge_model():
    import torch
    import torch.distributed as dist
    from megatron.bridge.models.conversion.auto_bridge import AutoBridge
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(0)
    bridge = AutoBridge.from_hf_pretrained(MODEL, torch_dtype=torch.bfloat16)
    provider = bridge.to_megatron_provider()
    provider.gradient_accumulation_fusion = False  # needs APEX's extension; main defaults it to False too
    provider.finalize()
    model = provider.provide_distributed_model(wrap_with_ddp=False)[0].cuda()
    tokens = torch.randint(0, provider.vocab_size, (1, 64), device="cuda")
    pos = torch.arange(64, device="cuda").unsqueeze(0)
    with torch.no_grad():
        out = model(tokens, pos, None)
    torch.cuda.synchronize()
    n = sum(p.numel() for p in model.parameters())
    dist.destroy_process_group()
    return {"params": n, "logits": list(out.shape), "finite": bool(out.isfinite().all())}


if __name__ == "__main__":
    for fn in (versions, te_linear, te_attention, main_imports, bridge_model):
        step(fn)
    print(json.dumps({"te_check_ok": all(r["ok"] for r in STEPS)}))
