#!/usr/bin/env python3
"""Read back every checkpoint main wrote and say whether it is whole and new.

    python3 ckpt_check.py CKPT_DIR      # JSON on stdout

main saves each step to CKPT_DIR/step_N (renamed from tmp_step_N once the async write is finalized); the policy's
weights are a torch_dist checkpoint (a `.metadata` file beside its shards) somewhere under step_N/policy/weights.
Every tensor is read back with torch.distributed.checkpoint; its float64 sum and squared norm make the step's
fingerprint. A step whose weights fingerprint equals the previous step's is stale (NeMo-RL issue #3312: NVRx 0.6.0's
cached writer re-writing the first step's data); a tmp_step_N left behind is a save never finalized.
"""
import json
import os
import re
import sys


def dcp_dirs(root: str) -> list:
    return sorted(d for d, _, files in os.walk(root) if ".metadata" in files)


def fingerprint(path: str) -> dict:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = dcp.FileSystemReader(path).read_metadata()
    state = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in meta.state_dict_metadata.items()
             if isinstance(m, TensorStorageMetadata)}
    dcp.load(state, storage_reader=dcp.FileSystemReader(path), no_dist=True)
    s = q = 0.0
    for key in sorted(state):
        t = state[key].reshape(-1)
        s += t.sum(dtype=torch.float64).item()
        q += (torch.linalg.vector_norm(t.double(), 2) ** 2).item()
    return {"tensors": len(state), "sum": s, "sq_norm": q}


def check(root: str) -> dict:
    steps, unfinished = {}, []
    for name in sorted(os.listdir(root) if os.path.isdir(root) else [], key=lambda n: int(re.sub(r"\D", "", n) or 0)):
        if name.startswith("tmp_step_"):
            unfinished.append(name)
            continue
        if not name.startswith("step_"):
            continue
        weights = os.path.join(root, name, "policy", "weights")
        dirs = dcp_dirs(weights)
        try:
            found = dict(fingerprint(dirs[0]), ok=True) if dirs else {"ok": False, "error": "no .metadata"}
            steps[int(name[5:])] = found
        except Exception as exc:
            steps[int(name[5:])] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    stale, prev = [], None
    for n in sorted(steps):
        fp = steps[n]
        same = prev is not None and (fp.get("sum"), fp.get("sq_norm")) == (prev.get("sum"), prev.get("sq_norm"))
        if same and fp.get("ok") and prev.get("ok"):
            stale.append(n)
        prev = fp
    return {"steps": steps, "stale_steps": stale, "unfinished": unfinished,
            "valid": sum(1 for n, fp in steps.items() if fp.get("ok") and n not in stale)}


if __name__ == "__main__":
    print(json.dumps(check(sys.argv[1]), indent=1))
