"""Megatron-core GPTModel (Llama shape, local spec) -> Hugging Face Llama names, layouts and config.

Why our own converter and not megatron-bridge's `AutoBridge.export_hf_weights` (what NeMo-RL uses):
without Transformer Engine, `from megatron.bridge import AutoBridge` fails (its peft module imports
transformer_engine at module level), and the harness must not stand a stub in for a library. The
mapping for a local-spec Llama is small and fixed, and tests/e2e/test_convert.py proves it against
HF transformers' own LlamaForCausalLM (logits equal), so the refit carries the same weights a
bridge would.

Layouts (megatron-core 0.19.2, TP = PP = 1):
- `linear_qkv.weight` is grouped per query group: [ng, (np/ng) q heads + 1 k head + 1 v head, hn,
  hidden] (attention.py `get_query_key_value_tensors`); HF wants q, k, v stacked by head, with KV
  head j serving query heads j*np/ng ... (transformers `repeat_kv`), the same grouping.
- `linear_fc1.weight` is [gate; up] (mlp.py `glu`: `chunk(x, 2)`, act on the first half).
- Rotary: megatron's non-interleaved rotate_half with `cat(freqs, freqs)` is HF Llama's convention,
  so q/k rows need no permutation; `rotary_interleaved=True` would, and is refused.
Anything the mapping does not know (biases, TE-fused norms, qk-norm, MoE) raises rather than being
dropped, so a refit can never silently lose a tensor.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from typing import Iterator

import torch
import torch.nn.functional as F

DEFAULT_ROPE_THETA = 10000.0

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_LAYER_DIRECT = {  # megatron suffix -> HF suffix under model.layers.{i}.
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
}
_TOP = {
    "embedding.word_embeddings.weight": "model.embed_tokens.weight",
    "decoder.final_layernorm.weight": "model.norm.weight",
    "output_layer.weight": "lm_head.weight",
}


def megatron_llama_config(*, num_layers: int, hidden_size: int, num_attention_heads: int, ffn_hidden_size: int,
                          num_query_groups: int | None = None, kv_channels: int | None = None,
                          layernorm_epsilon: float = 1e-5, **extra) -> dict:
    """TransformerConfig kwargs for a Llama-shaped model; `extra` (dtype, init, fusions) passes through.

    One helper for the test and the harness so the shape the test proves is the shape that is refit.
    """
    kwargs = dict(num_layers=num_layers, hidden_size=hidden_size, num_attention_heads=num_attention_heads,
                  ffn_hidden_size=ffn_hidden_size, num_query_groups=num_query_groups or num_attention_heads,
                  kv_channels=kv_channels or hidden_size // num_attention_heads, layernorm_epsilon=layernorm_epsilon,
                  normalization="RMSNorm", gated_linear_unit=True, activation_func=F.silu,
                  add_bias_linear=False, add_qkv_bias=False, qk_layernorm=False, rotary_interleaved=False,
                  hidden_dropout=0.0, attention_dropout=0.0)
    kwargs.update(extra)
    return kwargs


def gpt_model_kwargs(vocab_size: int, max_sequence_length: int, rope_theta: float = DEFAULT_ROPE_THETA) -> dict:
    """GPTModel kwargs besides `config` (local spec, RoPE, untied output layer)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    return dict(transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"), vocab_size=vocab_size,
                max_sequence_length=max_sequence_length, position_embedding_type="rope", rotary_base=rope_theta,
                share_embeddings_and_output_weights=False)


def unwrap(model):
    """The GPTModel under megatron DDP / torch DDP / Float16Module wrappers (all keep it in `.module`)."""
    if isinstance(model, (list, tuple)):  # megatron's list of model chunks: one chunk without VPP
        if len(model) != 1:
            raise ValueError(f"expected one model chunk (no virtual pipeline), got {len(model)}")
        model = model[0]
    while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
        model = model.module
    return model


