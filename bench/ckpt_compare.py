"""What a checkpoint must hold, and the read-back that checks it: one home for the benches that
verify checkpoints (bench_fence_megatron.py's job, bench/e2e's verifiers), so neither reaches into
the other's private helpers.

A checkpoint is right when every tensor it holds has the float64 sum and squared norm the live
tensor had when the save was scheduled: exact enough to tell one training step from the next, and
cheap enough to take from a 1 B-parameter state on every save. torch and megatron-core are
imported inside the functions: the fence job imports colo-shim before either, as a user would.
"""

from __future__ import annotations

import time


def fingerprints(sharded) -> dict:
    """Per checkpoint key: float64 sum and squared norm of the local data (exact enough to see a step)."""
    import torch
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    keys, vals = [], []

    def walk(obj):
        if isinstance(obj, ShardedTensor):
            t = obj.data.detach().reshape(-1)
            keys.append(obj.key)
            vals.append(torch.stack([t.sum(dtype=torch.float64),
                                     torch.linalg.vector_norm(t, 2, dtype=torch.float64) ** 2]))
        elif isinstance(obj, dict):
            for v in obj.values():
                walk(v)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                walk(v)

    walk(sharded)
    out = {}
    for key, (s, q) in zip(keys, torch.stack(vals).tolist()):
        a, b = out.get(key, (0.0, 0.0))
        out[key] = (a + s, b + q)
    return out


def _read(path: str, keys) -> tuple:
    """Float64 [sum, squared norm] of each tensor `keys` names in the checkpoint (absent keys left out)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    keys = [k for k in keys if isinstance(meta.get(k), TensorStorageMetadata)]
    got = {}
    for i in range(0, len(keys), 64):
        chunk = {k: torch.empty(tuple(meta[k].size), dtype=meta[k].properties.dtype) for k in keys[i:i + 64]}
        dcp.load(chunk, storage_reader=dcp.FileSystemReader(path), no_dist=True)
        for k, t in chunk.items():
            t = t.reshape(-1)
            got[k] = (t.sum(dtype=torch.float64).item(), (torch.linalg.vector_norm(t, 2, dtype=torch.float64) ** 2).item())
        del chunk
    return got


def _check(got: dict, want: dict) -> dict:
    bad = [k for k in want if k in got and any(abs(g - e) > 1e-6 * max(1.0, abs(e)) for g, e in zip(got[k], want[k]))]
    found = sum(k in got for k in want)
    return {"equal": not bad and found > 0, "tensors": found, "missing": len(want) - found,
            "mismatched": len(bad), "first_mismatch": bad[:3]}


def compare(path: str, want: dict) -> dict:
    """Read every tensor of the checkpoint back and compare it with the fingerprints at schedule time."""
    t0 = time.perf_counter()
    got = _read(path, list(want))
    return dict(_check(got, want), compare_s=round(time.perf_counter() - t0, 2))


def compare_ranks(path: str, wants: list) -> dict:
    """Every rank's fingerprints against the one checkpoint the ranks wrote together: each rank's
    state at its save must be what the checkpoint holds under that rank's keys (its own shard, or a
    replica rank 0 wrote, which then shows a rank that drifted). The checkpoint is read once.
    One rank: exactly compare()."""
    if len(wants) == 1:
        return compare(path, wants[0])
    t0 = time.perf_counter()
    got = _read(path, sorted({k for want in wants for k in want}))
    per = [_check(got, want) for want in wants]
    return {"equal": all(r["equal"] for r in per), "tensors": len(got), "missing": sum(r["missing"] for r in per),
            "mismatched": sum(r["mismatched"] for r in per), "first_mismatch": [k for r in per for k in r["first_mismatch"]][:3],
            "ranks": per, "compare_s": round(time.perf_counter() - t0, 2)}
