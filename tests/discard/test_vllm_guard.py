"""The discarded-weights guard and the shim's fallbacks (one interpreter, v0.7 layout, vLLM 0.20).

NeMo-RL's prepare_for_generation swallows worker exceptions, so the tests check that the clear
error reaches the caller anyway, that it names the finish call site and the way out, and that
nothing generates on NaN weights; and that every failure of the shim's own logic keeps weights.
"""

from __future__ import annotations

import pytest

from harness.vllm_runs import dist_info, run_script

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def checks(tmp_path_factory):
    return run_script("vllm_guard_checks.py", "v0_7", dist_info(str(tmp_path_factory.mktemp("v")), "0.20.0"))


def _names_way_out(message: str, site_fragment: str):
    assert "COLO_SHIM_DISCARD=never" in message and "refit_pending=False" in message
    assert site_fragment in message


def test_full_wake_after_discard_raises_in_driver(checks):
    r = checks["full_wake_without_refit"]
    assert r["levels"] == [1, 2]
    assert r["prepare_error"]["type"] == "ColoShimDiscardError"
    _names_way_out(r["prepare_error"]["message"], "vllm_guard_checks.py:")
    assert "check_full_wake_without_refit" in r["prepare_error"]["message"]
    assert r["generate_error"]["type"] == "ColoShimDiscardError"
    assert r["asleep"] == ["kv_cache", "weights"]  # the engine was not woken on garbage
    assert r["nan_generations"] == 0


def test_generate_after_direct_level2_sleep_raises(checks):
    err = checks["generate_after_direct_level2"]["generate_error"]
    assert err["type"] == "ColoShimDiscardError" and "direct engine.sleep(level=2)" in err["message"]


def test_worker_sleep_accepts_level(checks):
    r = checks["worker_sleep_level_kwarg"]
    assert r["levels"] == [1, 2] and r["nan_generations"] == 0
    assert r["output"] == checks["shim_error_falls_back"]["output"]  # same weights, same tokens


def test_explicit_refit_pending_false_wins_over_always(checks):
    r = checks["explicit_false_beats_always"]
    assert [d["source"] for d in r["decisions"]] == ["mode", "explicit"]
    assert r["decisions"][1]["level"] == 1
    assert r["levels"] == [1, 1]  # first: coverage unknown, the worker keeps; second: explicit keep


def test_bad_mode_value_warns_once_and_uses_auto(checks):
    r = checks["bad_mode_value"]
    assert r["mode"] == "auto"
    assert len(r["warnings"]) == 1 and "auto, always, never" in r["warnings"][0]


def test_coverage_change(checks):
    r = checks["coverage_change"]
    assert r["error"]["type"] == "ColoShimDiscardError"
    assert "did not restore them" in r["error"]["message"]
    assert r["levels_after_change"] == [1, 1, 1, 1] and r["coverage"] == "changed"
    assert len(r["warnings"]) == 1


def test_model_that_does_not_report_loaded_names_keeps(checks):
    assert checks["unreported_coverage"] == {"levels": [1, 1], "coverage": "unreported"}


def test_shim_error_falls_back_to_level1(checks):
    r = checks["shim_error_falls_back"]
    assert r["levels"] == [1, 1] and r["nan_generations"] == 0


def test_noncolocated_is_untouched(checks):
    assert checks["noncolocated"] == {"ok": True, "levels": [], "finishes": {}}
