"""Issue 11 item 2: COLO_SHIM_NVRX_RELEASE=stage stages GPU tensors through /dev/shm.

On this CPU machine the job's tensors are host tensors, so what is checked is the switch itself on
real NVRx: the job asks for CUDA IPC (use_cpu_shm_for_gpu_tensors=False, cpu_shm_mode=False), the
writer stages into shared memory anyway, the worker starts in NVRx's cpu_shm_mode (no CUDA
context), the fence leaves the saves writing and every checkpoint equals its schedule-time state.
The GPU numbers are in bench/results (bench/bench_fence_megatron.py).
"""

import pytest

from nvrx_scenarios import runner

HOST = runner.os.path.join(runner.HERE, "host_only.py")


@pytest.mark.parametrize("nvrx", ("0.6.0", "0.7.0"))
def test_stage_stages_through_shared_memory_and_the_fence_never_waits(nvrx):
    result = runner.run("stage_cycle", {"cycles": 3}, nvrx=nvrx, script=HOST, timeout=180,
                        env={"COLO_SHIM_NVRX_RELEASE": "stage"}).result
    assert result["equal"] == [True, True, True], result
    assert all(r["calls_finalized"] == 0 and r["not_waited"] == 1 for r in result["reports"]), result["reports"]
    assert result["queue_cpu_shm_mode"] is True and result["worker_cpu_shm_mode"] is True
    assert result["stage"]["staged_saves"] == 3 and result["stage"]["ipc_saves"] == 0
    if nvrx == "0.7.0":  # 0.7.0 stages host tensors too; 0.6.0 only GPU ones (host ones the shim copies)
        assert result["staged"][-1] >= 1  # the shared-memory copies are kept for the next save


def test_stage_refuses_when_dev_shm_cannot_hold_the_checkpoint():
    outcome = runner.run("stage_cycle", {"cycles": 2}, nvrx="0.7.0", script=HOST, timeout=180,
                         env={"COLO_SHIM_NVRX_RELEASE": "stage", "COLO_SHIM_STAGE_SHM_BYTES": "1000"})
    result = outcome.result
    assert result["equal"] == [True, True]
    assert result["stage"]["ipc_saves"] == 2 and result["stage"]["staged_saves"] == 0
    assert result["stage"]["refused"] == "needs 0.01 MiB of /dev/shm, 0.00 MiB available"
    assert outcome.stderr.count("COLO_SHIM_NVRX_RELEASE=stage: this checkpoint needs") == 1  # one warning
    assert "COLO_SHIM_STAGE_SHM_BYTES" in outcome.stderr
