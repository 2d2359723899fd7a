"""Issue 32 item 3 for the vllm family: a fault in colo-shim's own step inside a driver wrapper never
reaches the host and never keeps upstream's own call from running (core/guard.py); status counts it;
COLO_SHIM_STRICT=1 raises it. Real subprocess on the v0.7 layout and the vLLM engine double
(vllm_fault_checks.py)."""

from __future__ import annotations

import pytest

from harness.vllm_runs import dist_info, run_script

pytestmark = pytest.mark.timeout(180)

FAULTS = {  # the injected step -> the name status() counts it under (the family's "vllm:" prefix)
    "decide": "vllm: finish_generation sleep-level decision",
    "record": "vllm: recording a finish_generation decision",
    "note_refit": "vllm: noting a refit",
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    return run_script("vllm_fault_checks.py", "v0_7", dist_info(str(root), "0.20.0"),
                      extra_env={"NRL_DOUBLE_REFIT_PATH": str(root / "refit.pt")})


def test_baseline_without_a_fault(runs):
    base = runs["none"]
    assert base["escaped"] is None and base["result"] is True and base["upstream_calls"] == 1, base
    assert base["levels"] == [1] and base["shim_errors"] == {}, base


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_shim_fault_is_contained_and_upstream_runs_once(runs, fault):
    """Before: decide's error was swallowed by the wrapper's own except (status showed nothing, strict
    mode did not raise); record's escaped finish_generation before upstream's sleep ran; note_refit's
    escaped the refit after upstream's update."""
    seen = runs[fault]
    assert seen["escaped"] is None, seen
    assert seen["upstream_calls"] == 1, seen
    if fault == "note_refit":
        assert seen["result"] == [True] and seen["levels"] == [], seen
    else:  # what finish_generation returns without a fault; the weights kept (level 1)
        assert seen["result"] == runs["none"]["result"] and seen["levels"] == [1], seen
    assert seen["shim_errors"] == {FAULTS[fault]: 1}, seen


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_strict_mode_raises_the_shim_fault(runs, fault):
    seen = runs[f"{fault}_strict"]
    assert seen["escaped"] == {"type": "RuntimeError", "message": "injected fault in colo-shim's own step"}, seen
    assert seen["shim_errors"] == {}, seen
