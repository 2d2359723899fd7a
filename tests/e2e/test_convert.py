"""bench/e2e/convert.py carries a real megatron-core 0.19.2 GPTModel into HF transformers' Llama unchanged.

The refit in the e2e harness is only evidence if the engine runs the trainer's model: here the
converted weights and config, loaded by transformers' own LlamaForCausalLM, must give the logits of
megatron's forward on random tokens (fp32, every tensor randomized, norms included, GQA with
head_dim != hidden/heads, a non-default RoPE base). Wrong mappings are run as controls in the same
child so the comparison is shown to be sharp enough to catch them.

The child runs megatron on the CPU (this machine and CI have no GPU) with two concessions, both
about device placement and not the math: megatron's own inference RNG tracker (dropout is 0 and the
training tracker needs CUDA RNG state) and `torch.cuda.current_device` answering the CPU device
(RotaryEmbedding moves its frequencies there on first forward).
"""

import os
import sys


# the child runs this file as a script: conftest.py's sys.path is not there
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
from harness.procs import REPO
from helpers import deps_dir, last_json, run_python

SIZES = dict(num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2, kv_channels=32,
             ffn_hidden_size=96, layernorm_epsilon=1e-6)
VOCAB, SEQ, ROPE_THETA = 128, 24, 5000.0
TOOL = os.path.join(REPO, "bench", "real_vllm", "make_random_llama.py")
ATOL = 1e-4  # fp32; observed max |diff| is printed in the result


def test_converted_llama_matches_megatron_logits():
    proc = run_python(os.path.abspath(__file__), pythonpath=[deps_dir("mcore", "0.19.2")], args=["child"],
                      timeout=120)
    result = last_json(proc)
    assert result["names_missing"] == [] and result["names_extra"] == [], result
    assert result["config"] == result["config_from_transformer_config"]
    assert result["config"]["num_key_value_heads"] == 2 and result["config"]["head_dim"] == 32
    assert result["config"]["rope_parameters"]["rope_theta"] == ROPE_THETA
    assert result["config"]["rms_norm_eps"] == 1e-6
    assert result["max_diff"] < ATOL, result
    assert result["argmax_equal"] is True
    # controls: each plausible wrong mapping must move the logits far outside the tolerance
    for name, diff in result["controls"].items():
        assert diff > 100 * ATOL, (name, result["controls"])
    # wrapped as the trainer holds it (DDP over Float16Module, bf16): same names, bf16 values of the same weights
    assert result["wrapped"] == {"names_equal": True, "dtype": "torch.bfloat16", "values_equal": True}
    assert result["refused"] == {"bias": True, "interleaved_rope": True}


