"""megatron-core entry points that replace training storage fence first (real 0.16.1 and 0.19.2)."""

import pytest

from nvrx_scenarios import runner

ENTRIES = ["buffer", "ddp", "optimizer", "chained"]
TARGET = {"buffer": "_ParamAndGradBuffer.offload_to_cpu", "ddp": "DistributedDataParallel.offload_grad_buffers",
          "optimizer": "MegatronOptimizer.offload_to_cpu", "chained": "ChainedOptimizer.offload_to_cpu"}


@pytest.mark.parametrize("mcore", ("0.16.1", "0.19.2"))
def test_offload_releases_the_writer_first_and_leaves_the_save_writing(mcore):
    result = runner.run("offload_entry", {"shim": True, "entries": ENTRIES}, nvrx="0.7.0", mcore=mcore,
                        timeout=120).result
    for entry in ENTRIES:
        assert result[entry]["pending_after"] == 1 and result[entry]["released"] == 1, (entry, result)
        assert result["calls"].get(TARGET[entry], 0) >= 1, (entry, result["calls"])
    assert result["buffer"]["storage_freed"] and result["ddp"]["storage_freed"]


def test_offload_without_shim_leaves_save_in_flight():
    result = runner.run("offload_entry", {"shim": False, "entries": ["ddp"]}, nvrx="0.7.0", timeout=90).result
    assert result["ddp"] == {"pending_after": 1, "storage_freed": True}


def test_restart_strategy_rewarms_on_reload_with_original_qos():
    outcome = runner.run("restart_rewarm", {"shim": True}, nvrx="0.7.0", timeout=120,
                         env={"COLO_SHIM_NVRX_RELEASE": "restart"})
    result = outcome.result
    assert result["closed_at_fence"] is True and result["pending_at_fence"] == 1
    assert result["warm"] == {"alive": True, "cpu_shm_mode": True, "cpu_priority": 10}
    assert result["equal"] is True
    assert result["calls"]["_ParamAndGradBuffer.reload_from_cpu"] == 1
