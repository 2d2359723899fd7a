"""Two real gloo ranks: the fence finalizes collectively, an idle fence on one rank alone returns."""

from nvrx_scenarios import runner


def test_two_ranks_finalize_and_idle_fence_does_no_collective():
    outcome = runner.run("two_ranks", {"shim": True, "cycles": 2}, nvrx="0.7.0", timeout=150)
    ranks = outcome.result["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        assert r["equal"] == [True, True]
        assert r["finalized"] == [1, 1]
    assert ranks[0]["idle_median_us"] is not None
