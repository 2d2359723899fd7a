"""Child: real megatron-core on the CPU through every offload entry point, without and with colo-shim.

Run by test_offload_megatron.py (and tests/compat/test_compat_megatron_core.py against a source
tree): a GPTModel in megatron DDP with the distributed optimizer (bf16, fp32 main params and Adam
state), gloo, one rank, two train steps; then rounds of offload -> check -> reload -> check ->
train step through megatron-core's MegatronOptimizer and ChainedOptimizer, NeMo-RL's
move_optimizer (the v0.7 worker double around the same optimizer) and the DDP buffers' first
offload, in fake_cuda.FakeCuda so that they really move (see there). Phase `plain` runs without
colo-shim, `shim` with families offload + megatron and a page-locking recorder in place of the
CUDA runtime; both start from the same seed, so their values must end bit-identical. Then
offload_checks.py probes changed tensors and fallbacks on the shim's model. Prints one JSON line.
"""

import json
import os
import sys

os.environ.setdefault("COLO_SHIM_OFFLOAD", "on")  # the default; explicit so a changed default cannot skip these checks
import time
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from harness.fake_cuda import FakeCuda, PageLocks, adopt, device_bytes, on_device  # noqa: E402

ENTRIES = ("chained", "optimizer", "nemo_rl", "buffer")


def init():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # no port to collide on
    torch.cuda.current_device = lambda: torch.device("cpu")  # megatron places buffers there
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(1, 1)


def build(seed=0, steps=2):
    """The model after `steps` train steps, everything on the (stand-in) device; steps=0: no optimizer
    state yet, as a colocated job's first refit finds it."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.tensor_parallel import random as mrandom
    from megatron.core.transformer.transformer_config import TransformerConfig

    mrandom.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
    torch.manual_seed(seed)
    cfg = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, use_cpu_initialization=True,
                            bf16=True, params_dtype=torch.bfloat16, masked_softmax_fusion=False,
                            bias_activation_fusion=False, bias_dropout_fusion=False, apply_rope_fusion=False,
                            gradient_accumulation_fusion=False, persist_layer_norm=False)
    model = GPTModel(config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=128,
                     max_sequence_length=32).to(torch.bfloat16)
    ddp = DistributedDataParallel(cfg, DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=True), module=model)
    with FakeCuda(build=True):
        opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-2, bf16=True, params_dtype=torch.bfloat16,
                                                     use_distributed_optimizer=True), [ddp])
    from nemo_rl.models.policy.workers.megatron_policy_worker import MegatronPolicyWorkerImpl

    worker = MegatronPolicyWorkerImpl({"model": ddp, "optimizer": opt}, None, worker_sharding_annotations=None)
    st = SimpleNamespace(ddp=ddp, opt=opt, worker=worker, buffers=list(ddp.buffers), seed=seed)
    for n in range(1, steps + 1):
        step(st, n)
    with FakeCuda():  # on a GPU all of it lives on the device from the start
        opt.restore_from_cpu()
        for buf in st.buffers:
            adopt(buf.param_data)
            adopt(buf.grad_data)
    return st


def step(st, seed):
    gen = torch.Generator().manual_seed(seed)
    for buf in st.buffers:
        buf.grad_data.normal_(0.0, 1e-3, generator=gen)
    with FakeCuda(build=True):  # megatron's optimizer step makes its scalars on "cuda"
        st.opt.step()


def slots(st, entry):
    """(tensors the entry point moves, in a fixed order)."""
    if entry == "buffer":
        return [buf.param_data for buf in st.buffers]
    out = []
    for inner in st.opt.chained_optimizers:
        if entry != "nemo_rl":
            out += [p.data for g in inner.optimizer.param_groups for p in g["params"]]
        out += [v for s in inner.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    return out


def move(st, entry, to_host):
    if entry == "chained":
        st.opt.offload_to_cpu() if to_host else st.opt.restore_from_cpu()
    elif entry == "optimizer":
        for inner in st.opt.chained_optimizers:
            inner.offload_to_cpu() if to_host else inner.restore_from_cpu()
    elif entry == "nemo_rl":
        st.worker.move_optimizer("cpu" if to_host else "cuda")
    else:
        for buf in st.buffers:
            buf.offload_to_cpu(move_params=True, move_grads=True) if to_host else buf.reload_from_cpu()


def same(a, b) -> bool:
    return len(a) == len(b) and all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b))


def rounds(st, entry, n=2) -> dict:
    """n rounds of offload, reload, train step; what each round saw."""
    out = {"equal_after_offload": [], "equal_after_reload": [], "on_host": [], "back_on_device": [], "host_ids": [],
           "device_bytes_freed": [], "seconds": []}
    for r in range(n):
        with FakeCuda():
            before = [t.clone() for t in slots(st, entry)]
            held = device_bytes()
            start = time.perf_counter()
            move(st, entry, True)
            out["seconds"].append(round(time.perf_counter() - start, 4))
            hosts = slots(st, entry) if entry != "buffer" else [buf.param_data_cpu for buf in st.buffers]
            out["on_host"].append(not any(on_device(t) for t in hosts))
            out["equal_after_offload"].append(same(before, hosts))
            out["host_ids"].append([id(t.untyped_storage()) for t in hosts])
            out["device_bytes_freed"].append(held - device_bytes())
            del hosts  # a test holding the mirrors would (rightly) get fresh ones next round
            move(st, entry, False)
            out["back_on_device"].append(all(on_device(t) for t in slots(st, entry)))
            out["equal_after_reload"].append(same(before, slots(st, entry)))
        step(st, 100 + r)
    return out


def final_values(st) -> list:
    return slots(st, "chained") + slots(st, "buffer")


def digest(values) -> list:
    return [round(float(t.double().sum()), 9) for t in values]


def phase(name, shim_families=None, seam=None) -> tuple:
    fences = []
    if shim_families:
        import colo_shim
        from colo_shim.checkpoint import fence
        from colo_shim.offload import mirrors, pages

        colo_shim.install(shim_families)
        pages.host = seam
        guarded, offload, buffer_mirror = fence.guarded, mirrors.offload, mirrors.buffer_mirror
        fence.guarded = lambda reason: (fences.append(("fence", reason)), guarded(reason))[1]
        mirrors.offload = lambda s, where: (fences.append(("copy", where)), offload(s, where))[1]
        mirrors.buffer_mirror = lambda t, where: (fences.append(("copy", where)), buffer_mirror(t, where))[1]
    st = build()
    result = {entry: rounds(st, entry) for entry in ENTRIES}
    result["fence_log"] = fences
    return st, result


def main():
    opts = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    init()
    plain_st, plain = phase("plain")
    plain_values = final_values(plain_st)
    seam = PageLocks()
    shim_st, shim = phase("shim", ["offload", "megatron"], seam)
    import colo_shim
    from colo_shim.offload import mirrors

    out = {"plain": plain, "shim": shim, "identical": same(plain_values, final_values(shim_st)),
           "digest": digest(final_values(shim_st))[:4], "seam": {"registrations": seam.registrations,
                                                                  "locked": len(seam.locked), "syncs": seam.syncs},
           "report": mirrors.report(),
           "status": {f"{r['name']}:{r['target'].split(':')[1]}": [r["status"], r["calls"]]
                      for r in colo_shim.status() if r["name"] in ("offload", "megatron") and r["calls"]}}
    if opts.get("checks", True):
        import offload_checks

        out["checks"] = offload_checks.run(shim_st, seam, PageLocks)
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
