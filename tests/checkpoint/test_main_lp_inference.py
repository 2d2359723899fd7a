"""Issue 8 item 8: on NeMo-RL main, `prepare_for_lp_inference` moves the optimizer to the CPU
without `finalize_async_save` (PR #3322 added it to the two refit offloads only), so the shim's
fence must run there: the target is `applied`, never `not-needed`, next to main's own finalize."""

from nvrx_scenarios import runner


def test_main_prepare_for_lp_inference_is_fenced_by_the_shim():
    result = runner.run("nemo_rl_worker", {"shim": True, "methods": ["prepare_for_lp_inference", "offload_before_refit"]},
                        nvrx="0.7.0", doubles="main", timeout=150).result
    status = result["status"]
    assert status["MegatronPolicyWorkerImpl.prepare_for_lp_inference"][0] == "applied", status
    assert status["MegatronPolicyWorkerImpl.offload_before_refit"][0] == "not-needed", status
    assert result["prepare_for_lp_inference"]["released"] == 1  # nothing upstream released it
    assert result["offload_before_refit"]["released"] == 1  # in main's finalize_async_save, by the shim