def _check_llama_shape(cfg, model=None) -> None:
    """Refuse configurations whose math HF Llama does not reproduce (the logits would differ silently)."""
    wrong = []
    want = {"normalization": "RMSNorm", "gated_linear_unit": True, "add_bias_linear": False, "add_qkv_bias": False,
            "qk_layernorm": False, "rotary_interleaved": False, "num_moe_experts": None,
            "multi_latent_attention": False, "attention_output_gate": False, "qk_l2_norm": False,
            "softmax_scale": None, "softmax_type": "vanilla", "window_size": None, "no_rope_freq": None,
            "apply_residual_connection_post_layernorm": False, "layernorm_zero_centered_gamma": False,
            "experimental_attention_variant": None,
            "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1}
    for key, value in want.items():
        if getattr(cfg, key, value) != value:
            wrong.append(f"{key}={getattr(cfg, key)!r} (need {value!r})")
    if getattr(cfg, "activation_func", F.silu) is not F.silu:
        wrong.append(f"activation_func={cfg.activation_func!r} (need F.silu)")
    if getattr(cfg, "glu_linear_offset", 0.0) or getattr(cfg, "activation_func_clamp_value", None) is not None:
        wrong.append("glu_linear_offset / activation_func_clamp_value set")
    if model is not None:
        if getattr(model, "position_embedding_type", "rope") != "rope":
            wrong.append(f"position_embedding_type={model.position_embedding_type!r}")
        if getattr(model, "rotary_percent", 1.0) != 1.0 or getattr(model, "rotary_scaling", False):
            wrong.append("partial or scaled RoPE")
        if getattr(model, "share_embeddings_and_output_weights", False):
            wrong.append("tied embeddings")
    if wrong:
        raise ValueError("not a Llama-shaped megatron model: " + ", ".join(wrong))


def hf_config(model_cfg_or_megatron_config, vocab_size: int, max_position_embeddings: int, *,
              rope_theta: float | None = None, dtype: str | None = None) -> dict:
    """HF LlamaConfig dict (config.json) for a GPTModel (any wrapper) or its TransformerConfig.

    From a model, RoPE base comes from the model; from a bare config it is `rope_theta` (default 10000,
    megatron's `rotary_base` default). Written both as `rope_parameters` (transformers 5) and
    `rope_theta` (older readers).
    """
    obj = unwrap(model_cfg_or_megatron_config)
    model = obj if isinstance(obj, torch.nn.Module) else None
    cfg = model.config if model is not None else obj
    _check_llama_shape(cfg, model)
    if model is not None:
        if model.vocab_size != vocab_size:
            raise ValueError(f"model vocab {model.vocab_size} != vocab_size {vocab_size}")
        rope_theta = float(model.rotary_base) if rope_theta is None else rope_theta
    rope_theta = DEFAULT_ROPE_THETA if rope_theta is None else float(rope_theta)
    if dtype is None:
        dtype = "bfloat16" if getattr(cfg, "bf16", False) else str(cfg.params_dtype).removeprefix("torch.")
    heads = cfg.num_attention_heads
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": vocab_size, "hidden_size": cfg.hidden_size, "intermediate_size": cfg.ffn_hidden_size,
        "num_hidden_layers": cfg.num_layers, "num_attention_heads": heads,
        "num_key_value_heads": cfg.num_query_groups or heads, "head_dim": cfg.kv_channels or cfg.hidden_size // heads,
        "hidden_act": "silu", "max_position_embeddings": max_position_embeddings,
        "rms_norm_eps": cfg.layernorm_epsilon, "rope_theta": rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta},
        "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
        "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True, "dtype": dtype,
        "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 3,  # the ids of make-random-llama's tokenizer
    }


