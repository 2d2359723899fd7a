"""Issue 22: the writer lets go of what it was sent while its write is still running.

Real NVRx 0.6.0 and 0.7.0, their real spawned workers (release_writing.py says how a CPU machine
plays a writer that was sent CUDA tensors). Each write is held by a gate file, so "the write is
still running when the fence returns" is a fact the test arranges, not a timing.
"""

import os

import pytest

from nvrx_scenarios import runner

SCRIPT = os.path.join(runner.HERE, "release_writing.py")


@pytest.mark.parametrize("nvrx", ("0.6.0", "0.7.0"))
def test_release_while_the_write_runs_then_equal_checkpoints_and_a_clean_resend(nvrx):
    out = runner.run("while_writing", {}, nvrx=nvrx, script=SCRIPT, timeout=150).result
    fence = out["fence"]
    assert fence["released"] == ["inplace"] and fence["calls_finalized"] == 0, out
    assert out["gate_open_at_fence"] is False and out["pending_after_fence"] == 1, out  # still writing
    assert out["identifiers_after_fence"] == 0, out  # the trainer's caches went in the same step
    ran, found, entries, tensors, _cuda, nbytes = out["second_drop"][:6]  # then what requests hold (< 0.6 only)
    assert (ran, found, entries, tensors, nbytes) == (1, 1, 0, 0, 0), out  # the worker's cache is empty
    assert out["totals"]["release_fallbacks"] == 0, out
    assert out["equal"] == [True, True, True], out  # the held write, the re-sent save, the reusing one
    if nvrx == "0.7.0":  # its shared-memory path caches under _cached_identifiers, 0.6.0's does not
        assert out["cached_before_2"] == 0 and out["keys_sent_2"] == 1, out  # re-sent after the release
        assert out["cached_before_3"] == 1 and out["keys_sent_3"] == 0, out  # no offload since: reused
    assert out["worker_alive"] is True  # kept warm


def test_no_side_door_falls_back_to_waiting_for_the_write_with_one_warning():
    outcome = runner.run("while_writing", {"no_door": True}, nvrx="0.7.0", script=SCRIPT, timeout=150)
    out = outcome.result
    assert out["fence"]["released"] == ["queued"] and out["gate_open_at_fence"] is True, out
    assert out["totals"]["release_fallbacks"] == 1 and out["equal"] == [True, True, True], out
    assert outcome.stderr.count("has no release door open") == 1, outcome.stderr[-2000:]


def test_next_save_during_the_write_and_close_then_reuse():
    out = runner.run("next_save_during_write", {}, nvrx="0.7.0", script=SCRIPT, timeout=150).result
    assert out["fence"]["released"] == ["inplace"], out
    assert out["fence_after_reuse"]["released"] == ["inplace"], out  # a fresh worker opened a fresh door
    assert out["equal"] == [True, True, True], out
