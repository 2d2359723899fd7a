"""Issue 11 item 1: the fence never waits for a save that holds no GPU memory.

Real NVRx, real spawned worker, CPU tensors (what NVRx's shared-memory path and CPU-offloaded
optimizer state send). The worker-side write of the save starts only when the scenario opens a
gate, after the fence returned and after training changed the tensors in place, so the ordering is
fixed by the test. The checkpoint must hold the values of the moment the save was scheduled.
"""

import pytest

from nvrx_scenarios import runner

HOST = runner.os.path.join(runner.HERE, "host_only.py")


@pytest.mark.parametrize("nvrx", ("0.6.0", "0.7.0"))
def test_fence_leaves_host_only_save_writing_and_it_equals_schedule_time(nvrx):
    result = runner.run("left_writing", {}, nvrx=nvrx, script=HOST, timeout=150).result
    assert result["report"]["calls_finalized"] == 0 and result["report"]["not_waited"] == 1, result
    assert result["pending_after_fence"] == 1  # still writing when the fence returned
    assert result["finalized_by_job"] == 1  # the job's own finalize completes it
    assert result["equal_to_schedule_time"] is True  # NVRx 0.6.0: only because the shim copied them (#376)
    _fence_time_is_accounted(result)
    _writer_copies_are_counted(result)


def _writer_copies_are_counted(result):
    """The offload family's node budget counts the writer's host copies: the save's 1536 float32 (issue 32)."""
    assert result["writer_noted"] == 1536 * 4, result


def _fence_time_is_accounted(result):
    """status()'s fence_s / fence_max_s (what the GPU benchmark reads as "blocked") add up the fences' own
    reports, a fence that left the save writing included."""
    assert result["fence_s_added"] == pytest.approx(result["report"]["seconds"], abs=2e-6)
    assert result["fence_max_s"] >= round(result["report"]["seconds"], 6) > 0


def test_nvrx_060_writes_host_tensors_live_without_the_shim():
    """NVRx #376 on the real 0.6.0: why the shim copies host tensors there before leaving a save writing."""
    result = runner.run("left_writing", {"shim": False}, nvrx="0.6.0", script=HOST, timeout=150).result
    assert result["equal_to_schedule_time"] is False


def test_nvrx_041_host_tensors_are_live_so_the_fence_still_waits():
    result = runner.run("left_writing", {"open_first": True}, nvrx="0.4.1", mcore=None, script=HOST,
                        timeout=150).result
    assert result["report"]["calls_finalized"] == 0 and result["report"]["not_waited"] == 0, result
    assert result["written_at_fence_return"] == 1  # waited for the write, finalized nothing (issue 22)
    assert result["pending_after_fence"] == 1 and result["finalized_by_job"] == 1
    assert result["equal_to_schedule_time"] is True
    _fence_time_is_accounted(result)
    _writer_copies_are_counted(result)
