"""Every checkpoint loads back equal to the live tensors at save time across offload/reload cycles.

On this CPU machine NVRx runs its shared-memory path; the release path (drop the worker's cache,
re-send on the next save) is forced so the in-place protocol runs against the real worker: a
wrong protocol shows up as a worker cache miss, a hang or a stale file. The restart strategy is
checked the same way in test_megatron_offload.py.
"""

import pytest

from nvrx_scenarios import runner


@pytest.mark.parametrize("nvrx,release", [("0.5.0", "inplace"), ("0.6.0", "inplace"), ("0.7.0", "inplace")])
def test_cycles_stay_equal_with_release(nvrx, release):
    outcome = runner.run("cycle", {"shim": True, "force_release": True, "cycles": 3}, nvrx=nvrx, timeout=120,
                         env={"COLO_SHIM_NVRX_RELEASE": release})
    result = outcome.result
    assert result["equal"] == [True] * 4, outcome.stderr[-2000:]
    assert [r["calls_finalized"] for r in result["reports"]] == [1, 1, 1]
    assert all(r["released"] == [release] for r in result["reports"])
