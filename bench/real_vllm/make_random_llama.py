#!/usr/bin/env python3
"""Write a tiny random-weight Llama (config + safetensors + fast tokenizer) that vLLM can load offline.

    python3 bench/real_vllm/make_random_llama.py OUT_DIR [--seed 0] [--hidden 128 --layers 2 --inter 256]

Needs only torch, transformers (>= 5.x; made and checked with 5.17.0, the GPU machine's) and
tokenizers, all already on the GPU machine, so it can run there (seconds, no network) or here.

Shape, chosen for vLLM 0.26 on Hopper:
  hidden 128, 2 layers, 2 heads of head_dim 64 (FlashAttention-3 on SM90 takes head_size % 8 == 0
  and <= 256; 64 is a standard FA3 instantiation), 2 KV heads, MLP 256, vocab 512 (a multiple of
  64, so vLLM's vocab padding is a no-op), max positions 512, bf16. About 0.5 M parameters, ~1 MB
  of safetensors.
The tokenizer is a byte-level BPE trained here on a fixed inline text, so every string encodes
and decodes; <s>=0 </s>=1 <unk>=2 <pad>=3; filler tokens <xN> bring it to exactly 512,
so every id the model can emit decodes (vLLM's detokenizer needs that).
Weights are random (seeded): output text is gibberish, but greedy token ids are deterministic,
which is what a sleep(level=2) -> wake_up(weights) -> reload -> wake_up(kv_cache) check compares.
"""
import argparse
import json
import os

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "colocated training and generation share the same GPUs; vLLM sleeps and wakes up.",
    "Sleep level 1 offloads weights to CPU memory; level 2 discards them and the KV cache.",
    "def main():\n    return 0\n",
    "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,;:!?'\"()[]{}<>+-*/=_",
] * 20
SPECIALS = ["<s>", "</s>", "<unk>", "<pad>"]
VOCAB = 512


def build_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer=trainer)
    n = tok.get_vocab_size()
    assert n <= VOCAB, n
    # fill the vocabulary to exactly VOCAB so that every id the random model can emit decodes
    tok.add_tokens([f"<x{i}>" for i in range(VOCAB - n)])
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="<pad>", model_max_length=512)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--inter", type=int, default=256)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(a.seed)

    tok = build_tokenizer()
    tok.save_pretrained(a.out)

    cfg = LlamaConfig(
        vocab_size=VOCAB, hidden_size=a.hidden, intermediate_size=a.inter, num_hidden_layers=a.layers,
        num_attention_heads=a.hidden // 64, num_key_value_heads=a.hidden // 64, head_dim=64, max_position_embeddings=512,
        rms_norm_eps=1e-5, rope_theta=10000.0, hidden_act="silu", tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # modest random weights: finite logits, varied greedy tokens
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.05)
    model = model.to(torch.bfloat16)
    model.save_pretrained(a.out, safe_serialization=True)
    if not os.path.exists(os.path.join(a.out, "generation_config.json")):
        json.dump({"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id},
                  open(os.path.join(a.out, "generation_config.json"), "w"))

    # self-check with transformers: load back and run one greedy step
    m2 = LlamaForCausalLM.from_pretrained(a.out, torch_dtype=torch.bfloat16)
    ids = tok("The quick brown fox", return_tensors="pt").input_ids
    out = m2.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id)
    size = sum(os.path.getsize(os.path.join(a.out, f)) for f in os.listdir(a.out))
    print(f"wrote {a.out}: {sum(p.numel() for p in m2.parameters())} params, {size} bytes, "
          f"vocab {len(tok)}, greedy ids {out[0, ids.shape[1]:].tolist()}")


if __name__ == "__main__":
    main()
