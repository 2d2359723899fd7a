"""NeMo-RL's Megatron policy worker (doubles of v0.3, v0.5, v0.7 and main) fences before offloads."""

import pytest

from nvrx_scenarios import runner

COMMON = ["offload_before_refit", "offload_after_refit", "move_model_cpu", "move_model_cuda",
          "prepare_for_lp_inference"]


@pytest.mark.parametrize("release", ("v0_3", "v0_5", "v0_7"))
def test_worker_offloads_fence_first(release):
    methods = COMMON + ([] if release == "v0_3" else ["move_optimizer_cpu"])
    result = runner.run("nemo_rl_worker", {"shim": True, "methods": methods}, nvrx="0.7.0", doubles=release,
                        timeout=120).result
    for method in methods:
        if method == "move_model_cuda":
            assert result[method] == {"pending_after": 1, "fences": 0, "finalized_by_shim": 0}, result
        else:
            assert result[method]["pending_after"] == 0 and result[method]["finalized_by_shim"] == 1, (method, result)
    applied = {k for k, (status, _) in result["status"].items() if status == "applied"}
    prefix = "MegatronPolicyWorkerImpl" if release == "v0_7" else "MegatronPolicyWorker.__ray_actor_class__"
    assert f"{prefix}.offload_before_refit" in applied


def test_main_with_finalize_async_save_runs_nothing_twice():
    methods = ["offload_before_refit", "offload_after_refit", "move_optimizer_cpu"]
    result = runner.run("nemo_rl_worker", {"shim": True, "methods": methods}, nvrx="0.7.0", doubles="main",
                        timeout=120).result
    status = result["status"]
    assert status["MegatronPolicyWorkerImpl.offload_before_refit"] == ["not-needed", 0]
    assert status["MegatronPolicyWorkerImpl.offload_after_refit"] == ["not-needed", 0]
    for method in ("offload_before_refit", "offload_after_refit"):  # upstream's own fence finalized it
        assert result[method]["pending_after"] == 0 and result[method]["finalized_by_shim"] == 0, result
    assert result["move_optimizer_cpu"]["pending_after"] == 0
    assert result["move_optimizer_cpu"]["finalized_by_shim"] == 1
    assert "finalize_async_save" in result["events"]
