"""The driver of one e2e run: NeMo-RL's role (grpo.setup + grpo_train from the site package) with the
two actors spawned through rpc.py. Run by run.py in a fresh process per run (`run.py --driver`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import traceback

from bench.e2e.checkpoints import VERIFIERS, Checkpointer
from bench.e2e.hostmem import Monitor
from bench.e2e.record import GIB, Instrumented, Recorder, Timer

# stage, stage_nopin and main3322_stage measured the stage release, retired in issue 22: their
# names still run, as the default release that COLO_SHIM_NVRX_RELEASE=stage now is (recorded as
# RETIRED_RELEASE), so old results keep their meaning and a re-run shows what the alias does
MODES = {  # name -> (shim, release, worker layout, async save (None: checkpointing off), extra env)
    "noshim": (False, None, "v0_7", True, {}),
    "shim": (True, None, "v0_7", True, {}),
    "nosave": (False, None, "v0_7", None, {}),  # the same loop without checkpoints (issue 34's baseline)
    "nosave_shim": (True, None, "v0_7", None, {}),
    "stage": (True, "stage", "v0_7", True, {}),
    "stage_nopin": (True, "stage", "v0_7", True, {"COLO_SHIM_STAGE_PIN": "0"}),
    "sync_save": (False, None, "v0_7", False, {}),
    "main3322": (False, None, "main", True, {}),
    "main3322_stage": (True, "stage", "main", True, {}),
    "main3322_shim": (True, None, "main", True, {}),
}
RETIRED_RELEASE = "stage (retired: runs as inplace)"
_FULL_ROLLOUT = dict(vocab=32000, max_seq=256, prompts=8, generations=4, prompt_len=32, new_tokens=64, micro_batch=8,
                     max_num_seqs=64)
SIZES = {  # model, rollout and engine shapes
    "full": dict(sizes=dict(num_layers=20, hidden_size=2048, num_attention_heads=16, num_query_groups=8,
                            ffn_hidden_size=5632), vocab=32000, max_seq=256, prompts=8, generations=4,
                 prompt_len=32, new_tokens=64, micro_batch=8, max_num_seqs=64),
    "small": dict(sizes=dict(num_layers=4, hidden_size=512, num_attention_heads=8, num_query_groups=4,
                             ffn_hidden_size=1024), vocab=4096, max_seq=128, prompts=4, generations=4,
                  prompt_len=16, new_tokens=32, micro_batch=8, max_num_seqs=32),
    # the sweep (issue 34): Llama shapes of 1.54 B, 2.09 B and 2.61 B parameters (offloaded 25.8, 35.0 and
    # 43.8 GiB at 18 bytes a parameter); the rollout as "full"
    "1.5b": dict(_FULL_ROLLOUT, sizes=dict(num_layers=20, hidden_size=2560, num_attention_heads=20,
                                           num_query_groups=4, ffn_hidden_size=6912)),
    "2.1b": dict(_FULL_ROLLOUT, sizes=dict(num_layers=28, hidden_size=2560, num_attention_heads=20,
                                           num_query_groups=4, ffn_hidden_size=6912)),
    "2.6b": dict(_FULL_ROLLOUT, sizes=dict(num_layers=24, hidden_size=3072, num_attention_heads=24,
                                           num_query_groups=8, ffn_hidden_size=8192)),
    "tiny": dict(sizes=dict(num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2,
                            ffn_hidden_size=128), vocab=256, max_seq=64, prompts=2, generations=2,
                 prompt_len=8, new_tokens=8, micro_batch=4, max_num_seqs=8, verifiers=1),
}


class Cluster:
    def __init__(self, rec, run_cfg):
        self.rec, self.run_cfg = rec, run_cfg

    def start_engine(self, config):
        from bench.e2e import rpc

        t0 = time.perf_counter()
        remote = rpc.spawn("nemo_rl.models.generation.vllm.vllm_worker:VllmGenerationWorkerImpl", "engine", config=config)
        self.rec.run["engine_start_s"] = round(time.perf_counter() - t0, 1)
        self.rec.engine = remote
        return Instrumented(remote, "engine", self.rec)

    def start_trainer(self, config):
        """The trainer's ranks (one process each, NeMo-RL's worker group; one rank: the process the
        harness always had, without a rank environment)."""
        from bench.e2e import dist, rpc

        t0 = time.perf_counter()
        n = self.run_cfg["ranks"]
        remote = rpc.spawn_group("nemo_rl.models.policy.workers.megatron_policy_worker:MegatronPolicyWorkerImpl",
                                 "trainer", dist.envs(n) if n > 1 else [None], config=config)
        self.rec.run["trainer_start_s"] = round(time.perf_counter() - t0, 1)
        self.rec.trainer = remote
        return Instrumented(remote, "trainer", self.rec)


def _batches(sz, steps):
    import random

    for step in range(1, steps + 1):
        rnd = random.Random(step)
        prompts = [[rnd.randrange(4, sz["vocab"]) for _ in range(sz["prompt_len"])] for _ in range(sz["prompts"])]
        yield {"prompt_ids": [p for p in prompts for _ in range(sz["generations"])],
               "group": [i for i in range(sz["prompts"]) for _ in range(sz["generations"])],
               "seed": 1000 * step, "max_new_tokens": sz["new_tokens"], "vocab_size": sz["vocab"]}


def _release_label(shim: bool, release: str | None) -> str | None:
    """What a run records as its release: runs before the retirement recorded a real "stage"."""
    if release == "stage":
        return RETIRED_RELEASE
    return release or ("inplace (default)" if shim else None)


def driver(args) -> int:
    from bench.e2e import convert, probes

    shim, release, layout, async_save, _ = MODES[args.mode]
    sz = SIZES[args.size]
    run = {"name": args.name, "mode": args.mode, "nvrx": args.nvrx, "vllm": None, "shim": shim,
           "release": _release_label(shim, release), "worker": layout, "async_save": async_save,
           "size": args.size, "model": sz["sizes"], "vocab": sz["vocab"], "steps": [], "val_period": args.val_period,
           "kv_cache_gib": round(args.kv_bytes / GIB, 3) if args.kv_bytes else None, "kv_rule": args.kv_rule,
           "ckpt_medium": args.ckpt_medium, "main_finalize_order": args.order, "ranks": args.ranks,
           "checkpointing": async_save is not None, "nosave_steps": args.nosave_steps, "verify": bool(args.verify),
           "env": {k: v for k, v in os.environ.items() if k.startswith(("COLO_SHIM", "E2E_", "VLLM_ENABLE"))}}
    rec = Recorder(run, args.progress)
    sockets = tempfile.mkdtemp(prefix="colo_e2e_")  # the refit's ipc sockets (one per rank), removed at the end
    os.environ["E2E_ZMQ_ADDR"] = f"ipc://{sockets}/refit.sock"
    hf_dir = os.path.join(args.work, "hf")
    from types import SimpleNamespace

    hf = convert.hf_config(_bare_config(sz), sz["vocab"], sz["max_seq"])
    convert.write_hf_dir(hf_dir, hf)
    params = _count_params(hf)
    gen_cfg = {"model_dir": hf_dir, "max_model_len": sz["max_seq"], "max_num_seqs": sz["max_num_seqs"],
               "kv_cache_memory_bytes": args.kv_bytes, "weights_bytes": 2 * params, "vocab": sz["vocab"],
               "colocated": {"enabled": True}, "vllm_cfg": {"expert_parallel_size": 1}, "ranks": args.ranks}
    policy_cfg = {"model": {k: sz[k] for k in ("sizes", "vocab", "max_seq")}, "lr": 1e-5, "micro_batch": sz["micro_batch"],
                  "colocated": True, "generation": gen_cfg, "max_total_sequence_length": sz["max_seq"],
                  "checkpoint": {"async_save": bool(async_save), "async_strategy": "nvrx", "use_persistent_ckpt_worker": True,
                                 "ckpt_assume_constant_structure": True, "async_ckpt_use_cpu_shm": False}}
    master_config = {"policy": policy_cfg, "grpo": {"val_period": args.val_period, "use_dynamic_sampling": False,
                                                     "max_num_steps": args.steps, "num_generations_per_prompt": sz["generations"]},
                     "checkpointing": {"enabled": False}}  # set per step by phase() below
    ckpt_root = os.path.join(args.ckpt_dir, f"e2e_{os.getpid()}")
    os.makedirs(ckpt_root, exist_ok=True)
    checkpointer = None
    rec.monitor = Monitor(lambda: {p.pid for p in checkpointer.procs} if checkpointer else set())
    rec.monitor.start()
    from nemo_rl.algorithms import grpo

    try:
        if async_save is not None:  # the no-save modes have no checkpointer at all (no verifier processes)
            checkpointer = Checkpointer(ckpt_root, rec, order=args.order, verify=bool(args.verify),
                                        verifiers=sz.get("verifiers", VERIFIERS))
        rec.checkpointer = checkpointer
        cluster = Cluster(rec, run)
        t0 = time.perf_counter()
        policy, generation = grpo.setup(master_config, cluster)
        run["setup_s"] = round(time.perf_counter() - t0, 1)
        s = rec.engine.call("report", "last_sleep")
        run["level1_backup_gib"] = round(s["pinned"] / GIB, 3)  # the setup finish sleeps at level 1
        run["setup_sleep_level"] = s["level"]
        if args.ranks > 1:  # with TP the backups are the workers' (the engine process holds none)
            run["level1_backup_per_rank_gib"] = [round(b / GIB, 3) for b in rec.engine.call("report", "worker_pinned")]
            run["level1_backup_gib"] = max(run["level1_backup_per_rank_gib"])
        run["vllm"] = _vllm_version(rec.engine)
        run["platform"] = platform()  # the orchestrator's meta: it never imports torch itself
        run["params"] = params
        rec.write()
        val = next(_batches(dict(sz, prompts=2, generations=1), 1))
        val["seed"] = 0
        timer = Timer()
        def phase(n):
            """Checkpoints from step nosave_steps + 1 on (0: every step), read by grpo_train at each step's end."""
            rec.begin(n, timer)
            on = master_config["checkpointing"]["enabled"] = checkpointer is not None and n > args.nosave_steps
            rec.step["ckpt_on"] = on

        logger = SimpleNamespace(begin_step=phase, after_finish=rec.after_finish, log_metrics=rec.log_metrics)
        grpo.grpo_train(policy, generation, _batches(sz, args.steps), val, None, None, None, None, logger,
                        checkpointer, {"total_steps": 0}, master_config, timer)
        if checkpointer is not None:
            checkpointer.finish(lambda: max(rec.trainer.call("finish_all_saves")))
        run["engine_shim"] = rec.engine.call("report", "shim_report")
        shim_ranks = rec.trainer.call("report", "shim_status")
        run["trainer_shim"] = shim_ranks[0]  # rank 0's, as with one rank; every rank's beside it
        run["trainer_offload"] = rec.trainer.call("report", "offload_report")[0]  # mirrors, made ahead
        if args.ranks > 1:
            run["trainer_shim_per_rank"] = shim_ranks
        run["driver_shim"] = probes.shim_status(details=True)  # the driver's vllm-family decisions
    except BaseException as exc:  # noqa: BLE001 - the run's record says where it stopped
        run["error"] = f"{type(exc).__name__}: {exc}"[-3000:]
        run["traceback"] = traceback.format_exc()[-3000:]
        if rec.step is not None and rec.step.get("step_s") is None:
            rec.step["incomplete"] = True
    for remote in (rec.engine, rec.trainer):  # as NeMo-RL's shutdown(): each actor leaves its loop and exits
        if remote is not None:
            remote.close()
    rec.monitor.stop = True
    run["mem_available_min_gib"] = round(rec.monitor.run_min_avail / GIB, 3)
    rec.write()
    shutil.rmtree(ckpt_root, ignore_errors=True)
    shutil.rmtree(sockets, ignore_errors=True)
    print("[e2e] done", json.dumps({k: run.get(k) for k in ("name", "error")})[:2000], flush=True)
    os._exit(0)  # actors and NVRx's writer die with the session; atexit hooks must not hang the run


