"""The trainer actor's megatron-core and NVRx work (called by the site's MegatronPolicyWorkerImpl).

GPU: NCCL, one rank per GPU, GPTModel in Llama shape (bench/e2e/convert.py's config: RMSNorm,
SwiGLU, RoPE, GQA, untied output), bf16, megatron DDP (grad_reduce_in_fp32) + megatron's distributed
Adam, sharded over the data-parallel ranks (dist.py); the optimizer moves with megatron's own
`offload_to_cpu()` / `restore_from_cpu()`.
CPU (the CI smoke): gloo; megatron's optimizers allocate on "cuda" unconditionally and DDP's grad
sync asks for CUDA streams, so there the model is in megatron DDP without the distributed optimizer,
a torch Adam steps the params from DDP's main_grad (averaged over the ranks with gloo), and the
NVRx queue is its CPU shared-memory worker. Everything else (model, checkpoint content, NVRx path,
refit packing) is the same code. The refit's trainer end is refit.py (beside the engine end it must
match); what the harness measures in this actor, probes.py; the checkpoint fingerprints,
bench/ckpt_compare.py.
"""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import torch

from bench.e2e.dist import average_grads, init as init_world, rank, share, timeout_s, world


def cuda() -> bool:
    return torch.cuda.is_available()


def empty_cache():
    if cuda():
        torch.cuda.empty_cache()


def free_bytes() -> int:
    return torch.cuda.mem_get_info()[0] if cuda() else 8 << 30


def build(config: dict) -> SimpleNamespace:
    init_world(cuda())
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.tensor_parallel import random as mrandom
    from megatron.core.transformer.transformer_config import TransformerConfig

    from bench.e2e import convert

    parallel_state.initialize_model_parallel(1, 1, distributed_timeout_minutes=timeout_s(cuda()) / 60)
    m = config["model"]
    gpu = cuda()
    if gpu:
        tensor_parallel.model_parallel_cuda_manual_seed(1234)
    else:
        mrandom.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
    torch.manual_seed(1234)
    alloc0 = torch.cuda.memory_allocated() if gpu else 0
    dtype = torch.bfloat16 if gpu else torch.float32
    extra = dict(bf16=gpu, params_dtype=dtype, use_cpu_initialization=not gpu, masked_softmax_fusion=False,
                 bias_activation_fusion=False, bias_dropout_fusion=False, apply_rope_fusion=False,
                 gradient_accumulation_fusion=False, persist_layer_norm=False)
    if gpu:
        extra["pipeline_dtype"] = dtype
    cfg = TransformerConfig(**convert.megatron_llama_config(**m["sizes"], **extra))
    model = GPTModel(config=cfg, **convert.gpt_model_kwargs(m["vocab"], m["max_seq"]))
    if gpu:
        # torch's RMSNorm (local spec without apex/TE) is built in fp32: with the distributed
        # optimizer such params would be views of the DDP buffer (see bench/fence_megatron_job.py)
        model = model.cuda().to(torch.bfloat16)
    ddp = DistributedDataParallel(cfg, DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                                                     use_distributed_optimizer=gpu), module=model)
    if gpu:
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=config["lr"], bf16=True, params_dtype=dtype,
                                                     use_distributed_optimizer=True), [ddp])
    else:
        opt = torch.optim.Adam(model.parameters(), lr=config["lr"])
    hf = convert.hf_config(model, m["vocab"], m["max_seq"])
    st = SimpleNamespace(cfg=config, model=model, ddp=ddp, opt=opt, gpu=gpu, hf_config=hf, alloc0=alloc0,
                         buffers=list(ddp.buffers) + list(getattr(ddp, "expert_parallel_buffers", [])),
                         sock=None, strategy=None, offloaded=False, stats={})
    st.params = sum(p.numel() for p in model.parameters())
    return st


def refit_info(st) -> dict:
    from bench.e2e import convert

    return {name: (tuple(t.shape), str(t.dtype)) for name, t in convert.iter_hf_weights(st.model)}


# ---------------------------------------------------------------------------- storage moves

def move_buffers(st, device: str, move_params: bool, move_grads: bool) -> None:
    for buf in st.buffers:
        if device == "cpu":
            buf.offload_to_cpu(move_params=move_params, move_grads=move_grads)
        else:
            buf.reload_from_cpu(move_params=move_params, move_grads=move_grads)


def move_optimizer(st, device: str) -> None:
    if not st.gpu:
        return  # the CPU smoke's Adam state has nowhere to go
    if device == "cpu":
        st.opt.offload_to_cpu()
    else:
        st.opt.restore_from_cpu()
        torch.cuda.synchronize()


# ---------------------------------------------------------------------------- logprobs and training

def _batch(st, data: dict):
    ids = [list(p) + list(o) for p, o in zip(data["prompt_ids"], data["output_ids"])]
    seq = max(len(x) for x in ids)
    if any(len(x) != seq for x in ids):
        raise ValueError("the harness generates fixed-length responses (ignore_eos)")
    device = "cuda" if st.gpu else "cpu"
    tokens = torch.tensor(ids, dtype=torch.long, device=device)
    prompt = len(data["prompt_ids"][0])
    return tokens, prompt


def _token_logprobs(st, tokens: torch.Tensor, prompt: int) -> torch.Tensor:
    seq = tokens.shape[1]
    pos = torch.arange(seq, device=tokens.device).unsqueeze(0).expand(tokens.shape[0], -1)
    causal = torch.triu(torch.ones(seq, seq, dtype=torch.bool, device=tokens.device), diagonal=1)[None, None]
    logits = st.ddp(tokens, pos, causal).float()
    logp = torch.log_softmax(logits[:, prompt - 1:-1], dim=-1)
    return logp.gather(-1, tokens[:, prompt:].unsqueeze(-1)).squeeze(-1)


