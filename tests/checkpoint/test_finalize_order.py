"""Issue 16 item 5: a fence run from inside a save's finalize function (an offload called there)
used to finalize the later save first. Since issue 22 the fence finalizes nothing; the restart
release ends only the worker (after its writes), never the queue, whose close would finalize.

Real NVRx 0.7.0, real worker. Save 0's finalize function opens save 1's gate (its write was held
until then) and fences; the host's own blocking finalize is running. Save 1 must be finalized
after save 0's finalize completed, by the host's loop, exactly once, and both checkpoints read back.
"""

import pytest

from nvrx_scenarios import runner

MAIN = runner.os.path.join(runner.HERE, "main_async.py")


@pytest.mark.parametrize("case", ("cuda_inplace", "host_only", "cuda_restart"))
def test_fence_inside_a_finalize_keeps_saves_finalizing_in_order(case):
    env = {"COLO_SHIM_NVRX_RELEASE": "restart"} if case == "cuda_restart" else None
    outcome = runner.run("finalize_offloads", {"cuda": case != "host_only"}, nvrx="0.7.0", script=MAIN,
                         timeout=150, env=env)
    result = outcome.result
    assert result["events"] == ["f0 start", "f0 end", "f1"], result
    assert result["fence"]["calls_finalized"] == 0 and result["pending_in_f0"] == 1, result
    assert len(result["host_finalized"]) == 2 and result["pending_at_end"] == 0, result
    assert result["equal"] == [True, True], result
    if case == "cuda_inplace":  # released through the side door; save 1's write was not waited for
        assert result["fence"]["released"] == ["inplace"], result
    if case == "cuda_restart":  # the worker ends after save 1's write; the queue's saves stay pending
        assert result["fence"]["released"] == ["restart"] and result["written_in_f0"] == 1, result