def test_hf_dir_tokenizer_covers_the_vocabulary(tmp_path):
    """With tokenizer=True the dir also holds the random-Llama tool's tokenizer, sized to the model's vocabulary.

    The tool is the repo's own copy (bench/real_vllm/make_random_llama.py), named explicitly: the
    default search also looks above the checkout, which a fresh clone does not have.
    """
    sys.path.insert(0, REPO)
    from transformers import AutoConfig, AutoTokenizer

    from bench.e2e import convert

    config = {"model_type": "llama", "vocab_size": 1024, "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 3}
    convert.write_hf_dir(str(tmp_path), config, tokenizer=True, tool=TOOL)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    assert len(tok) == 1024 and tok.decode([1023]).strip()
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (0, 1, 3)
    assert AutoConfig.from_pretrained(str(tmp_path)).vocab_size == 1024


def _child() -> None:
    import json
    import tempfile

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # no port to collide on
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.tensor_parallel import random as mrandom
    from megatron.core.transformer.module import Float16Module
    from megatron.core.transformer.transformer_config import TransformerConfig
    from transformers import LlamaConfig, LlamaForCausalLM

    from bench.e2e import convert

    parallel_state.initialize_model_parallel(1, 1)
    mrandom.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
    torch.cuda.current_device = lambda: torch.device("cpu")
    torch.manual_seed(0)

    def build(**extra):
        cfg = TransformerConfig(**convert.megatron_llama_config(**SIZES, use_cpu_initialization=True,
                                                                params_dtype=torch.float32, **extra))
        return cfg, GPTModel(config=cfg, **convert.gpt_model_kwargs(VOCAB, SEQ, rope_theta=ROPE_THETA))

    tcfg, model = build()
    with torch.no_grad():  # every tensor random, norms away from 1, so no mapping can hide behind init values
        for name, p in model.named_parameters():
            norm = name.endswith("layernorm.weight")
            p.copy_(1.0 + 0.3 * torch.randn_like(p) if norm else 0.15 * torch.randn_like(p))
    model.eval()

    ids = torch.randint(0, VOCAB, (3, SEQ))
    pos = torch.arange(SEQ).unsqueeze(0).expand(3, -1)
    causal = torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), diagonal=1)[None, None]  # True = masked
    with torch.no_grad():
        ref = model(ids, pos, causal)

    config = convert.hf_config(model, VOCAB, SEQ)
    weights = dict(convert.iter_hf_weights(model))
    hf_dir = convert.write_hf_dir(tempfile.mkdtemp(prefix="colo_convert_"), config)  # what the engine reads
    hf_config = LlamaConfig.from_pretrained(hf_dir)
    hf_config._attn_implementation = "eager"  # the plain softmax path, as megatron's local DotProductAttention
    hf = LlamaForCausalLM(hf_config).eval()
    expected = set(hf.state_dict())

    def logits(state: dict) -> torch.Tensor:
        hf.load_state_dict(state, strict=True)
        with torch.no_grad():
            return hf(input_ids=ids, position_ids=pos).logits

    got = logits(weights)

    def swap_halves(t):
        a, b = torch.chunk(t, 2, dim=0)
        return torch.cat([b, a])

    def ungrouped_qkv(layer):  # the common mistake: q, k, v as three contiguous blocks of linear_qkv
        qkv = model.decoder.layers[layer].self_attention.linear_qkv.weight.detach()
        q_rows = SIZES["num_attention_heads"] * SIZES["kv_channels"]
        kv_rows = SIZES["num_query_groups"] * SIZES["kv_channels"]
        return dict(zip(("q_proj", "k_proj", "v_proj"), torch.split(qkv, [q_rows, kv_rows, kv_rows])))

    def mutate(**changes):
        state = dict(weights)
        for key, fn in changes.items():
            for layer in range(SIZES["num_layers"]):
                name = f"model.layers.{layer}.{key}.weight"
                state[name] = fn(layer, state[name])
        return state

    controls = {
        "gate_up_swapped": mutate(**{"mlp.gate_proj": lambda i, _: weights[f"model.layers.{i}.mlp.up_proj.weight"],
                                     "mlp.up_proj": lambda i, _: weights[f"model.layers.{i}.mlp.gate_proj.weight"]}),
        "qkv_ungrouped": mutate(**{f"self_attn.{p}": (lambda p: lambda i, _: ungrouped_qkv(i)[p])(p)
                                   for p in ("q_proj", "k_proj", "v_proj")}),
        "kv_groups_swapped": mutate(**{"self_attn.k_proj": lambda i, t: swap_halves(t)}),
        "q_rotary_halves_interleaved": mutate(**{"self_attn.q_proj": lambda i, t: t.view(
            SIZES["num_attention_heads"], 2, SIZES["kv_channels"] // 2, -1).transpose(1, 2).reshape(t.shape)}),
        "norms_swapped": mutate(**{
            "input_layernorm": lambda i, _: weights[f"model.layers.{i}.post_attention_layernorm.weight"],
            "post_attention_layernorm": lambda i, _: weights[f"model.layers.{i}.input_layernorm.weight"]}),
    }
    control_diffs = {name: (logits(state) - ref).abs().max().item() for name, state in controls.items()}

    refused = {}
    for key, extra in (("bias", {"add_bias_linear": True}), ("interleaved_rope", {"rotary_interleaved": True})):
        try:
            list(convert.iter_hf_weights(build(**extra)[1]))
            refused[key] = False
        except ValueError:
            refused[key] = True

    # the trainer's view: megatron Float16Module (bf16) under torch DDP, converted through both wrappers
    bf16_cfg = TransformerConfig(**convert.megatron_llama_config(**SIZES, use_cpu_initialization=True,
                                                                 params_dtype=torch.float32, bf16=True))
    wrapped = torch.nn.parallel.DistributedDataParallel(Float16Module(bf16_cfg, model))
    wrapped_weights = list(convert.iter_hf_weights(wrapped))
    print(json.dumps({
        "max_diff": (got - ref).abs().max().item(),
        "ref_abs_max": ref.abs().max().item(),
        "argmax_equal": bool(torch.equal(got.argmax(-1), ref.argmax(-1))),
        "names_missing": sorted(expected - set(weights)), "names_extra": sorted(set(weights) - expected),
        "config": config,
        "config_from_transformer_config": convert.hf_config(tcfg, VOCAB, SEQ, rope_theta=ROPE_THETA,
                                                            dtype="float32"),
        "controls": control_diffs,
        "refused": refused,
        "wrapped": {"names_equal": [n for n, _ in wrapped_weights] == list(weights),
                    "dtype": str(wrapped_weights[0][1].dtype),
                    "values_equal": all(torch.equal(t, weights[n].bfloat16()) for n, t in wrapped_weights)},
    }))


if __name__ == "__main__" and sys.argv[1:] == ["child"]:
    sys.path.insert(0, REPO)
    _child()
