"""NeMo-RL main's two finalize_async_save calls, in either order per rank, on two gloo ranks (issue 22).

Main's checkpointer thread calls `finalize_async_save` (a waiting call: blocking finalize, then the
rename) and its training loop calls it first in each refit offload; each Ray actor runs the two in
the order they reach it, which can differ between ranks. Main's finalize gathers across ranks, so
what colo-shim does must give every rank the same collectives whatever the order: an offload call
runs none (the shim's fence releases the writer locally and leaves the save writing), a waiting
call runs main's finalize. Here rank 0 takes the waiting call first and rank 1 the offload first,
then the other way round, with real NVRx 0.7.0 queues, real spawned writers and main's collective
finalize (no_dist=False; NVRx's tensors on the CPU, `scenario.cpu_collectives`). In the mixed case
one rank's writer has no side door (it waits for its write instead). A rank stuck in an unmatched
collective never exits: the spawn join below is bounded by the timeout marker, and each rank's
exit status and counters must show both calls ran.
"""

import multiprocessing
import os
import sys

import pytest

from nvrx_scenarios import runner

RANKS = 2


def _rank(rank, env, store, results):
    """One rank: a fresh interpreter (spawn), so the shim installs before the doubles import."""
    sys.path[:0] = runner.pythonpath("0.7.0", doubles="main").split(os.pathsep)
    for key in [k for k in os.environ if k.startswith("COLO_SHIM") and k != "COLO_SHIM_TEST_DEPS"]:
        del os.environ[key]
    os.environ.update(env)
    import colo_shim

    colo_shim.install(["nvrx", "megatron"])
    import scenario
    import torch
    import torch.distributed as dist
    from colo_shim.checkpoint import door, state
    from colo_shim.cli import saver as cs
    from nemo_rl.models.policy.workers import megatron_policy_worker as mpw

    scenario.cpu_collectives()
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=RANKS)
    cfg = {"model": torch.nn.Linear(4, 4), "optimizer": None, "generation": {"colocated": {"enabled": True}},
           "checkpoint": {"async_save": True, "async_strategy": "nvrx", "use_persistent_ckpt_worker": True,
                          "ckpt_assume_constant_structure": True, "async_ckpt_use_cpu_shm": False}}
    worker = mpw.MegatronPolicyWorkerImpl(cfg, None, worker_sharding_annotations=None)
    worker.async_calls_queue = q = cs.make_queue(shm=True)
    root = os.path.join(os.path.dirname(store), "ckpt")  # one checkpoint, a shard per rank
    torch.manual_seed(rank)
    live = {f"r{rank}.w": torch.randn(256)}  # a shard per rank: each rank's writer has a file to write
    worker.save_fn = lambda path: cs.async_save(q, live, path, cached=True, shm=True)
    equal, orders = [], []
    for step in range(2):
        path = f"{root}/step{step}"
        worker.save_checkpoint(weights_path=path)
        at_save = {k: v.clone() for k, v in live.items()}
        state.note_cuda_sent(q)  # CPU machine: a save that went through CUDA IPC
        if env.get("MIXED") and rank == 1:
            door._TOKEN += "-closed"
        waiting_first = (rank + step) % 2 == 0
        calls = [worker.finalize_async_save, worker.offload_before_refit]
        for call in calls if waiting_first else calls[::-1]:
            call()
        orders.append("waiting, offload" if waiting_first else "offload, waiting")
        worker.offload_after_refit()
        got = cs.load(path, at_save)
        equal.append(all(torch.equal(got[k], at_save[k]) for k in at_save))
        live[f"r{rank}.w"].add_(1)
    dist.barrier()
    stats = next(r for r in colo_shim.status() if r["name"] == "megatron")["details"]["nemo_rl_main"]
    results.put({"rank": rank, "equal": equal, "orders": orders, "stats": stats,
                 "fallbacks": state.totals()["release_fallbacks"], "pending": q.get_num_unfinalized_calls()})
    q.close()
    dist.destroy_process_group()


def _run(env, tmp_path):
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, env, str(tmp_path / "store"), results))
             for r in range(RANKS)]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join()
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    assert [p.exitcode for p in procs] == [0] * RANKS
    return sorted((results.get(timeout=30) for _ in procs), key=lambda r: r["rank"])


@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", ("door", "mixed"))
def test_waiting_call_and_offload_in_either_order_per_rank(case, tmp_path):
    rows = _run({"MIXED": "1"} if case == "mixed" else {}, tmp_path)
    assert rows[0]["orders"] == ["waiting, offload", "offload, waiting"]
    assert rows[1]["orders"] == ["offload, waiting", "waiting, offload"]
    for row in rows:
        assert row["equal"] == [True, True] and row["pending"] == 0, row
        # 2 steps x (2 offload calls skipped + 1 waiting call kept warm); save_checkpoint's own
        # leading finalize is main's code too, not a finalize_async_save call
        assert row["stats"] == {"offload_skipped": 4, "release_kept": 2, "unchanged": 0}, row
    assert [row["fallbacks"] for row in rows] == ([0, 2] if case == "mixed" else [0, 0])


@pytest.mark.timeout(240)
def test_restart_leaves_mains_code_unchanged_in_either_order(tmp_path):
    rows = _run({"COLO_SHIM_NVRX_RELEASE": "restart"}, tmp_path)
    for row in rows:
        assert row["equal"] == [True, True] and row["pending"] == 0, row
        assert row["stats"]["unchanged"] == 6 and row["stats"]["offload_skipped"] == 0, row
