"""The colocated e2e harness (bench/e2e/run.py) on the CPU, so it cannot rot between GPU runs.

Same code path as the H200 runs: the orchestrator starts a fresh driver in its own session, the
driver runs the site package's grpo_train (NeMo-RL main's module layout), which spawns the trainer
actor (real megatron-core 0.19.2 GPTModel in megatron DDP, real NVRx 0.7.0 async cached saves,
gloo) and the engine actor; the refit is the real ZMQ stream into the engine's worker extension.
Only the generation side is a fake (no vLLM on CPU: E2E_FAKE_ENGINE, bench/e2e/fake_engine.py), and
megatron's distributed optimizer, which allocates on "cuda" unconditionally, is a torch Adam.
colo-shim is on (COLO_SHIM=1, default release), so its driver-side vllm family decides every finish from
the site's frames, as it would in NeMo-RL.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
from e2e_harness import run_harness as _harness

STEP_KEYS = {"wake_ok": bool, "held_gib": float, "offloaded_gib": float, "host_peak_gib": float,
             "pinned_after_finish_gib": float, "level1_backup_gib": float, "discarded": bool,
             "ckpt_equal": bool, "refit_equal": bool, "step_s": float, "offload_wait_s": float}


def test_harness_runs_steps_and_verifies_checkpoints(tmp_path):
    report = _harness(tmp_path, "shim@0.7.0:3")
    (run,) = report
    assert "error" not in run, (run.get("error"), run.get("log_tail"))
    assert {k: run[k] for k in ("name", "nvrx", "shim", "release")} == {
        "name": "shim@0.7.0", "nvrx": "0.7.0", "shim": True, "release": "inplace (default)"}
    assert "vllm" in run and [s["step"] for s in run["steps"]] == [1, 2, 3]
    assert run["ranks"] == 1 and not any("per_rank" in s for s in run["steps"])  # one rank: the record as before
    for step in run["steps"]:
        for key, typ in STEP_KEYS.items():
            assert isinstance(step[key], typ) or (typ is float and isinstance(step[key], int)), (key, step)
        assert step["wake_ok"] and step["refit_equal"], step
        assert step["ckpt_equal"] is True, step.get("ckpt")  # every save read back equal to its step's state
        assert step["ckpt"]["tensors"] > 0 and step["ckpt"]["mismatched"] == 0
    assert [len(s["refits"]) for s in run["steps"]] == [1, 2, 1]  # step 2 refits again for validation
    assert run["steps"][1]["pending_saves_at_offload"] == 1  # step 1's save still in flight at step 2's offload
    # colo-shim's driver decided each finish from the site's frames as it would in NeMo-RL
    recent = run["driver_shim"]["VllmGeneration.finish_generation"]["details"]["recent"]
    assert [d["loop"] for d in recent] == ["setup", "grpo", "grpo", "", "grpo"]
    assert [d["level"] for d in recent] == [2, 2, 2, 1, 2]
    assert "after validate()" in recent[3]["reason"]
    from bench.e2e import report as rep

    table = rep.markdown(report)
    assert f"| shim@0.7.0 | {run['vllm']} | 3 | 0 |" in table and "3/3" in table


def test_main_layout_worker_reaches_the_main_async_patch(tmp_path):
    """main3322_stage: the site's MegatronPolicyWorkerImpl has NeMo-RL main's finalize_async_save,
    called first in both offloads; colo-shim's main-async patch wraps it, and the checkpoints that
    main's own finalize path completes still equal their steps. The mode named after the retired
    stage release still runs, as the default release that COLO_SHIM_NVRX_RELEASE=stage now is."""
    (run,) = _harness(tmp_path, "main3322_stage@0.7.0:2")
    assert "error" not in run, (run.get("error"), run.get("log_tail"))
    assert run["worker"] == "main" and run["release"] == "stage (retired: runs as inplace)"
    assert run["env"]["COLO_SHIM_NVRX_RELEASE"] == "stage"
    assert [s["ckpt_equal"] for s in run["steps"]] == [True, True]
    calls = run["trainer_shim"]["MegatronPolicyWorkerImpl.finalize_async_save"]
    # three refits (step 2 also validates), two offloads each
    assert calls["status"] == "applied" and calls["calls"] == 6


def test_main_checkpointer_call_in_both_orders_and_checkpoints_on_disk(tmp_path):
    """Issue 22: main's worker with the default release; main's checkpointer-thread call of
    finalize_async_save reaches the trainer before or after the next offload_before_refit (one run
    each), and a run whose checkpoints go to the disk instead of /dev/shm. One orchestrator call."""
    before, after, disk = _harness(tmp_path, "main3322_shim@0.7.0:2:order=before,main3322_shim@0.7.0:2:order=after,"
                                             "shim@0.7.0:2:ckpt=disk")
    for run in (before, after, disk):
        assert "error" not in run, (run["name"], run.get("error"), run.get("log_tail"))
        assert [s["ckpt_equal"] for s in run["steps"]] == [True, True], run["name"]
        parts = run["steps"][1]["offload_parts"]
        assert {"before.fence", "before.grads", "before.optimizer", "before.empty_cache"} <= set(parts), parts
    assert (before["name"], after["name"], disk["name"]) == (
        "main3322_shim@0.7.0 order=before", "main3322_shim@0.7.0 order=after", "shim@0.7.0 disk")
    assert disk["ckpt_medium"] == "disk" and before["ckpt_medium"] == "shm"
    # step 1 saves; step 2's refit offload meets it: the waiting call came before / after that offload
    assert before["steps"][0]["trainer_calls"][-2:] == ["save_checkpoint", "finalize_async_save (checkpointer)"]
    calls = after["steps"][1]["trainer_calls"]
    assert calls[:2] == ["offload_before_refit", "finalize_async_save (checkpointer)"], calls
    for run in (before, after):
        assert run["main_finalize_order"] in ("before", "after")
        stats = run["trainer_shim"]["MegatronPolicyWorkerImpl.finalize_async_save"]
        assert stats["status"] == "applied", stats
        assert all(isinstance(s.get("main_finalize_s"), float) for s in run["steps"] if s.get("trainer_calls")
                   and "finalize_async_save (checkpointer)" in s["trainer_calls"]), run["steps"]
