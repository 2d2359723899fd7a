"""Subprocess driver: every wrapper of the `vllm` family hands the caller's keywords to upstream (issue 8 item 8).

NeMo-RL main calls `finish_generation(release_gpu=...)` (PR #2884) and vLLM >= 0.17 has
`sleep(level, mode=...)`. Before colo-shim is installed, each method it wraps is replaced by a
recorder that notes the keywords it receives and calls the double's own method without the
ones the double does not know (the doubles keep older signatures); colo-shim then wraps the
recorders, so what a recorder saw is what upstream would have received through the shim.
main layout, inline workers, vLLM 0.25.1 metadata; tests/discard/test_vllm_keywords.py asserts
on the JSON this prints.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _vllm_support as sup  # noqa: E402

os.environ.setdefault("NRL_DOUBLE_REFIT_PATH", tempfile.mktemp(prefix="refit-"))

import torch  # noqa: E402
import vllm  # noqa: E402  (the engine double)
from vllm.entrypoints.llm import LLM  # noqa: E402

from nemo_rl.algorithms import grpo  # noqa: E402
from nemo_rl.distributed.virtual_cluster import RayVirtualCluster  # noqa: E402
from nemo_rl.models.generation.vllm import VllmGeneration  # noqa: E402

SEEN: list[tuple[str, list[str]]] = []
UNKNOWN = {"release_gpu", "mode", "colo_test_extra"}  # keywords the doubles' signatures lack


def record(cls, name: str) -> None:
    original = cls.__dict__[name]
    label = f"{cls.__name__}.{name}"
    if inspect.iscoroutinefunction(original):
        async def recorder(self, *args, **kwargs):
            SEEN.append((label, sorted(kwargs)))
            return await original(self, *args, **{k: v for k, v in kwargs.items() if k not in UNKNOWN})
    else:
        def recorder(self, *args, **kwargs):
            SEEN.append((label, sorted(kwargs)))
            return original(self, *args, **{k: v for k, v in kwargs.items() if k not in UNKNOWN})
    setattr(cls, name, functools.wraps(original)(recorder))


for cls, names in ((VllmGeneration, ("finish_generation", "prepare_for_generation", "update_weights_via_ipc_zmq")),
                   (LLM, ("sleep", "wake_up", "generate", "collective_rpc"))):
    for name in names:
        record(cls, name)

import colo_shim  # noqa: E402

colo_shim.install(["vllm"])


def seen_since(start: int, label: str) -> list[list[str]]:
    return [kw for name, kw in SEEN[start:] if name == label]


def main() -> dict:
    torch.manual_seed(0)
    policy = sup.PolicyDouble(os.environ["NRL_DOUBLE_REFIT_PATH"])
    mc = grpo.MasterConfig(**sup.master_config())
    pg = grpo.setup(mc, RayVirtualCluster([1]))
    llm = pg.worker_group.workers[0].llm
    out = {}
    start = len(SEEN)
    pg.finish_generation(release_gpu=False)
    out["finish_release_gpu"] = seen_since(start, "VllmGeneration.finish_generation")
    start = len(SEEN)
    pg.finish_generation(refit_pending=True, release_gpu=True)  # colo-shim's own keyword is its alone
    out["finish_refit_pending"] = seen_since(start, "VllmGeneration.finish_generation")
    start = len(SEEN)
    pg.prepare_for_generation(tags=["weights"], colo_test_extra=1)
    policy.stream_weights_via_ipc_zmq()
    pg.worker_group.get_all_worker_results(pg.update_weights_via_ipc_zmq())
    pg.prepare_for_generation(tags=["kv_cache"], colo_test_extra=1)
    out["prepare"] = seen_since(start, "VllmGeneration.prepare_for_generation")
    start = len(SEEN)
    llm.sleep(level=1, mode="abort")
    llm.wake_up(tags=None)
    llm.generate([{"prompt_token_ids": [1, 2]}], sampling_params=vllm.SamplingParams(temperature=0.0, max_tokens=2),
                 use_tqdm=False)
    llm.collective_rpc("report_device_id", timeout=None, args=(), kwargs=None)
    out["engine"] = {name: seen_since(start, f"LLM.{name}")
                     for name in ("sleep", "wake_up", "generate", "collective_rpc")}
    out["wrapped_by_shim"] = sorted(
        name for name in ("finish_generation", "prepare_for_generation", "update_weights_via_ipc_zmq")
        if hasattr(inspect.getattr_static(VllmGeneration, name), "__wrapped__"))
    return out


if __name__ == "__main__":
    print("RESULT " + json.dumps(main()))
