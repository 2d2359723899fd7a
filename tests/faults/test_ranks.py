"""Many ranks, one worker dies (docs/faults.md): two real gloo ranks on real NVRx, see ranks.py."""

import os

import pytest

from nvrx_scenarios import runner

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ranks.py")


@pytest.mark.parametrize("version", ("0.4.1", "0.7.0"))
def test_one_ranks_worker_dies_mid_write_and_both_ranks_end_with_nothing_marked_complete(tmp_path, version):
    outcome = runner.run("one_dies", {"root": str(tmp_path / "job"), "pg_timeout_s": 120}, nvrx=version,
                         timeout=300, script=SCRIPT)
    assert not outcome.timed_out, outcome.stderr[-4000:]
    rank0, rank1 = outcome.result["ranks"]
    # the rank whose worker died: its blocking finalize says which save was lost
    (final1,) = [s for s in rank1["saw"] if "finalize" in s or "finalize_raised" in s]
    assert final1.get("finalize_raised") == "CheckpointWorkerDied", final1
    assert rank1["status"] == {"worker_deaths": 1, "saves_lost": 1}, rank1
    # its peer: the collective it waits in ends with the process group's error, not a hang
    (final0,) = [s for s in rank0["saw"] if "finalize" in s or "finalize_raised" in s]
    assert "finalize_raised" in final0, final0
    assert rank0["status"] == {"worker_deaths": 0, "saves_lost": 0}, rank0
    # the checkpoint both ranks were writing is not marked complete; the two before it are
    for rank in (rank0, rank1):
        assert rank["marked_complete"] == {"s0": False, "w0": True, "w1": True}, rank