def logprobs(st, data: dict) -> dict:
    """This rank's share of the rows (dist.share); the driver concatenates the ranks' lists."""
    tokens, prompt = _batch(st, data)
    tokens = tokens[share(tokens.shape[0])]
    mb = st.cfg["micro_batch"]
    out = []
    with torch.no_grad():
        for i in range(0, tokens.shape[0], mb):
            out.append(_token_logprobs(st, tokens[i:i + mb], prompt).cpu())
    return {"logprobs": torch.cat(out).tolist()}


def train_step(st, data: dict) -> dict:
    """One policy-gradient step (GRPO advantages: reward minus its group's mean), clipped ratio."""
    tokens, prompt = _batch(st, data)
    rewards = torch.tensor(data["total_reward"], dtype=torch.float32)
    groups = torch.tensor(data["group"])
    adv = rewards.clone()
    for g in groups.unique():
        sel = groups == g
        adv[sel] = rewards[sel] - rewards[sel].mean()
    device = tokens.device
    rows = share(tokens.shape[0])  # this rank's rows; their mean loss, averaged over ranks by the grad sync
    tokens, adv = tokens[rows], adv.to(device)[rows]
    old = torch.tensor(data["prev_logprobs"], dtype=torch.float32, device=device)[rows]
    st.ddp.zero_grad_buffer()
    st.opt.zero_grad()
    mb, n, loss_sum = st.cfg["micro_batch"], tokens.shape[0], 0.0
    for i in range(0, n, mb):
        logp = _token_logprobs(st, tokens[i:i + mb], prompt)
        ratio = torch.exp(logp - old[i:i + mb]).clamp(0.8, 1.2)
        loss = -(ratio * adv[i:i + mb, None]).mean() * (logp.shape[0] / n)
        loss.backward()
        loss_sum += float(loss.detach())
    if st.gpu:
        st.ddp.finish_grad_sync()
        st.opt.step()
        torch.cuda.synchronize()
    else:  # no CUDA streams for DDP's grad sync; one rank: main_grad is the gradient
        if world() > 1:
            average_grads(st.buffers)
        for p in st.model.parameters():
            p.grad = p.main_grad.to(p.dtype)
        st.opt.step()
    return {"loss": loss_sum}


# ---------------------------------------------------------------------------- checkpoints

def make_queue(st):
    from nvidia_resiliency_ext.checkpointing.async_ckpt.core import AsyncCallsQueue

    return AsyncCallsQueue(persistent=True) if st.gpu else AsyncCallsQueue(persistent=True, cpu_shm_mode=True)


def _optimizer_state(st) -> dict:
    """The optimizer's own storage (fp32 main params, Adam moments) as ShardedTensors referencing
    the live tensors (megatron's dp_reshardable helper asserts with torch's Adam, the fallback
    without TE/apex). On the CPU smoke: torch Adam's moments. The distributed optimizer holds a
    different shard on each rank: one key per rank (`optimizer.rankN.`); a replicated state (CPU,
    or one rank) keeps one key, written by rank 0, that every rank's fingerprints must match."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    sharded = st.gpu and world() > 1
    prefix, replica = (f"optimizer.rank{rank()}", 0) if sharded else ("optimizer", rank())
    found = {}
    inners = [o.optimizer for o in getattr(st.opt, "chained_optimizers", [st.opt])] if st.gpu else [st.opt]
    for ci, inner in enumerate(inners):
        for gi, group in enumerate(inner.param_groups):
            for pi, p in enumerate(group["params"]):
                base = f"{prefix}.c{ci}.g{gi}.p{pi}"
                if st.gpu:
                    found[base + ".main"] = ShardedTensor.from_rank_offsets(base + ".main", p.data, replica_id=replica)
                for k, v in inner.state.get(p, {}).items():
                    if torch.is_tensor(v) and v.numel() == p.numel():
                        found[f"{base}.{k}"] = ShardedTensor.from_rank_offsets(f"{base}.{k}", v, replica_id=replica)
    return found


def save(st, path: str, queue) -> dict:
    """dist_checkpointing.save of model + optimizer; async through NVRx (cached structure) when a
    queue is given, else synchronous (the sync-save workaround). The fingerprints of the live state
    at this moment are what the checkpoint must hold."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.strategies.torch import TorchDistSaveShardedStrategy

    from bench.ckpt_compare import fingerprints

    os.makedirs(path, exist_ok=True)
    sd = {"model": st.model.sharded_state_dict(), "optimizer": _optimizer_state(st)}
    t0 = time.perf_counter()
    want = fingerprints(sd)
    fp_s = time.perf_counter() - t0
    if st.strategy is None:
        # E2E_SAVE_THREADS (spec option threads=N): NVRx's writer threads; megatron's default is one.
        threads = int(os.environ.get("E2E_SAVE_THREADS", "1"))
        st.strategy = TorchDistSaveShardedStrategy("torch_dist", 1, cached_metadata=True, thread_count=threads)
    t1 = time.perf_counter()
    if queue is None:
        dist_checkpointing.save(sd, path, sharded_strategy=st.strategy)
    else:
        req = dist_checkpointing.save(sd, path, sharded_strategy=st.strategy, async_sharded_save=True,
                                      async_strategy="nvrx")
        queue.schedule_async_request(req)
    return {"path": path, "fingerprints": want, "schedule_s": round(time.perf_counter() - t1, 3),
            "fingerprint_s": round(fp_s, 3), "async": queue is not None, "threads": st.strategy.thread_count}
