"""The no-save baseline of the e2e harness (issue 34) on the CPU, one orchestrator call: a run without
checkpoints (`nosave`: no checkpointer, no verifier) and a colo-shim run whose first two steps save
nothing and whose later steps do (`nosave=2`), with `verify=off` (no read-back, one checkpoint
kept). Every third step validates: the phased run's step 3 saves and validates, its ratio comes
from the steps without validation. report.py splits the phased run into a no-save row and a save
row of the same processes and divides the second's step by the first's."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
from e2e_harness import run_harness


def test_nosave_mode_and_a_no_save_phase_give_a_same_call_ratio(tmp_path):
    nosave, phased = run_harness(tmp_path, "nosave@0.7.0:2,shim@0.7.0:4:nosave=2:verify=off:threads=2", val_period=3)
    for run in (nosave, phased):
        assert "error" not in run, (run["name"], run.get("error"), run.get("log_tail"))
        assert all(s["wake_ok"] and s["refit_equal"] for s in run["steps"]), run["steps"]
    assert (nosave["name"], nosave["checkpointing"], nosave["shim"]) == ("nosave@0.7.0", False, False)
    assert [s["ckpt_on"] for s in nosave["steps"]] == [False] * 2
    assert not any(s.get("save_schedule_s") is not None or s.get("ckpt_equal") is not None for s in nosave["steps"])
    assert phased["name"] == "shim@0.7.0 nosave=2 verify=off threads=2" and phased["verify"] is False
    assert [s.get("save_threads") for s in phased["steps"]] == [None, None, 2, 2]  # NVRx's writer got two threads
    assert [s["ckpt_on"] for s in phased["steps"]] == [False, False, True, True]
    assert [s.get("save_schedule_s") is not None for s in phased["steps"]] == [False, False, True, True]
    assert "validation" in phased["steps"][2]["times"]  # a saving step validates as a no-save one would
    assert phased["steps"][3]["pending_saves_at_offload"] == 1  # step 3's save in flight at step 4's offload
    assert phased["steps"][3]["retention_s"] >= 0  # step 4's save dropped step 3's checkpoint, finalized
    assert all(s["ckpt_equal"] is None for s in phased["steps"])  # nothing read back
    assert set(phased["steps"][3]["host_rss_parts_gib"]) == {"trainer", "writer", "engine", "driver"}
    assert "made_ahead" in phased["trainer_offload"] and nosave["trainer_offload"] is None  # colo-shim's report
    from bench.e2e import report

    rows, runs = report.table([nosave, phased])
    names = [r["run"] for r in rows]
    assert names == ["nosave@0.7.0", "shim@0.7.0 nosave=2 verify=off threads=2 · steps 1-2",
                     "shim@0.7.0 nosave=2 verify=off threads=2"]
    alone, first, saving = rows
    assert first["step_plain_s"] == round(phased["steps"][1]["step_s"], 2)  # step 2: no save, no validation
    assert saving["step_plain_s"] == round(phased["steps"][3]["step_s"], 2)  # step 4: a save in flight, no validation
    # the same run's no-save steps, not the other run's (which has no colo-shim)
    assert saving["vs_nosave"] == round(saving["step_plain_s"] / first["step_plain_s"], 2) > 0
    assert alone["vs_nosave"] is None and first["vs_nosave"] is None  # no-save rows have no ratio
    assert "| shim@0.7.0 nosave=2 verify=off threads=2 · steps 1-2 |" in report.markdown([nosave, phased])
    assert "| tiny | " in report.compare.sweep_markdown(rows, runs)
