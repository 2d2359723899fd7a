#!/usr/bin/env python3
"""Read back every checkpoint main wrote; say whether each is whole, new, and what training made of the one before.

    python3 ckpt_check.py CKPT_DIR [--decay 0.99 [--initial HF_MODEL_DIR]]     # JSON on stdout

main saves each step to CKPT_DIR/step_N (renamed from tmp_step_N once the async write is finalized); the policy's
weights are a torch_dist checkpoint (a `.metadata` file beside its shards) somewhere under step_N/policy/weights.
Every tensor is read back with torch.distributed.checkpoint. A step whose tensors all equal the previous step's is
stale (NeMo-RL issue #3312: NVRx 0.6.0's cached writer re-writing an earlier step's data); a tmp_step_N left behind
is a save never finalized. With --decay (runs.py: zero gradients, so a step only applies weight decay), each tensor
of step N that changed must equal decay x its value in step N-1 up to bf16 rounding (relative error below 5e-3; a
stale tensor is off by 1 - decay = 1e-2), and at least one must have changed: the checkpoint holds the state
training had at that save. Tensors weight decay skips keep their value (on the H100 a first version of this check
counted the layer-stacked norm weights as matrices that should have decayed).

Step to step alone cannot see a checkpoint that lags its step uniformly (step N holding step N-1's weights, the shape
of #3312's bug, still decays by 0.99 from its predecessor). With --initial, the tensors that need no conversion
(embedding and output layer; Megatron pads the vocabulary) of every step N are also compared to decay**N x the HF
model main started from: `anchored` is the N that fits, so a lag of one step shows as N-1.
"""
import argparse
import json
import os
import re

TOL = 5e-3
# Megatron's name -> the HF model's, for tensors the Bridge copies as they are
SAME_AS_HF = {"embedding.word_embeddings.weight": "model.embed_tokens.weight", "output_layer.weight": "lm_head.weight"}


def dcp_dirs(root: str) -> list:
    return sorted(d for d, _, files in os.walk(root) if ".metadata" in files)


def load(path: str) -> dict:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = dcp.FileSystemReader(path).read_metadata()
    state = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in meta.state_dict_metadata.items()
             if isinstance(m, TensorStorageMetadata)}
    dcp.load(state, storage_reader=dcp.FileSystemReader(path), no_dist=True)
    return state


def compare(cur: dict, prev: dict, decay) -> dict:
    """Equal to prev (stale); with decay, each tensor either kept its value (what weight decay skips: biases and
    norms, which the checkpoint stacks across layers into matrices) or equals decay x prev up to bf16 rounding."""
    import torch

    same = cur.keys() == prev.keys() and all(torch.equal(cur[k], prev[k]) for k in cur)
    out = {"equal_to_previous": same}
    if decay is not None and cur.keys() == prev.keys():
        kept = [k for k in cur if torch.equal(cur[k], prev[k])]
        errs = {k: (torch.linalg.vector_norm(cur[k].float() - decay * prev[k].float())
                    / torch.linalg.vector_norm(prev[k].float()).clamp_min(1e-30)).item()
                for k in cur if k not in kept and cur[k].is_floating_point()}
        off = {k: round(e, 5) for k, e in errs.items() if not e < TOL}
        out.update(decayed=len(errs), kept=len(kept), kept_names=sorted(kept)[:8],
                   max_rel_err_vs_decayed_previous=max(errs.values(), default=None),
                   off_prediction=dict(sorted(off.items(), key=lambda kv: -kv[1])[:8]),
                   as_trained=bool(errs) and not off)
    return out


def initial_weights(model_dir: str) -> dict:
    from safetensors.torch import load_file

    out = {}
    for name in sorted(os.listdir(model_dir)):
        if name.endswith(".safetensors"):
            out.update({k: v for k, v in load_file(os.path.join(model_dir, name)).items() if k in SAME_AS_HF.values()})
    return out


def anchor(cur: dict, hf: dict, decay: float, n: int) -> dict:
    """Which power of decay (n-2 .. n+1) turns the HF start into this step's tensors; None if none fits."""
    import torch

    missing = sorted({k for pair in SAME_AS_HF.items() for k in pair} - set(cur) - set(hf))
    if missing:
        return {"anchored": None, "missing": missing}
    pairs = [(cur[meg][: hf[name].shape[0]].float(), hf[name].float()) for meg, name in SAME_AS_HF.items()]
    fits = []
    for k in range(max(n - 2, 0), n + 2):
        err = max((torch.linalg.vector_norm(got - decay ** k * start) / torch.linalg.vector_norm(start)).item()
                  for got, start in pairs)
        if err < TOL:
            fits.append((err, k))
    return {"anchored": min(fits)[1] if fits else None, "anchor_rel_err": round(min(fits)[0], 5) if fits else None}


def check(root: str, decay=None, initial=None) -> dict:
    steps, unfinished, prev = {}, [], None
    hf = initial_weights(initial) if initial and decay is not None else None
    for name in sorted(os.listdir(root) if os.path.isdir(root) else [], key=lambda n: int(re.sub(r"\D", "", n) or 0)):
        if name.startswith("tmp_step_"):
            unfinished.append(name)
            continue
        if not name.startswith("step_"):
            continue
        n = int(name[5:])
        dirs = dcp_dirs(os.path.join(root, name, "policy", "weights"))
        try:
            cur = load(dirs[0]) if dirs else None
        except Exception as exc:
            steps[n], prev = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}, None
            continue
        if cur is None:
            steps[n], prev = {"ok": False, "error": "no .metadata"}, None
            continue
        steps[n] = {"ok": True, "tensors": len(cur), **(compare(cur, prev, decay) if prev is not None else {}),
                    **(anchor(cur, hf, decay, n) if hf is not None else {})}
        prev = cur
    stale = [n for n, s in steps.items() if s.get("equal_to_previous")]
    checked = [n for n, s in steps.items() if "as_trained" in s]
    anchored = {"anchored_to_start": sum(1 for n, s in steps.items() if s.get("anchored") == n)} if hf is not None else {}
    return {**anchored, "steps": steps, "stale_steps": stale, "unfinished": unfinished, "decay": decay,
            "valid": sum(1 for n, s in steps.items() if s["ok"] and n not in stale),
            "as_trained": sum(1 for n in checked if steps[n]["as_trained"]), "checked_against_previous": len(checked)}


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--decay", type=float, default=None)
    ap.add_argument("--initial", default=None, help="the HF model directory main started from")
    args = ap.parse_args()
    print(json.dumps(check(args.root, args.decay, args.initial), indent=1))
