"""Every real patch family through the shared ordering harness, against the real libraries.

The expected set is what importing the targets first yields; every other ordering (shim first,
a sibling submodule first, install twice, uninstall and re-install) must apply exactly the same
targets, each wrapped once, and uninstall must restore every original object.
"""

import pytest

from helpers import deps_dir, doubles_path
from ordering import ORDERINGS, check_orderings, run_orderings

NVRX = "nvidia_resiliency_ext.checkpointing.async_ckpt"
MCORE = "megatron.core"
FAMILIES = {
    "nvrx-0.7.0": dict(
        patches=["nvrx"], path=lambda: (deps_dir("nvrx", "0.7.0"),),
        modules=[f"{NVRX}.core", f"{NVRX}.filesystem_async"], first=[f"{NVRX}.state_dict_saver"],
        must=[f"{NVRX}.core:AsyncCallsQueue.close"]),
    "megatron-0.19.2": dict(
        patches=["megatron"], path=lambda: (deps_dir("mcore", "0.19.2"),),
        modules=[f"{MCORE}.distributed.param_and_grad_buffer", f"{MCORE}.optimizer.optimizer"],
        first=[f"{MCORE}.distributed"],
        must=[f"{MCORE}.optimizer.optimizer:MegatronOptimizer.offload_to_cpu"]),
    "vllm-nemo_rl-v0.7": dict(
        patches=["vllm"], path=lambda: doubles_path("v0_7"),
        modules=["nemo_rl.models.generation.vllm.vllm_generation"], first=["nemo_rl.models.generation.vllm"],
        must=["nemo_rl.models.generation.vllm.vllm_generation:VllmGeneration.finish_generation"]),
}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_orderings(name):
    spec = FAMILIES[name]
    path = spec["path"]()
    results = run_orderings((*ORDERINGS, "uninstall"), spec["patches"], spec["modules"], first=spec["first"],
                            pythonpath=path)
    baseline = results["target-first"]
    applied = {t for t, s in baseline["status"].items() if s == "applied"}
    assert set(spec["must"]) <= applied, baseline
    assert "failed" not in baseline["status"].values(), baseline
    check_orderings(spec["patches"], spec["modules"], expected_applied=applied, results=results,
                    orderings=("shim-first", "submodule-first", "install-twice", "reinstall"))
