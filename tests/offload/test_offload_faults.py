"""Issue 32 item 3 for the offload family: a fault in colo-shim's own step inside a megatron-core entry
point never reaches the host and never keeps megatron-core's own body from running once (core/guard.py);
status counts it; COLO_SHIM_STRICT=1 raises it. Real megatron-core 0.19.2 in a child (fault_child.py)."""

import json
import os

import pytest

from helpers import deps_dir, doubles_path, run_python

HERE = os.path.dirname(os.path.abspath(__file__))
WHERE = {"settle": "offload_to_cpu", "bug_in_copy": "offload_to_cpu", "restore": "restore_from_cpu"}
MESSAGE = "injected fault in colo-shim's own step"


@pytest.fixture(scope="module")
def runs():
    proc = run_python(os.path.join(HERE, "fault_child.py"), timeout=240,
                      pythonpath=(HERE, deps_dir("mcore", "0.19.2"), *doubles_path("v0_7")))
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _ran_as_upstream(seen):
    assert seen["escaped"] is None and seen["result"] is None, seen  # offload_to_cpu / restore_from_cpu: None
    assert seen["upstream_runs"] == seen["chained"] > 0, seen  # megatron-core's body once per chained optimizer
    assert seen["where_upstream_puts_them"] and seen["equal"], seen


def test_baseline_without_a_fault(runs):
    _ran_as_upstream(runs["none"])
    assert runs["none"]["shim_errors"] == {} and runs["none"]["fallbacks"] == 0, runs["none"]


@pytest.mark.parametrize("fault", sorted(WHERE))
def test_a_shim_fault_is_contained_and_megatrons_body_runs_once(runs, fault):
    """Before: settle's and restore's errors escaped the entry point and megatron-core's body never ran;
    a bug in the copy (a TypeError) was counted as a mirrors fallback and never shown as a shim error."""
    seen = runs[fault]
    _ran_as_upstream(seen)
    # contained at ChainedOptimizer's entry, then again at each chained MegatronOptimizer's (also an entry point)
    assert seen["shim_errors"] == {f"offload: mirrors at ChainedOptimizer.{WHERE[fault]}": 1,
                                   f"offload: mirrors at MegatronOptimizer.{WHERE[fault]}": seen["chained"]}, seen
    assert seen["fallbacks"] == 0, seen  # a shim bug is not a fallback the mirrors chose


@pytest.mark.parametrize("fault", sorted(WHERE))
def test_strict_mode_raises_the_shim_fault(runs, fault):
    seen = runs[f"{fault}_strict"]
    assert seen["escaped"] is not None and seen["escaped"]["message"] == MESSAGE, seen
    assert seen["shim_errors"] == {}, seen


NEMO = "offload: mirrors at nemo_rl MegatronPolicyWorkerImpl.move_optimizer"


@pytest.mark.parametrize("fault", sorted(WHERE))
def test_a_shim_fault_in_nemo_rls_move_optimizer_is_contained_and_its_body_runs_once(runs, fault):
    """NeMo-RL's own entry point (v0.7 layout double of MegatronPolicyWorkerImpl.move_optimizer): the
    worker's body moves the Adam state itself, once, with its values."""
    seen = runs[f"nemo_rl:{fault}"]
    assert seen["escaped"] is None and seen["result"] is None and seen["upstream_runs"] == 1, seen
    assert seen["where_upstream_puts_them"] and seen["equal"], seen
    assert seen["shim_errors"] == {NEMO: 1} and seen["fallbacks"] == 0, seen
    strict = runs[f"nemo_rl:{fault}_strict"]
    assert strict["escaped"] is not None and strict["escaped"]["message"] == MESSAGE, strict


def test_a_shim_fault_at_a_ddp_buffers_first_offload_leaves_megatrons_own_copy(runs):
    """The buffer's first offload_to_cpu, where colo-shim hands it a page-locked param_data_cpu: when
    making that copy raises, megatron-core's body makes its own and frees the device storage."""
    seen = runs["buffer:buffer_mirror"]
    assert seen["escaped"] is None and seen["result"] is None, seen
    assert seen["where_upstream_puts_them"] and seen["equal"], seen
    assert seen["shim_errors"] == {"offload: mirrors at _ParamAndGradBuffer.offload_to_cpu": seen["buffers"]}, seen
    strict = runs["buffer:buffer_mirror_strict"]
    assert strict["escaped"] is not None and strict["escaped"]["message"] == MESSAGE, strict
