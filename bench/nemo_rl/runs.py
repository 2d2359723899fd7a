"""The three runs of issue 33 as main's own command lines: examples/run_grpo.py, main's Megatron 1B config, and
Hydra-style overrides only (nothing of main's code or config files is edited).

    python3 bench/nemo_rl/runs.py RUN STEPS INPUTS OUTDIR     # prints the environment and argv, one per line

a: main as is (async_save true, ckpt_assume_constant_structure true, from grpo_math_1B.yaml);
b: a with COLO_SHIM=1 in the job environment (main's init_ray copies the driver's environment into every actor);
c: a with policy.megatron_cfg.checkpoint.async_save=false;
d0, d1: (d) of the issue, main 7ea279abf with PR #3322's own diff reversed (build_bundle.sh makes the file;
   device.sh puts that tree first on PYTHONPATH through NEMO_RL_TREE), vLLM at d_util() of the GPU instead of 0.5:
   d0 as is, d1 with COLO_SHIM=1.
"""
import os
import sys

SOURCES = {"NeMo-RL": "7ea279abf", "Megatron-Bridge": "8c46dc42", "Megatron-LM": "14346b65"}  # build_bundle.sh's
DECAY = 1 - 0.01 * 1.0  # what each step multiplies the decayed weights by (see the lr / weight decay overrides)

# (d): without #3322 NVRx's cached writer keeps the model and optimizer blocks it was sent (~10.8 GB here, the
# policy's allocation before its optimizer offload) after both refit offloads, and vLLM wakes its KV cache next. At
# 0.5 of the GPU that fits beside them. (d) gives vLLM all but D_LEFT_GIB of the card (device.sh exports the card's
# GPU_TOTAL_MIB from nvidia-smi): 0.90 of an 80 GB H100 (79.6 GiB), 0.94 of an H200 (140.4 GiB). The held blocks
# cannot fit in what is left; the CUDA contexts and the 0.13 GB the policy keeps after its offload can.
D_LEFT_GIB = 8.0


def d_util() -> float:
    total_gib = float(os.environ.get("GPU_TOTAL_MIB", 81559)) / 1024  # default: the H100 80GB HBM3 of 2026-12-06
    return round(1 - D_LEFT_GIB / total_gib, 2)


PRE_3322 = {"NEMO_RL_TREE": "rl-pre3322"}
# run -> (its environment, its extra overrides, vLLM's gpu_memory_utilization: a number, or d_util for the card's)
RUNS = {"a": ({}, [], 0.5), "b": ({"COLO_SHIM": "1"}, [], 0.5),
        "c": ({}, ["policy.megatron_cfg.checkpoint.async_save=false"], 0.5),
        "d0": (PRE_3322, [], d_util), "d1": ({**PRE_3322, "COLO_SHIM": "1"}, [], d_util)}


def overrides(steps: int, inputs: str, out: str, util: float) -> list:
    return [
        f"grpo.max_num_steps={steps}",
        "grpo.num_prompts_per_step=8",
        "grpo.num_generations_per_prompt=8",
        "grpo.val_period=0",
        f"policy.model_name={inputs}/model",
        "policy.train_global_batch_size=64",
        "policy.train_micro_batch_size=4",
        "policy.max_total_sequence_length=256",
        f"policy.generation.vllm_cfg.gpu_memory_utilization={util}",
        # no torch.compile / CUDA-graph capture at each run's vLLM start: device minutes, the same in a, b and c
        "policy.generation.vllm_cfg.enforce_eager=true",
        "data.train.dataset_name=ResponseDataset",
        f"+data.train.data_path={inputs}/math.jsonl",
        "+data.train.input_key=input",
        "+data.train.output_key=output",
        "data.default.prompt_file=null",
        "env.math.num_workers=2",
        "checkpointing.enabled=true",
        "checkpointing.save_period=1",
        "checkpointing.keep_top_k=100",
        f"checkpointing.checkpoint_dir={out}/ckpt",
        f"logger.log_dir={out}/logs",
        "cluster.gpus_per_node=1",
        # Random weights earn no reward, so the advantages and every gradient are zero and main's own settings
        # (lr 5e-7 in warm-up, weight decay 0.01) leave the bf16 weights bit-identical from step to step: a stale
        # checkpoint could not be told from a fresh one. A constant lr 1e-2 with weight decay 1.0 and no KL term
        # makes every step shrink the decayed weights by exactly 1 - lr * wd = 0.99 (Adam's update is 0/eps = 0),
        # so ckpt_check.py can predict each checkpoint from the one before it. The same in a, b and c.
        "policy.megatron_cfg.optimizer.lr=0.01",
        "policy.megatron_cfg.optimizer.min_lr=0.01",
        "policy.megatron_cfg.scheduler.lr_warmup_init=0.01",
        "policy.megatron_cfg.optimizer.weight_decay=1.0",
        "loss_fn.reference_policy_kl_penalty=0.0",
    ]


def command(run: str, steps: int, inputs: str, out: str):
    env, extra, util = RUNS[run]
    util = util() if callable(util) else util
    argv = ["examples/run_grpo.py", "--config", "examples/configs/grpo_math_1B_megatron.yaml"]
    return env, argv + overrides(steps, inputs, out, util) + extra


if __name__ == "__main__":
    env, argv = command(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])
    for k, v in env.items():
        print(f"export {k}={v}")
    print(" ".join(argv))
