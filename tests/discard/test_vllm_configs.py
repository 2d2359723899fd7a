"""DAPO and PPO decisions from every config type NeMo-RL uses (issue 8 item 2).

v0.7.0's sections are dicts; on main (PR #2518) `master_config` is `MasterConfig(**config)` and
its `grpo` / `ppo` sections are pydantic models read by attribute. Reading only dicts made main's
`use_dynamic_sampling` look false: the rollout finish discarded, the incomplete batch generated
again without a refit and the guard raised. Each layout runs its loops twice in its own
interpreter: always level 1 (baseline) and with colo-shim; grpo_sync through real Ray actors
(the rollout finish runs in the SyncRolloutActor, from the pickled config).
"""

from __future__ import annotations

import pytest

from harness.vllm_runs import dist_info, run_script
from vllm_testlib import sleeps

pytestmark = pytest.mark.timeout(300)

DAPO = ("DAPO dynamic sampling: batch completeness is decided after this finish; an incomplete batch generates again "
        "without a refit")
LAYOUTS = {"v0_7": ("0.20.0", "Config", {"grpo": "dict", "ppo": "dict"}),
           "main": ("0.25.1", "MasterConfig", {"grpo": "GRPOConfig", "ppo": "PPOConfig"})}


def _same_tokens_no_nan(res: dict, loop: str) -> dict:
    base, shim = res[f"baseline:{loop}"], res[f"shim:{loop}"]
    assert shim["outputs"] == base["outputs"], f"{loop}: tokens differ from the always-level-1 run"
    stats = shim["stats"][0]
    assert stats["nan_generations"] == 0
    seq = sleeps(stats["events"])
    assert all(kind in ("refit", "end") for level, kind in seq if level >= 2), f"{loop}: discarded without refit: {seq}"
    return shim


def _types(res: dict, loop: str, layout: str, algo: str):
    _, config_type, sections = LAYOUTS[layout]
    shim = res[f"shim:{loop}"]
    assert (shim["config_type"], shim["section_type"]) == (config_type, sections[algo])


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def inline(request, tmp_path_factory):
    layout = request.param
    res = run_script("vllm_scenarios.py", layout, dist_info(str(tmp_path_factory.mktemp("v")), LAYOUTS[layout][0]),
                     {"loops": ["grpo", "dapo", "ppo", "ppo_dapo"], "steps": 6, "val_period": 3})
    return layout, res


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def through_ray(request, tmp_path_factory):
    layout = request.param
    res = run_script("vllm_scenarios.py", layout, dist_info(str(tmp_path_factory.mktemp("v")), LAYOUTS[layout][0]),
                     {"loops": ["grpo_sync", "grpo_sync_dapo"], "steps": 8, "val_period": 4, "ray": True},
                     timeout=280, bootstrap=True, extra_env={"COLO_SHIM": "vllm"})
    return layout, res


def test_grpo_dapo_keeps_and_plain_grpo_discards(inline):
    layout, res = inline
    _types(res, "dapo", layout, "grpo")
    dapo = _same_tokens_no_nan(res, "dapo")
    assert all(level == 1 for level, _ in sleeps(dapo["stats"][0]["events"]))
    rollouts = len(dapo["outputs"]) - 3  # minus validations
    assert rollouts > dapo["train_calls"], "no incomplete DAPO batch happened; the test lost its point"
    assert dapo["driver"]["reasons"][DAPO] == rollouts
    grpo = _same_tokens_no_nan(res, "grpo")
    assert sum(level == 2 for level, _ in sleeps(grpo["stats"][0]["events"])) == 6  # every rollout finish


def test_ppo_reads_dynamic_sampling_and_warmup(inline):
    layout, res = inline
    _types(res, "ppo", layout, "ppo")
    ppo = _same_tokens_no_nan(res, "ppo")
    reasons = ppo["driver"]["reasons"]
    assert reasons["PPO critic warm-up: the policy is not trained, no refit follows"] == 3
    assert reasons["ppo rollout finish: the training step's refit rewrites the weights"] == 3
    ppo_dapo = _same_tokens_no_nan(res, "ppo_dapo")
    assert all(level == 1 for level, _ in sleeps(ppo_dapo["stats"][0]["events"]))
    assert ppo_dapo["driver"]["reasons"][DAPO] == 6


def test_grpo_sync_actor_reads_the_pickled_config(through_ray):
    layout, res = through_ray
    _types(res, "grpo_sync_dapo", layout, "grpo")
    actor = {loop: [s for s in res[f"shim:{loop}"]["actor_shim"] if s["name"] == "vllm"][0]["details"]
             for loop in ("grpo_sync", "grpo_sync_dapo")}
    plain = _same_tokens_no_nan(res, "grpo_sync")
    assert actor["grpo_sync"]["finishes"] == {"discard": 8}
    assert sum(level == 2 for level, _ in sleeps(plain["stats"][0]["events"])) == 8
    dapo = _same_tokens_no_nan(res, "grpo_sync_dapo")
    assert all(level == 1 for level, _ in sleeps(dapo["stats"][0]["events"]))
    rollouts = actor["grpo_sync_dapo"]["finishes"]["keep"]
    assert set(actor["grpo_sync_dapo"]["reasons"]) == {DAPO}
    assert rollouts > dapo["train_calls"], "no incomplete DAPO batch happened; the test lost its point"
