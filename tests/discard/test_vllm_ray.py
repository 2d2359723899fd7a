"""Real processes: driver, SyncRolloutActor and vLLM generation worker are three Ray actors/processes.

Activation is zero-code: the bootstrap directory first on PYTHONPATH and COLO_SHIM=vllm, which
the Ray actors inherit through runtime_env env_vars as NeMo-RL passes them. grpo_sync's rollout
finish runs in the SyncRolloutActor, the validation finishes in the driver, the sleeps in the
worker: the engine must discard exactly after the actor's rollout finishes and keep after the
driver's validation finishes, with tokens identical to the in-process level-1 run.
"""

from __future__ import annotations

import pytest

from harness.vllm_runs import dist_info, run_script
from vllm_testlib import sleeps

pytestmark = pytest.mark.timeout(300)


def test_grpo_sync_across_ray_processes(tmp_path):
    res = run_script("vllm_scenarios.py", "v0_7", dist_info(str(tmp_path), "0.20.0"),
                     {"loops": ["grpo_sync"], "steps": 6, "val_period": 3, "ray": True},
                     timeout=280, bootstrap=True, extra_env={"COLO_SHIM": "vllm"})
    base, shim = res["baseline:grpo_sync"], res["shim:grpo_sync"]
    assert shim["outputs"] == base["outputs"]
    stats = shim["stats"][0]
    assert stats["nan_generations"] == 0
    seq = sleeps(stats["events"])
    assert seq[0] == (1, "refit")
    assert all(level == 2 for level, kind in seq[1:] if kind == "refit"), seq
    assert all(kind in ("refit", "end") for level, kind in seq if level == 2), seq
    assert sum(level == 2 for level, _ in seq) == 6
    # who decided what, per process
    assert shim["driver"]["finishes"] == {"discard": 1, "keep": 3}  # setup + val_at_start + 2 validations
    actor = [s for s in shim["actor_shim"] if s["name"] == "vllm"][0]["details"]
    assert actor["finishes"] == {"discard": 6}
    assert set(actor["reasons"]) == {"grpo_sync_actor rollout finish: the training step's refit rewrites the weights"}
    assert stats["engine_shim"]["sleeps"] == {"level1": 4, "level2": 6}
    assert base["stats"][0]["engine_shim"] is None  # COLO_SHIM=0 in the baseline's worker