def _split_qkv(weight: torch.Tensor, cfg) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    heads, groups = cfg.num_attention_heads, cfg.num_query_groups or cfg.num_attention_heads
    head_dim = cfg.kv_channels or cfg.hidden_size // heads
    per_group = heads // groups
    grouped = weight.view(groups, per_group + 2, head_dim, weight.shape[-1])
    q = grouped[:, :per_group].reshape(heads * head_dim, -1)
    k = grouped[:, per_group].reshape(groups * head_dim, -1)
    v = grouped[:, per_group + 1].reshape(groups * head_dim, -1)
    return q, k, v


def iter_hf_weights(model) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor) per HF weight, on the parameters' device and dtype, one tensor at a time.

    gate/up are views of fc1 (no copy); q/k/v are one copy each of a slice of the fused QKV. Every
    megatron parameter must map: an unknown name raises before anything half-converted is used.
    """
    gpt = unwrap(model)
    cfg = gpt.config
    _check_llama_shape(cfg, gpt)
    params = list(gpt.named_parameters())
    unknown = [name for name, _ in params if name not in _TOP and not _layer_known(name)]
    if unknown:
        raise ValueError(f"megatron parameters with no HF mapping: {unknown}")
    offset = gpt.decoder.layers[0].layer_number - 1 if len(gpt.decoder.layers) else 0
    for name, param in params:
        weight = param.detach()
        if name in _TOP:
            yield _TOP[name], weight
            continue
        index, suffix = _LAYER.match(name).groups()
        prefix = f"model.layers.{int(index) + offset}."
        if suffix in _LAYER_DIRECT:
            yield prefix + _LAYER_DIRECT[suffix], weight
        elif suffix == "self_attention.linear_qkv.weight":
            q, k, v = _split_qkv(weight, cfg)
            yield prefix + "self_attn.q_proj.weight", q
            yield prefix + "self_attn.k_proj.weight", k
            yield prefix + "self_attn.v_proj.weight", v
        else:  # mlp.linear_fc1.weight
            gate, up = torch.chunk(weight, 2, dim=0)
            yield prefix + "mlp.gate_proj.weight", gate
            yield prefix + "mlp.up_proj.weight", up


def _layer_known(name: str) -> bool:
    match = _LAYER.match(name)
    return bool(match) and (match.group(2) in _LAYER_DIRECT or match.group(2) in
                            ("self_attention.linear_qkv.weight", "mlp.linear_fc1.weight"))


def write_hf_dir(out_dir: str, config: dict, *, tokenizer: bool = False, tool: str | None = None) -> str:
    """config.json + generation_config.json: all vLLM's `load_format="dummy"` reads of the weights side.

    With tokenizer=False the engine must run tokenizer-free (`skip_tokenizer_init=True`, token-id
    prompts, `detokenize=False`). tokenizer=True writes the byte-level BPE tokenizer of the shared
    make-random-llama.py tool (imported from `tool`, COLO_E2E_LLAMA_TOOL or shared/tools/), filled to
    exactly the model's vocabulary so every id decodes (the vocabulary must hold its 256-byte alphabet
    and 4 specials; made here at 1024, 32768 and 128256 ids, 3-12 s).
    """
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}, f)
    if tokenizer:
        maker = _load_tool(tool)
        maker.VOCAB = config["vocab_size"]  # the tool fills its BPE vocabulary up to this global
        maker.build_tokenizer().save_pretrained(out_dir)
    return out_dir


def _load_tool(path: str | None):
    """The shared tool, from `path`, COLO_E2E_LLAMA_TOOL, or shared/tools/ in the checkout or above it."""
    candidates = [path, os.environ.get("COLO_E2E_LLAMA_TOOL")]
    here = os.path.dirname(os.path.abspath(__file__))
    while os.path.dirname(here) != here:
        candidates.append(os.path.join(here, "shared", "tools", "make-random-llama.py"))
        here = os.path.dirname(here)
    for candidate in candidates:
        if candidate and os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("make_random_llama", candidate)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    raise FileNotFoundError(f"make-random-llama.py not found (tried {[c for c in candidates if c]})")
