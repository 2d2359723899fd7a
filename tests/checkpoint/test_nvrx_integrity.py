"""Every checkpoint loads back equal to the live tensors at save time across offload/reload cycles.

On this CPU machine NVRx runs its shared-memory path; the release path (drop the worker's cache
through its side door while the save is pending, re-send on the next save) is forced so the
protocol runs against the real worker: a wrong protocol shows up as a worker cache miss, a hang or
a stale file. The restart strategy is
checked the same way in test_megatron_offload.py.
"""

import pytest

from nvrx_scenarios import runner


@pytest.mark.parametrize("nvrx,release", [("0.5.0", "inplace"), ("0.6.0", "inplace"), ("0.7.0", "inplace")])
def test_cycles_stay_equal_with_release(nvrx, release):
    outcome = runner.run("cycle", {"shim": True, "force_release": True, "cycles": 3, "host_only_left_writing": True},
                         nvrx=nvrx, timeout=120, env={"COLO_SHIM_NVRX_RELEASE": release})
    result = outcome.result
    assert result["equal"] == [True] * 4, outcome.stderr[-2000:]
    assert [r["calls_finalized"] for r in result["reports"]] == [0, 0, 0]  # the job's own finalize does it
    assert all(r["released"] == [release] for r in result["reports"])
    # 0.6.0/0.7.0: the save goes on writing from host copies; 0.5.0's host tensors are live: waited for
    assert [r["not_waited"] for r in result["reports"]] == [0 if nvrx == "0.5.0" else 1] * 3