def _bare_config(sz):
    from types import SimpleNamespace

    s = sz["sizes"]
    return SimpleNamespace(normalization="RMSNorm", gated_linear_unit=True, add_bias_linear=False, add_qkv_bias=False,
                           qk_layernorm=False, rotary_interleaved=False, num_moe_experts=None, multi_latent_attention=False,
                           hidden_size=s["hidden_size"], ffn_hidden_size=s["ffn_hidden_size"], num_layers=s["num_layers"],
                           num_attention_heads=s["num_attention_heads"], num_query_groups=s["num_query_groups"],
                           kv_channels=s["hidden_size"] // s["num_attention_heads"], layernorm_epsilon=1e-5, bf16=True,
                           params_dtype="torch.bfloat16")


def params_of(size: str) -> int:
    """Parameters of a SIZES model, from its shape alone (the orchestrator sizes the KV cache with it)."""
    s = SIZES[size]["sizes"]
    return _count_params({"hidden_size": s["hidden_size"], "intermediate_size": s["ffn_hidden_size"],
                          "vocab_size": SIZES[size]["vocab"], "num_hidden_layers": s["num_layers"],
                          "head_dim": s["hidden_size"] // s["num_attention_heads"],
                          "num_attention_heads": s["num_attention_heads"],
                          "num_key_value_heads": s["num_query_groups"]})


def _count_params(hf) -> int:
    h, f, v, n = hf["hidden_size"], hf["intermediate_size"], hf["vocab_size"], hf["num_hidden_layers"]
    d = hf["head_dim"]
    per = h * (hf["num_attention_heads"] * d + 2 * hf["num_key_value_heads"] * d) + hf["num_attention_heads"] * d * h
    per += 3 * h * f + 2 * h
    return n * per + 2 * v * h + h


def _vllm_version(engine):
    return engine.call("report", "version")


def platform() -> dict:
    """torch and the GPU, for the call's meta: the driver has torch loaded, while importing it in the
    orchestrator only for this would cost each call seconds of CPU (most of a test's orchestrator)."""
    import torch

    return {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


# ============================================================================ orchestrator
