"""The colocated optimizer offload and reload, without and with colo-shim's `offload` family (issue 23).

Per path, in a fresh process each (one GPU, NCCL, one rank): a megatron-core GPTModel (default 16
layers x 2048 hidden, 0.94B params) in megatron DDP with the distributed optimizer, bf16 with fp32
main params and Adam state; in a colocated job's order (`--job-order 1`, the default) one offload and
reload before any optimizer state exists (a job's first refit: main params only, `before_state`),
then two train steps (the first makes Adam's state; with colo-shim its mirrors are made in background
threads from then on, colo_shim/offload/ahead.py), `--gap-s` of the job's own work (0: none, the
worst case for the mirrors made ahead), then `--rounds` rounds of offload, reload, train step,
each move timed between two cuda synchronizes and checked bit for bit (every moved tensor against
its copy taken on the GPU before the offload: on the host after it, on the GPU after the reload).
- path `mcore`: megatron-core's own `optimizer.offload_to_cpu()` / `restore_from_cpu()` (fp32 main
  params and Adam state; what bench/e2e's worker calls).
- path `nemo_rl`: NeMo-RL main's `MegatronPolicyWorkerImpl.move_optimizer("cpu" | "cuda")` (Adam
  state only), from the STAND-IN in bench/offload/site (that one method, at NeMo-RL's module path).
colo_shim=true runs the child with COLO_SHIM=1 (every family, as a job would; the fence runs first,
idle); false without it. Host figures per child: the process's RSS and peak RSS, page-locked bytes
(colo-shim's mirrors; torch's pinned allocator), and the node's MemAvailable before the model, after
it, after the rounds and its minimum during the rounds (a 20 ms sampler: the node's host peak).

    python bench/offload/bench_offload.py --site /tmp/e2esite          # GPU: writes results/offload_h200.json
    python bench/offload/bench_offload.py --tiny                       # CPU: a tiny model, same code

--tiny on a machine without CUDA runs through harness/fake_cuda.py (the CPU stand-in for CUDA that
the offload tests use too, so the tensors really move) with gloo; its numbers say nothing about speed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
GIB = float(1 << 30)
SITE = os.path.join(HERE, "site")


def _status(field: str) -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith(field + ":"))


def _mem_available() -> int:
    with open("/proc/meminfo") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("MemAvailable:"))


class Sampler(threading.Thread):
    """The node's lowest MemAvailable while it runs: where a host OOM would happen."""

    def __init__(self):
        super().__init__(daemon=True)
        self.low, self.running = _mem_available(), True

    def run(self):
        while self.running:
            self.low = min(self.low, _mem_available())
            time.sleep(0.02)


def _setup(tiny: bool):
    import torch
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(20000 + os.getpid() % 20000))
    if torch.cuda.is_available():
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", rank=0, world_size=1)
        return torch, None
    if not tiny:
        raise SystemExit("no CUDA here: use --tiny")
    sys.path.insert(0, REPO)
    from harness import fake_cuda

    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.cuda.current_device = lambda: torch.device("cpu")
    return torch, fake_cuda


