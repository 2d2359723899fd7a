"""Failures surface as errors, never as hangs, and write errors look as they do without the shim."""

import time

import pytest

from helpers import deps_dir, last_json, run_python
from nvrx_scenarios import runner


def test_dead_worker_raises_instead_of_hanging():
    """Raising is the check: a fence that waited on the dead worker would never return (the runner's
    deadline would end it with no result)."""
    result = runner.run("dead_worker", {"shim": True}, nvrx="0.4.1", timeout=90).result
    assert result["raised"] == "CheckpointWorkerDied"
    assert "rank 0" in result["message"] and "AsyncCallsQueue" in result["message"]


@pytest.mark.parametrize("nvrx", ("0.6.0", "0.7.0"))
def test_worker_killed_while_the_fence_waits_raises_and_the_next_save_gets_a_fresh_worker(nvrx):
    """docs/faults.md: the worker dies while a fence waits for its write. The next save runs on a fresh
    worker and is written whole; the blocking finalize after it still raises once for the lost save (a
    finalize that returned would let NeMo-RL main rename the lost save's tmp_step_N as finished), and
    the one after that returns."""
    result = runner.run("dead_worker", {"shim": True, "during": True, "next_save": True}, nvrx=nvrx,
                        timeout=120).result
    assert result["raised"] == "CheckpointWorkerDied", result
    assert result["new_worker"] and result["equal"] == [True, True], result
    assert result["finalizes"] == ["CheckpointWorkerDied", None], result


def test_dead_worker_hangs_without_shim():
    """Upstream's blocking finalize polls a dead worker forever; bounded here."""
    seen = {}

    def stuck(out, err):
        if "killed" in out:
            seen.setdefault("at", time.monotonic())
        return "at" in seen and time.monotonic() - seen["at"] > 6

    outcome = runner.run("dead_worker", {"shim": False}, nvrx="0.7.0", timeout=90, until=stuck)
    assert "at" in seen and outcome.returncode is None and '"raised"' not in outcome.stdout


def test_failing_write_surfaces_like_upstream():
    plain = runner.run("failing_write", {}, nvrx="0.7.0", timeout=90).result["results"]
    assert plain[0]["raised"] == "CheckpointException" and "Not a directory" in plain[0]["message"]
    shim = runner.run("failing_write", {"shim": True, "vias": ["fence", "optimizer"]}, nvrx="0.7.0",
                      timeout=120).result["results"]
    for result in shim:  # the fence leaves the write to the job's finalize (issue 22), errors and all
        assert result["raised"] == plain[0]["raised"] and result["raised_in"] == "finalize", result
        assert "Not a directory" in result["message"]


def test_fence_timeout_names_rank_and_queue():
    outcome = runner.run("timeout", {"shim": True}, nvrx="0.7.0", timeout=90,
                         env={"COLO_SHIM_FENCE_TIMEOUT": "1.5"})
    result = outcome.result
    assert result["raised"] == "FenceTimeout"
    assert "rank 0" in result["message"] and "AsyncCallsQueue" in result["message"]
    assert "COLO_SHIM_FENCE_TIMEOUT" in result["message"]
    assert 1.5 <= result["seconds"] < 8


def test_idle_fence_imports_nothing_and_reports_zero():
    proc = run_python("""
        import json, sys
        import colo_shim
        colo_shim.install(["nvrx", "megatron"])
        report = colo_shim.fence("idle")
        print(json.dumps({"torch": "torch" in sys.modules, "report": report.as_dict()}))
    """, timeout=60)
    out = last_json(proc)
    assert out["torch"] is False
    assert out["report"]["calls_finalized"] == 0 and out["report"]["released"] == []


def test_bad_release_value_warns_once_and_uses_default():
    proc = run_python("""
        import json
        from colo_shim.checkpoint import release as nvrx_release
        print(json.dumps([nvrx_release.strategy(), nvrx_release.strategy()]))
    """, env={"COLO_SHIM_NVRX_RELEASE": "sometimes"}, timeout=60)
    assert last_json(proc) == ["inplace", "inplace"]
    assert proc.stderr.count("COLO_SHIM_NVRX_RELEASE='sometimes' is not valid") == 1, proc.stderr
    assert "valid values: inplace, restart, none (deprecated: stage)" in proc.stderr, proc.stderr


def test_retired_stage_value_runs_as_inplace_with_one_line_even_when_strict():
    proc = run_python("""
        import json
        from colo_shim.checkpoint import release as nvrx_release
        print(json.dumps([nvrx_release.strategy(), nvrx_release.strategy(), nvrx_release.skips_upstream_finalize()]))
    """, env={"COLO_SHIM_NVRX_RELEASE": "stage", "COLO_SHIM_STRICT": "1"},
        pythonpath=(deps_dir("nvrx", "0.7.0"),), timeout=60)
    assert last_json(proc) == ["inplace", "inplace", True]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "COLO_SHIM_NVRX_RELEASE=stage is deprecated" in lines[0], proc.stderr
    assert "runs as inplace" in lines[0], lines


def test_bad_release_value_stops_the_process_when_strict():
    proc = run_python("""
        from colo_shim.checkpoint import release as nvrx_release
        nvrx_release.strategy()
    """, env={"COLO_SHIM_NVRX_RELEASE": "sometimes", "COLO_SHIM_STRICT": "1"}, timeout=60, check=False)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "COLO_SHIM_NVRX_RELEASE='sometimes' is not valid" in lines[0]
