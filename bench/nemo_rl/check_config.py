#!/usr/bin/env python3
"""CPU check of what main does with runs.py's overrides before any GPU work: main's own load_config,
parse_hydra_overrides and MasterConfig (pydantic), then main's get_tokenizer and setup_response_data on the local
model and JSONL. Run from the directory holding main's export (examples/ and nemo_rl/ on sys.path):

    python3 check_config.py RUN STEPS INPUTS OUTDIR
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import runs  # noqa: E402


def main() -> None:
    from omegaconf import OmegaConf

    from nemo_rl.algorithms.grpo import MasterConfig
    from nemo_rl.algorithms.utils import get_tokenizer
    from nemo_rl.data.utils import setup_response_data
    from nemo_rl.utils.config import load_config, parse_hydra_overrides, register_omegaconf_resolvers

    env, argv = runs.command(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])
    register_omegaconf_resolvers()
    config = parse_hydra_overrides(load_config(argv[2]), argv[3:])
    config = MasterConfig(**OmegaConf.to_container(config, resolve=True))
    ckpt = config.policy["megatron_cfg"]["checkpoint"]
    print("config ok: async_save", ckpt["async_save"], "assume_constant", ckpt["ckpt_assume_constant_structure"],
          "checkpointing", config.checkpointing["enabled"], config.checkpointing["save_period"],
          "steps", config.grpo.max_num_steps, "env", env)
    tokenizer = get_tokenizer(config.policy["tokenizer"])
    dataset, val_dataset, task_to_env, _ = setup_response_data(tokenizer, config.data, config.env, )
    print("data ok: train", len(dataset), "val", len(val_dataset) if val_dataset else 0, "first", dataset[0])
    import ray

    ray.shutdown()


if __name__ == "__main__":
    main()