def child(args) -> dict:
    t_start = time.perf_counter()
    avail0 = _mem_available()
    import colo_shim  # armed by COLO_SHIM=1 in the environment, else inert  # noqa: F401

    torch, fake = _setup(args.tiny)
    from contextlib import nullcontext

    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer.transformer_config import TransformerConfig
    from nemo_rl.models.policy.workers.megatron_policy_worker import MegatronPolicyWorkerImpl

    gpu = fake is None
    building = (lambda: nullcontext()) if gpu else (lambda: fake.FakeCuda(build=True))
    moving = (lambda: nullcontext()) if gpu else fake.FakeCuda
    parallel_state.initialize_model_parallel(1, 1)
    if gpu:
        tensor_parallel.model_parallel_cuda_manual_seed(1234)
    else:
        tensor_parallel.random.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
    torch.manual_seed(1234)
    cfg = TransformerConfig(num_layers=args.layers, hidden_size=args.hidden,
                            num_attention_heads=max(1, args.hidden // 128), bf16=True, params_dtype=torch.bfloat16,
                            use_cpu_initialization=not gpu, masked_softmax_fusion=False, bias_activation_fusion=False,
                            bias_dropout_fusion=False, apply_rope_fusion=False, gradient_accumulation_fusion=False,
                            persist_layer_norm=False)
    model = GPTModel(config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=args.vocab,
                     max_sequence_length=512, share_embeddings_and_output_weights=False)
    # torch's LayerNorm (local spec, no apex/TE) is built in fp32: cast, so that no main param is a
    # view of the DDP buffer (bench/fence_megatron_job.py says why)
    model = (model.cuda() if gpu else model).to(torch.bfloat16)
    ddp = DistributedDataParallel(cfg, DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=True), module=model)
    with building():
        opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-4, bf16=True, params_dtype=torch.bfloat16,
                                                     use_distributed_optimizer=True), [ddp])
    worker = MegatronPolicyWorkerImpl(opt)
    inner = list(getattr(opt, "chained_optimizers", [opt]))

    def sync():
        if gpu:
            torch.cuda.synchronize()

    def step(seed):
        gen = torch.Generator(device="cuda" if gpu else "cpu").manual_seed(seed)
        for buf in ddp.buffers:
            buf.grad_data.normal_(0.0, 1e-3, generator=gen)
        if gpu:
            ddp.finish_grad_sync()
        with building():
            opt.step()
        sync()

    def moved():
        """The tensors this path moves, in a fixed order."""
        out = []
        for o in inner:
            if args.path == "mcore":
                out += [p.data for g in o.optimizer.param_groups for p in g["params"]]
            out += [v for s in o.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
        return out

    def move(to_host):
        if args.path == "mcore":
            opt.offload_to_cpu() if to_host else opt.restore_from_cpu()
        else:
            worker.move_optimizer("cpu" if to_host else "cuda")

    def timed(to_host):
        sync()
        t0 = time.perf_counter()
        move(to_host)
        sync()
        return round(time.perf_counter() - t0, 4)

    first = {}
    with moving():
        if not gpu:
            move(False)  # into the stand-in's "device", where a GPU job has all of it from the start
        if args.job_order:  # a colocated job's first refit: offload and reload before any optimizer state
            first = {"gib": round(sum(t.numel() * t.element_size() for t in moved()) / GIB, 3),
                     "offload_s": timed(True), "reload_s": timed(False)}
    step(1)
    step(2)
    with moving():
        if not gpu:
            move(False)
    if args.gap_s:
        time.sleep(args.gap_s)  # the job's own work between its optimizer step and the next refit
    avail_built = _mem_available()
    rec = {"path": args.path, "colo_shim": bool(os.environ.get("COLO_SHIM")), "offload_s": [], "reload_s": [],
           "bit_identical": True, "host": {"rss_after_offload_gib": [], "rss_after_reload_gib": []},
           "before_state": first, "gap_s": args.gap_s}
    sampler = Sampler()
    sampler.start()
    for r in range(args.rounds):
        with moving():
            before = [t.detach().clone() for t in moved()]
            rec["gib"] = round(sum(t.numel() * t.element_size() for t in before) / GIB, 3)
            sync()
            t0 = time.perf_counter()
            move(True)
            sync()
            rec["offload_s"].append(round(time.perf_counter() - t0, 4))
            host = moved()
            rec["bit_identical"] &= all(not t.is_cuda for t in host) and all(
                torch.equal(b, h.to(b.device)) for b, h in zip(before, host))
            del host
            rec["host"]["rss_after_offload_gib"].append(round(_status("VmRSS") / GIB, 2))
            t0 = time.perf_counter()
            move(False)
            sync()
            rec["reload_s"].append(round(time.perf_counter() - t0, 4))
            live = moved()
            rec["bit_identical"] &= all(t.is_cuda for t in live) and all(
                torch.equal(b, t.to(b.device)) for b, t in zip(before, live))
            del before, live
            rec["host"]["rss_after_reload_gib"].append(round(_status("VmRSS") / GIB, 2))
        step(10 + r)
    sampler.running = False
    sampler.join()
    rec["tensors"] = len(moved())
    rec["host"].update(mem_available_before_gib=round(avail0 / GIB, 2),
                       mem_available_built_gib=round(avail_built / GIB, 2),
                       mem_available_after_gib=round(_mem_available() / GIB, 2),
                       mem_available_min_gib=round(sampler.low / GIB, 2), rss_peak_gib=round(_status("VmHWM") / GIB, 2),
                       torch_pinned_gib=_torch_pinned(torch))
    shim = {r["name"]: r.get("details") for r in colo_shim.status() if r["name"] == "offload" and r.get("details")}
    rec["shim"] = shim.get("offload")
    rec["host"]["page_locked_gib"] = (rec["shim"] or {}).get("page_locked_gib", 0.0)
    rec["device"] = torch.cuda.get_device_name(0) if gpu else "cpu (harness/fake_cuda.py)"
    rec["params"] = sum(p.numel() for p in model.parameters())
    rec["child_s"] = round(time.perf_counter() - t_start, 1)
    return rec


def _torch_pinned(torch):
    try:
        return round(torch.cuda.host_memory_stats().get("allocated_bytes.current", 0) / GIB, 3)
    except Exception:
        return None


def _run(args, path: str, shim: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLO_SHIM")}
    paths = [REPO, SITE, os.path.join(args.site, "mcore")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONUNBUFFERED"] = "1"
    if shim:
        env.update(COLO_SHIM="1", COLO_SHIM_OFFLOAD="on")  # the family is opt-in until measured (issue 23)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--path", path, "--rounds", str(args.rounds),
           "--layers", str(args.layers), "--hidden", str(args.hidden), "--vocab", str(args.vocab),
           "--job-order", str(args.job_order), "--gap-s", str(args.gap_s)] + (
        ["--tiny"] if args.tiny else [])
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.per_run_s, cwd=REPO)
    except subprocess.TimeoutExpired as exc:
        return {"path": path, "colo_shim": shim, "error": f"timed out after {args.per_run_s}s",
                "log_tail": (exc.stderr or "")[-2000:] if isinstance(exc.stderr, str) else ""}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"path": path, "colo_shim": shim, "error": f"exit {proc.returncode}", "log_tail": proc.stderr[-3000:]}
    return json.loads(lines[-1])


