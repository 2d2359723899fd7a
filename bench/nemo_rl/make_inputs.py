#!/usr/bin/env python3
"""The model, tokenizer and data set main's GRPO reads on a machine with no network.

    python3 bench/nemo_rl/make_inputs.py OUT [--hidden 2048 --layers 16 --inter 5632] [--problems 512]

OUT/model: a random Llama from bench/real_vllm/make_random_llama.py (config, safetensors, byte-level BPE
tokenizer), plus a chat template, because main's math_hf_data_processor renders every prompt through
apply_chat_template. OUT/math.jsonl: integer additions {"input": "What is 12 + 7?", "output": "19"}, the local-file
form of main's ResponseDataset (data.default.dataset_name=ResponseDataset, input_key/output_key). Rewards are ~0
with random weights; the bench measures memory and time, not learning.
"""
import argparse
import json
import os
import random
import subprocess
import sys

TEMPLATE = ("{% for m in messages %}{{ '<' + m['role'] + '> ' + m['content'] + '\n' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<assistant> ' }}{% endif %}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--inter", type=int, default=5632)
    ap.add_argument("--problems", type=int, default=512)
    args = ap.parse_args()
    model = os.path.join(args.out, "model")
    maker = os.path.join(os.path.dirname(__file__), "..", "real_vllm", "make_random_llama.py")
    subprocess.run([sys.executable, maker, model, "--hidden", str(args.hidden), "--layers", str(args.layers),
                    "--inter", str(args.inter)], check=True)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    tok.chat_template = TEMPLATE
    tok.save_pretrained(model)
    rng = random.Random(0)
    with open(os.path.join(args.out, "math.jsonl"), "w") as fh:
        for _ in range(args.problems):
            a, b = rng.randint(1, 99), rng.randint(1, 99)
            fh.write(json.dumps({"input": f"What is {a} + {b}?", "output": str(a + b)}) + "\n")
    print(f"model and {args.problems} problems in {args.out}")


if __name__ == "__main__":
    main()
