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
            assert result[method] == {"pending_after": 1, "fences": 0, "finalized_by_shim": 0, "released": 0}, result
        else:  # the writer let go first; the save goes on writing (issue 22)
            assert result[method]["released"] == 1 and result[method]["finalized_by_shim"] == 0, (method, result)
            assert result[method]["pending_after"] == 1, (method, result)
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
    assert status["MegatronPolicyWorkerImpl.finalize_async_save"][0] == "applied"
    for method in COMMON[:2] + ["move_optimizer_cpu"]:  # released once, by the shim, left writing
        assert result[method]["released"] == 1 and result[method]["pending_after"] == 1, (method, result)
        assert result[method]["finalized_by_shim"] == 0, (method, result)
    assert "finalize_async_save" not in result["events"]  # main's blocking finalize was skipped in offloads


def test_main_before_3322_is_fenced_like_a_release():
    """main from #2828 to #3322 (83 commits) has finalize_async_save, but its refit offloads never call it: the
    shim must fence them (it once stepped aside on the method's mere presence, leaving the writer's memory held)."""
    methods = ["offload_before_refit", "offload_after_refit", "move_optimizer_cpu"]
    result = runner.run("nemo_rl_worker", {"shim": True, "methods": methods}, nvrx="0.6.0", doubles="main",
                        env={"NEMO_RL_DOUBLE_MAIN": "pre3322"}, timeout=120).result
    status = result["status"]
    assert status["MegatronPolicyWorkerImpl.offload_before_refit"] == ["applied", 1], status
    assert status["MegatronPolicyWorkerImpl.offload_after_refit"] == ["applied", 1], status
    for method in methods:  # the writer let go first, by the shim's fence; the save goes on writing
        assert result[method]["released"] == 1 and result[method]["pending_after"] == 1, (method, result)
        assert result[method]["finalized_by_shim"] == 0, (method, result)
    assert "finalize_async_save" not in result["events"]  # upstream's offloads do not call it, nor does the shim