def table(records) -> str:
    head = ("| path | colo-shim | GiB | offload s (rounds) | reload s (rounds) | GB/s out/back, rounds >= 2 "
            "| bit-identical | RSS after offload / reload GiB | page-locked GiB | MemAvailable min GiB |")
    rows = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in records:
        if "error" in r:
            rows.append(f"| {r['path']} | {r['colo_shim']} | error: {r['error']} |")
            continue
        steady = lambda xs: min(xs[1:] or xs)  # noqa: E731  (the best steady round)
        rate = lambda xs: f"{r['gib'] * GIB / 1e9 / steady(xs):.1f}" if steady(xs) > 0 else "-"  # noqa: E731
        host = r["host"]
        rows.append(f"| {r['path']} | {r['colo_shim']} | {r['gib']:.2f} | {', '.join(map(str, r['offload_s']))} | "
                    f"{', '.join(map(str, r['reload_s']))} | {rate(r['offload_s'])} / {rate(r['reload_s'])} | "
                    f"{r['bit_identical']} | {max(host['rss_after_offload_gib'])} / "
                    f"{max(host['rss_after_reload_gib'])} | "
                    f"{host['page_locked_gib']} | {host['mem_available_min_gib']} |")
    return "\n".join(rows)


def first_table(records) -> str:
    """The first offloads apart from the later ones (issue 34): the one before any optimizer state (main
    params only, a job's first refit), the first with the state, the later ones; with colo-shim, what
    the mirrors made ahead in background threads saved the first one with the state."""
    head = ("| path | colo-shim | before state: GiB, offload s | 1st with state s | later s (median) | 1st / later "
            "| made ahead | waited for them s |")
    rows = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in records:
        if "error" in r or not r.get("offload_s"):
            continue
        later = sorted(r["offload_s"][1:]) or r["offload_s"]
        median = later[len(later) // 2]
        before = r.get("before_state") or {}
        ahead = ((r.get("shim") or {}).get("made_ahead") or {})
        rows.append(f"| {r['path']} | {r['colo_shim']} | {before.get('gib', '-')}, {before.get('offload_s', '-')} | "
                    f"{r['offload_s'][0]} | {median} | {r['offload_s'][0] / median:.2f} | "
                    f"{ahead.get('prepared', '-')} | {ahead.get('waited_s', '-')} |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--path", default="mcore", choices=("mcore", "nemo_rl"))
    ap.add_argument("--paths", default="mcore,nemo_rl")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--tiny", action="store_true", help="2 layers x 64 hidden, vocab 128; runs on the CPU")
    ap.add_argument("--job-order", type=int, default=1, help="1: an offload and reload before the first optimizer "
                    "step, as a colocated job's first refit (colo-shim then makes the state's mirrors ahead)")
    ap.add_argument("--gap-s", type=float, default=0.0, help="seconds between the last train step and round 1")
    ap.add_argument("--site", default=os.path.join(REPO, ".site"), help="holds mcore/ (pip --target of megatron-core)")
    ap.add_argument("--per-run-s", type=float, default=140, help="per child; four children share one 600 s call")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.tiny:
        args.layers, args.hidden, args.vocab = 2, 64, 128
    if args.child:
        print(json.dumps(child(args)), flush=True)
        return 0
    out = args.out or (os.path.join("/tmp", "offload_tiny.json") if args.tiny
                       else os.path.join(HERE, "results", "offload_h200.json"))
    records = []
    for path in args.paths.split(","):
        for shim in (False, True):
            t0 = time.perf_counter()
            records.append(_run(args, path, shim))
            print(f"[bench] {path} colo_shim={shim}: {time.perf_counter() - t0:.0f}s "
                  f"{records[-1].get('error') or records[-1]['offload_s']}", file=sys.stderr, flush=True)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as fh:
        json.dump(records, fh, indent=1)
    print(table(records))
    print()
    print(first_table(records))
    print(f"wrote {out}")
    return 0 if all("error" not in r and r["bit_identical"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
