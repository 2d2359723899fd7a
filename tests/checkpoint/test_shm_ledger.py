"""Issue 16 item 2: the ranks of one node share one /dev/shm.

Each scenario runs in real processes on a private tmpfs of a known size (`unshare -Urm`, a user
and mount namespace; tests/nvrx_scenarios/shm_ranks.py). On this CPU machine the CUDA IPC fallback
of a CPU tensor still travels through /dev/shm (torch shares it for the worker's queue), so the
two-rank NVRx scenario keeps the ledger and its free space on a private tmpfs directory
(COLO_SHIM_STAGE_SHM_DIR) while the copies land in the host's /dev/shm; the allocation-failure
scenario mounts the tmpfs at /dev/shm itself, where torch really runs out.
"""

import os
import subprocess
import tempfile

import pytest

from nvrx_scenarios import runner

SCRIPT = os.path.join(runner.HERE, "shm_ranks.py")
MIB = 1 << 20


@pytest.fixture(scope="module")
def tmpfs_ok():
    probe = tempfile.mkdtemp()
    try:
        done = subprocess.run(["unshare", "-Urm", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {probe}"],
                              capture_output=True, text=True)
    except FileNotFoundError:
        pytest.skip("no unshare(1) here: the /dev/shm scenarios need a private tmpfs")
    finally:
        os.rmdir(probe)
    if done.returncode != 0:
        pytest.skip(f"`unshare -Urm` + tmpfs mount not permitted here ({done.stderr.strip()}): the /dev/shm "
                    "scenarios need a private tmpfs of a known size")


def _run(name, opts, env=None, timeout=180):
    opts.setdefault("mount", tempfile.mkdtemp(prefix="colo_shm_"))
    return runner.run(name, opts, nvrx="0.7.0", script=SCRIPT, timeout=timeout,
                      env=dict({"COLO_SHIM_NVRX_RELEASE": "stage"}, **(env or {})))


def test_racing_processes_get_exactly_what_fits(tmpfs_ok):
    result = _run("ledger_race", {"mib": 64, "n": 4, "each": 24}).result
    assert result["granted"] == 2, result  # 2 x 24 MiB fit in 64, a third does not, whoever comes first


def test_a_stuck_lock_holder_does_not_stall_a_save(tmpfs_ok):
    r = _run("ledger_busy", {"mib": 64}).result
    assert r == {"busy": "LedgerBusy", "after": True}, r


def test_allocated_bytes_count_once_and_dead_or_exited_processes_give_theirs_back(tmpfs_ok):
    r = _run("ledger_lifecycle", {"mib": 64}).result
    assert r["a"][1] is True
    assert r["b_36"] is True and r["b_44"] is False  # 40 MiB left after A's 24: not 16 (no double count)
    assert r["while_a_holds"]["held"] == 24 * MIB and r["while_a_holds"]["pending"] == 0
    assert r["after_a_exit"]["processes"] == 0, r["after_a_exit"]  # released at normal exit
    assert r["c"][1] is True and r["d_before_kill"] is False  # C's 50 MiB are reserved, not yet allocated
    assert r["d_after_kill"] is True  # SIGKILL: the kernel dropped C's token lock, the next locker reaped it
    assert r["after_kill"]["processes"] == 1 and r["after_kill"]["pending"] == 50 * MIB
    assert r["held_while_tensor"] == 4 and r["held_after_free"] == 0  # freed tensor, reservation gone


def test_two_nemo_rl_ranks_that_fit_alone_but_not_together_one_stages_one_falls_back(tmpfs_ok):
    outcome = _run("two_ranks", {"mib": 64, "ckpt_mib": 40}, timeout=240)
    result = outcome.result
    ranks = result["ranks"]
    assert [r["equal"] for r in ranks] == [[True, True], [True, True]], ranks
    per_save = [[r["staged"][0], r["staged"][1] - r["staged"][0]] for r in ranks]
    assert [a + b for a, b in zip(*per_save)] == [1, 1], per_save  # each save: one rank stages (before: both)
    assert sum(r["stage"]["ipc_saves"] for r in ranks) == 2
    for r in ranks:  # one warning per refused rank, none for a rank that never was
        assert sum("this checkpoint needs" in m for m in r["warnings"]) == min(1, r["stage"]["ipc_saves"]), r
        assert r["stage"]["local_ranks"] == {"count": 2, "source": "NeMo-RL (Ray): AVAILABLE_ADDR_LIST"}
    second = next(r for r in ranks if r["staged"][1] > r["staged"][0])
    assert second["ledger_after_save"]["mine_held"] >= 40 * MIB  # its staged copies, visible node-wide
    assert second["ledger_after_save"]["processes"] == 1
    assert second["ledger_after_cleanup"]["mine_held"] == 0  # NVRx cleanup_tensor_caches freed them
    assert second["ledger_after_cleanup"]["processes"] == 0


def test_allocation_failing_mid_save_falls_back_to_cuda_ipc_instead_of_raising(tmpfs_ok):
    outcome = _run("alloc_fails", {"mib": 64, "ckpt_mib": 40, "leave_mib": 20, "mount": "/dev/shm"})
    saves = outcome.result["saves"]
    first, second = saves
    assert first["raised"] is None and first["equal"] is True, first  # before: RuntimeError into the job
    assert first["stage"]["ipc_saves"] == 1 and "allocation failed mid-save" in first["stage"]["refused"]
    assert first["ledger"]["pending"] == 0  # the reservation of the failed staging is dropped
    assert second["raised"] is None and second["equal"] is True
    assert second["stage"]["ipc_saves"] == 1 and second["ledger"]["mine_held"] >= 40 * MIB  # staged again
    assert sum("ran out while staging" in m for m in outcome.result["warnings"]) == 1


@pytest.mark.parametrize("env, expected", [
    ({"LOCAL_WORLD_SIZE": "8", "SLURM_NTASKS_PER_NODE": "1"}, (8, "torchrun: LOCAL_WORLD_SIZE")),
    ({"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "6", "NODE_RANK": "1",
      "AVAILABLE_ADDR_LIST": "['10.0.0.1', '10.0.0.1', '10.0.0.1', '10.0.0.1', '10.0.0.2', '10.0.0.2']",
      "SLURM_TASKS_PER_NODE": "1(x2)"}, (2, "NeMo-RL (Ray): AVAILABLE_ADDR_LIST")),
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, (4, "OpenMPI: OMPI_COMM_WORLD_LOCAL_SIZE")),
    ({"SLURM_STEP_TASKS_PER_NODE": "4(x2),3", "SLURM_NODEID": "2"}, (3, "Slurm: SLURM_STEP_TASKS_PER_NODE")),
    ({"SLURM_TASKS_PER_NODE": "2(x3)"}, (2, "Slurm: SLURM_TASKS_PER_NODE")),
    ({"RANK": "0", "WORLD_SIZE": "4", "NODE_RANK": "0", "LOCAL_RANK": "0"}, (None, None)),
])
def test_local_ranks_come_from_what_each_launcher_sets(env, expected):
    from colo_shim.checkpoint import shm_ledger

    found = shm_ledger.local_ranks(env)
    assert found["count"] == expected[0]
    if expected[1]:
        assert found["source"] == expected[1]
