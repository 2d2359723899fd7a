"""The three runs of issue 33 as main's own command lines: examples/run_grpo.py, main's Megatron 1B config, and
Hydra-style overrides only (nothing of main's code or config files is edited).

    python3 bench/nemo_rl/runs.py RUN STEPS INPUTS OUTDIR     # prints the environment and argv, one per line

a: main as is (async_save true, ckpt_assume_constant_structure true, from grpo_math_1B.yaml);
b: a with COLO_SHIM=1 in the job environment (main's init_ray copies the driver's environment into every actor);
c: a with policy.megatron_cfg.checkpoint.async_save=false.
"""
import sys

RUNS = {"a": ({}, []), "b": ({"COLO_SHIM": "1"}, []), "c": ({}, ["policy.megatron_cfg.checkpoint.async_save=false"])}


def overrides(steps: int, inputs: str, out: str) -> list:
    return [
        f"grpo.max_num_steps={steps}",
        "grpo.num_prompts_per_step=8",
        "grpo.num_generations_per_prompt=8",
        "grpo.val_period=0",
        f"policy.model_name={inputs}/model",
        "policy.train_global_batch_size=64",
        "policy.train_micro_batch_size=4",
        "policy.max_total_sequence_length=256",
        "policy.generation.vllm_cfg.gpu_memory_utilization=0.5",
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
    ]


def command(run: str, steps: int, inputs: str, out: str):
    env, extra = RUNS[run]
    argv = ["examples/run_grpo.py", "--config", "examples/configs/grpo_math_1B_megatron.yaml"]
    return env, argv + overrides(steps, inputs, out) + extra


if __name__ == "__main__":
    env, argv = command(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])
    for k, v in env.items():
        print(f"export {k}={v}")
    print(" ".join(argv))
