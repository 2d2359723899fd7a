"""Two real gloo ranks whose fences decide differently leave no collective unmatched (issue 22 item 3).

The fence never finalizes an NVRx save (NVRx's finalize gathers across ranks): one rank's writer
lets go through its side door at once, the other's (door closed) only after its write, and both
leave the save to the job's own collective finalize, which then matches on both ranks. A fence that
finalized on one rank only would leave the other rank's finalize waiting in its all_reduce: the
test would then fail by its pytest-timeout and the runner's deadline, not by a clock assertion.
"""

import pytest

from nvrx_scenarios import runner


@pytest.mark.parametrize("mixed", (False, True))
def test_two_ranks_release_alike_or_not_and_the_collective_finalize_matches(mixed):
    outcome = runner.run("two_ranks", {"cycles": 2, "mixed": mixed}, nvrx="0.7.0", timeout=150)
    ranks = outcome.result["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        assert r["equal"] == [True, True] and r["finalized"] == [0, 0], r
    assert ranks[0]["released"] == [["inplace"], ["inplace"]]
    assert ranks[1]["released"] == ([["queued"], ["queued"]] if mixed else [["inplace"], ["inplace"]])
    assert ranks[0]["idle_median_us"] is not None
