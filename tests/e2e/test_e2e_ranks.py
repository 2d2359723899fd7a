"""The e2e harness with two trainer ranks on the CPU (issue 25): two gloo ranks of real
megatron-core 0.19.2 in data parallelism, each with its own NVRx 0.7.0 writer, and a fake engine of
two workers, each refitted from the rank on its "GPU". Every process group has a finite timeout
(E2E_DIST_TIMEOUT_S), so a collective one rank enters and the other never does ends the run with
an error instead of a hang: a run that finishes its steps left none unmatched.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
from e2e_harness import run_harness

TIMEOUT = {"E2E_DIST_TIMEOUT_S": "60"}
DECISIONS = ("fences", "finalized", "released", "timeouts", "release_fallbacks")


def _decisions(shim: dict) -> dict:
    """What one rank's colo-shim decided and how often the job's collective finalize ran there."""
    return {"fence": {k: shim["fence"].get(k) for k in DECISIONS},
            "calls": {k: v["calls"] for k, v in shim.items() if k != "fence"}}


def _one_decision(run):
    per_rank = run["trainer_shim_per_rank"]
    assert len(per_rank) == 2 and _decisions(per_rank[0]) == _decisions(per_rank[1]), per_rank


def test_default_with_two_ranks_checkpoints_and_refits_equal_on_every_rank(tmp_path):
    (run,) = run_harness(tmp_path, "shim@0.7.0:3:ranks=2", **TIMEOUT)
    assert "error" not in run, (run.get("error"), run.get("log_tail"))
    assert run["name"] == "shim@0.7.0 ranks=2" and run["ranks"] == 2 and run["env"]["E2E_DIST_TIMEOUT_S"] == "60"
    assert [s["step"] for s in run["steps"]] == [1, 2, 3]
    for step in run["steps"]:
        assert step["ckpt_equal"] is True and step["refit_equal"] is True, step
        assert [r["equal"] for r in step["ckpt"]["ranks"]] == [True, True]  # each rank's state, read back
        assert all(refit["workers_equal"] == [True, True] for refit in step["refits"]), step["refits"]
        rows = step["per_rank"]
        assert [r["rank"] for r in rows] == [0, 1]
        for row in rows:
            assert row["ckpt_equal"] is True and row["refit_equal"] is True, row
            assert row["held_gib"] == 0.0 and row["held_pct"] in (0.0, None) and row["offloaded_gib"] >= 0, row
            assert row["pinned_after_finish_gib"] == 0.0 and 0 <= row["offload_wait_s"] <= step["offload_wait_s"], row
    assert [len(s["refits"]) for s in run["steps"]] == [1, 2, 1]
    assert run["steps"][1]["pending_saves_at_offload"] == 1  # a save in flight at the offload, on a rank
    _one_decision(run)
    recent = run["driver_shim"]["VllmGeneration.finish_generation"]["details"]["recent"]
    assert [d["level"] for d in recent] == [2, 2, 2, 1, 2]  # level 2: the fake workers drop their weights; the refits after it equal
    from bench.e2e import report

    table = report.markdown([run])
    assert f"| shim@0.7.0 ranks=2 | {run['vllm']} | 3 | 0 | 2 |" in table
    assert [r["ckpt_equal"] for r in report.per_rank(run)] == ["3/3", "3/3"]
    assert "| shim@0.7.0 ranks=2 | 1 | 0.00 | 0.00 | 3/3 | 3/3 |" in report.ranks_markdown([run])


def test_main_worker_with_two_ranks_in_both_orders_makes_one_decision(tmp_path):
    """NeMo-RL main's worker: its checkpointer-thread finalize_async_save reaches both ranks after
    (or before) the next offload_before_refit, whose own finalize is a collective too."""
    after, before = run_harness(tmp_path, "main3322_shim@0.7.0:2:order=after:ranks=2,"
                                          "main3322_shim@0.7.0:2:order=before:ranks=2", **TIMEOUT)
    for run in (after, before):
        assert "error" not in run, (run["name"], run.get("error"), run.get("log_tail"))
        assert run["ranks"] == 2 and [s["step"] for s in run["steps"]] == [1, 2]
        for step in run["steps"]:
            assert [r["ckpt_equal"] for r in step["per_rank"]] == [True, True], step.get("ckpt")
        _one_decision(run)
        calls = run["trainer_shim_per_rank"][0]["MegatronPolicyWorkerImpl.finalize_async_save"]
        assert calls["status"] == "applied" and calls["calls"] >= 7, calls
    assert after["steps"][1]["trainer_calls"][:2] == ["offload_before_refit", "finalize_async_save (checkpointer)"]
    assert before["steps"][0]["trainer_calls"][-2:] == ["save_checkpoint", "finalize_async_save (checkpointer)"]
    for run, step in ((after, 1), (before, 0)):  # main's waiting call was timed where it met the save
        assert isinstance(run["steps"][step]["main_finalize_s"], float)
