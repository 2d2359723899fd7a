"""The engine itself (vLLM's LLM and AsyncLLM, the double) in NeMo-RL's order, on vLLM 0.26 (issues 8, 9).

Measured on real vLLM 0.26 / H200 (bench/results/discard_real_vllm.json): the level-1 backup
stays pinned after the wake-up, so colo-shim's discards freed nothing until the shim returned it
before each level-2 sleep. The double's pinned host cache behaves like torch's (blocks cached
until torch._C._host_emptyCache()). Each run is a fresh interpreter (tests/discard/vllm_engine_order.py).
"""

from __future__ import annotations

import pytest

from harness.vllm_runs import dist_info, run_script

pytestmark = pytest.mark.timeout(240)

RUNS = {
    "l1": {"mode": "l1"},
    "l2": {"mode": "l2"},
    "shim": {"mode": "shim"},
    "shim_async": {"mode": "shim", "api": "async"},
    "spec_l1": {"mode": "l1", "speculative": True},
    "spec_shim": {"mode": "shim", "speculative": True},
    "broken_release": {"mode": "shim", "break_release": True},
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    vdir = dist_info(str(tmp_path_factory.mktemp("vllm")), "0.26.0")
    return {name: run_script("vllm_engine_order.py", "v0_7", vdir, args) for name, args in RUNS.items()}


@pytest.mark.parametrize("name", ["shim", "shim_async"])
def test_discarding_finishes_hold_no_more_pinned_memory_than_level2_only(runs, name):
    shim, l1, l2 = runs[name]["finishes"], runs["l1"]["finishes"], runs["l2"]["finishes"]
    assert [f["kind"] for f in shim] == [f["kind"] for f in l2]
    assert [f["level"] for f in shim] == [1, 2, 2, 2, 1, 2, 2, 2, 1]  # setup: coverage not learned yet
    backup = l1[0]["pinned"]
    assert backup > 0 and all(f["pinned"] == backup for f in l1)  # level 1 keeps its backup cached
    for mine, ref in zip(shim, l2):
        if mine["level"] == 2:
            assert mine["pinned"] <= ref["pinned"], f"{mine['kind']}: level-1 backup still pinned"
        else:
            assert mine["pinned"] == backup  # keeping finishes keep, as level 1 does


def test_status_reports_what_was_returned(runs):
    shim = runs["shim"]
    rows = shim["finishes"]
    expected = sum(prev["pinned"] for prev, cur in zip(rows, rows[1:]) if prev["level"] == 1 and cur["level"] == 2)
    report = shim["host_memory"]
    assert report["released_bytes"] == expected > 0
    assert report["releases"] == 2 and report["errors"] == 0 and report["unsupported"] == 0
    assert report["release_seconds"] >= 0


@pytest.mark.parametrize("name", ["shim", "shim_async"])
def test_refit_post_processing_wins_over_the_shims_copy(runs, name):
    """Issue 8.3: qkv_scale is recomputed by the refit's process_weights_after_loading; the shim's
    CPU copy taken before the sleep must not overwrite the fresh value."""
    eng = runs[name]["engine"]
    assert {"model.layers.0.qkv_scale", "model.layers.1.qkv_scale"} <= set(eng["uncovered_names"])
    assert {h["preserve_mode"] for h in eng["history"] if h["level"] == 2} == {"shim-cpu-copy"}
    assert runs[name]["outputs"] == runs["l1"]["outputs"], "stale derived tensors changed the tokens"
    assert runs[name]["nan_generations"] == 0


def test_drafter_outside_the_model_is_kept(runs):
    """Issue 8.5: vLLM's drafter is model_runner.drafter.model; level 2 destroys it with the rest."""
    shim = runs["spec_shim"]
    assert [f["level"] for f in shim["finishes"]].count(2) == 6
    assert shim["nan_generations"] == 0, "generated with a destroyed drafter"
    assert shim["outputs"] == runs["spec_l1"]["outputs"]
    names = set(shim["engine"]["uncovered_names"])
    assert {"drafter:head.weight", "drafter:logit_scale"} <= names  # its buffer too: vLLM saves only the model's


def test_a_failing_release_never_stops_the_sleep(runs):
    broken = runs["broken_release"]
    assert [f["level"] for f in broken["finishes"]] == [f["level"] for f in runs["shim"]["finishes"]]
    assert broken["outputs"] == runs["l1"]["outputs"]
    assert broken["host_memory"]["errors"] == 6 and broken["host_memory"]["released_bytes"] == 0
    assert len([w for w in broken["warnings"] if "pinned host memory" in w]) == 1  # once per engine

