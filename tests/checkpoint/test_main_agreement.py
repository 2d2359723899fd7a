"""Issue 16 item 4: the ranks agree whether an offload may skip NeMo-RL main's finalize_async_save.

Main's finalize runs collectives (the save's finalize gathers write results and broadcasts
failures), so a rank that skips it while another runs it leaves that other rank waiting in a
collective forever. colo_shim's `_agreed` therefore takes the MIN of every rank's host-only
verdict. Two real gloo ranks, started with multiprocessing `spawn`, each run both refit offloads
of the NeMo-RL main worker double with COLO_SHIM_NVRX_RELEASE=stage and real NVRx 0.7.0 queues.
In the mixed case rank 1's queue is marked, through the real state API, as one whose worker was
sent CUDA tensors (a CPU machine cannot do it for real; test_main_async_stage.py does the same),
so rank 1 alone is not host-only at the first offload. Left to its own verdict, each rank would differ:
rank 0 would skip and rank 1 would run main's method, which the counters of each rank show.
The double's finalize itself runs no collective (no_dist), so a broken agreement fails on the
counters, not by hanging; a hang in the agreement is caught by the timeout marker.
"""

import multiprocessing
import os
import sys

import pytest

from nvrx_scenarios import runner

RANKS = 2


def _rank(rank, case, store, results):
    """One rank: a fresh interpreter (spawn), so the shim installs before the doubles import."""
    sys.path[:0] = runner.pythonpath("0.7.0", doubles="main").split(os.pathsep)
    for key in [k for k in os.environ if k.startswith("COLO_SHIM") and k != "COLO_SHIM_TEST_DEPS"]:
        del os.environ[key]
    os.environ["COLO_SHIM_NVRX_RELEASE"] = "stage"
    import colo_shim

    colo_shim.install(["nvrx", "megatron"])
    import torch
    import torch.distributed as dist
    from colo_shim.checkpoint import nemo_rl_main, state
    from colo_shim.cli import saver as cs
    from nemo_rl.models.policy.workers import megatron_policy_worker as mpw

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=RANKS)
    worker = mpw.MegatronPolicyWorkerImpl({"model": torch.nn.Linear(4, 4), "optimizer": None}, None,
                                          worker_sharding_annotations=None)
    worker.async_calls_queue = queue = cs.make_queue()
    if case == "mixed" and rank == 1:
        state.note_cuda_sent(queue)  # as after a save that sent CUDA tensors to the worker (CUDA IPC)
    calls = []
    dist.barrier()  # both ranks built their state before either offloads
    for offload in (worker.offload_before_refit, worker.offload_after_refit):
        verdict = nemo_rl_main.host_only()  # this rank's own view, before any agreement
        offload()
        row = next(r for r in colo_shim.status() if r["name"] == "megatron")
        calls.append({"verdict": verdict, "stats": row["details"]["nemo_rl_main"],
                      "main_calls": worker.events.count("finalize_async_save"), "last": worker.events[-1]})
    dist.barrier()  # both offloads returned on both ranks (a lone collective would hang here)
    results.put({"rank": rank, "calls": calls, "shim": colo_shim.__file__,
                 "tracked": any(q is queue for q in state.live_queues())})
    queue.close()
    dist.destroy_process_group()


def _run(case, tmp_path):
    """Both ranks to their end; a rank stuck in a collective is caught by the timeout marker and
    killed here, and a rank that failed shows as a non-zero exit status."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, case, str(tmp_path / "store"), results), daemon=True)
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
    rows = sorted((results.get(timeout=30) for _ in procs), key=lambda r: r["rank"])
    repo = os.path.join(runner.REPO, "colo_shim")
    for row in rows:  # the shim under test (this checkout), and the queue the shim decides on
        assert row["shim"].startswith(repo + os.sep) and row["tracked"], row
    return rows


def _call(calls, verdicts, skipped, unchanged, main_calls):
    """Every rank's counters after one offload, cumulative; `last`: the offload went on after it."""
    assert [c["verdict"] for c in calls] == verdicts, calls  # each rank's own view before the call
    for c in calls:
        assert c["stats"] == {"offload_skipped": skipped, "release_kept": 0, "unchanged": unchanged}, calls
        assert c["main_calls"] == main_calls and c["last"].startswith("offload_"), calls


@pytest.mark.timeout(180)
def test_one_rank_not_host_only_makes_every_rank_run_mains_finalize(tmp_path):
    """First offload: rank 0 alone would skip; agreed, both run main's finalize (wrapped method
    invoked on both). The shim's offload fence then releases rank 1's writer, so at the second
    offload both are host-only and both skip: the ranks agree call by call, on the current state."""
    before, after = zip(*(r["calls"] for r in _run("mixed", tmp_path)))
    _call(before, [True, False], skipped=0, unchanged=1, main_calls=1)
    _call(after, [True, True], skipped=1, unchanged=1, main_calls=1)


@pytest.mark.timeout(180)
def test_every_rank_host_only_makes_every_rank_skip(tmp_path):
    """All host-only: the MIN is True and every rank leaves the write going in both offloads."""
    before, after = zip(*(r["calls"] for r in _run("host_only", tmp_path)))
    _call(before, [True, True], skipped=1, unchanged=0, main_calls=0)
    _call(after, [True, True], skipped=2, unchanged=0, main_calls=0)
