"""Scenarios for NeMo-RL main's own finalize_async_save with colo-shim's release, and for finalize order.

`python main_async.py NAME '{json}'`: real NVRx (the version on PYTHONPATH), real spawned worker,
gloo, CPU tensors, the NeMo-RL main doubles on PYTHONPATH. Gated writes (tests/nvrx_scenarios/
gated_io.py) hold a save in flight until the scenario opens its gate, so "the offload returned while
the write was still held" is a fact, not a timing. A blocking finalize of the worker's queue called
while an offload runs is recorded and opens the gate itself, so code that waits there (main's own
finalize) finishes and is seen waiting instead of hanging. The last stdout line is the JSON result.
"""

import contextlib
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _pid(q):
    proc = getattr(getattr(q, "persistent_caller", None), "process", None)
    return proc.pid if proc is not None and proc.is_alive() else None


def main_refit(opts):
    """GRPO on main, `steps` times: save (gated) -> both refit offloads -> training changes the
    tensors -> gate opens -> checkpointer.begin_finalization(wait_fn=worker.finalize_async_save) ->
    finalize_pending (as the next save does); the latest step_N is read back against its step.
    The megatron row's counters are this process's: a case reports what they gained during it."""
    import colo_shim

    colo_shim.install(["nvrx", "megatron"])
    before = _megatron_details()
    with _inject(opts.get("inject")):
        return _main_refit(opts, before)


def _megatron_details() -> dict:
    import colo_shim

    return next(r["details"] for r in colo_shim.status() if r["name"] == "megatron")


def _gained(before: dict, after: dict, keep_zero: bool) -> dict:
    gained = {k: n - before.get(k, 0) for k, n in after.items()}
    return gained if keep_zero else {k: n for k, n in gained.items() if n}


def _main_refit(opts, before):
    import colo_shim
    import torch
    from colo_shim.checkpoint import state
    from colo_shim.cli import saver as cs
    from nemo_rl.models.policy.workers import megatron_policy_worker as mpw
    from nemo_rl.utils.checkpoint import CheckpointManager

    import gated_io

    cs.init_single_rank()
    root = tempfile.mkdtemp()
    model = torch.nn.Linear(8, 8)
    cfg = {"model": model, "optimizer": None, "generation": {"colocated": {"enabled": True}},
           "checkpoint": {"async_save": True, "async_strategy": "nvrx", "use_persistent_ckpt_worker": True,
                          "ckpt_assume_constant_structure": True, "async_ckpt_use_cpu_shm": False}}
    # ray_class: the class Ray instantiates in the actor (`@ray.remote` captured its methods)
    cls = mpw.MegatronPolicyWorker.__ray_metadata__.modified_class if opts.get("ray_class") \
        else mpw.MegatronPolicyWorkerImpl
    worker = cls(cfg, None, worker_sharding_annotations=None)
    q = cs.make_queue(shm=True)  # NVRx's own shm worker: no CUDA on this machine
    worker.async_calls_queue = q
    torch.manual_seed(5)
    live = {"w": torch.randn(512), "m": torch.randn(64, 8)}
    gate = [None]
    worker.save_fn = lambda path: q.schedule_async_request(
        gated_io.gated(cs.request(live, path, cached=True, shm=True), gate[0]))
    in_offload, waited = [False], []
    real_finalize = q.maybe_finalize_async_calls

    def watched(blocking=False, no_dist=False):
        if blocking and in_offload[0] and q.get_num_unfinalized_calls():
            waited.append(True)
            open(gate[0], "a").close()  # someone waits for the write here: let it through
        return real_finalize(blocking, no_dist)

    q.maybe_finalize_async_calls = watched
    ckpt = CheckpointManager({"checkpoint_dir": f"{root}/ckpt", "keep_top_k": 1})
    out = {"steps": []}
    for step in range(1, opts.get("steps", 2) + 1):
        ckpt.finalize_pending()  # grpo: before each save
        for v in live.values():
            v.add_(step)
        at_save = {k: v.clone() for k, v in live.items()}
        path = ckpt.init_tmp_checkpoint(step, {"step": step})
        gate[0] = f"{root}/gate{step}"
        worker.save_checkpoint(weights_path=os.path.join(path, "policy", "weights"))
        if opts.get("cuda"):
            state.note_cuda_sent(q)  # CPU machine: play a save that went through CUDA IPC
        row = {"pid_before": _pid(q)}
        waited.clear()
        released = state.totals()["released"]
        in_offload[0] = True
        worker.offload_before_refit()
        worker.offload_after_refit()
        in_offload[0] = False
        row["offload_waited"] = bool(waited)
        row["fence_released"] = state.totals()["released"] - released
        row["pending_after_offload"] = q.get_num_unfinalized_calls()
        row["gate_open_after_offload"] = os.path.exists(gate[0])
        for v in live.values():  # the next training step, while the write may still be held
            v.mul_(-3.0)
        open(gate[0], "a").close()
        ckpt.begin_finalization(path, wait_fn=worker.finalize_async_save)
        ckpt.finalize_pending()
        latest = ckpt.get_latest_checkpoint_path()
        row["latest"] = os.path.basename(latest) if latest else None
        row["equal"] = _equal(cs, os.path.join(latest, "policy", "weights"), at_save)
        row["pid_after"] = _pid(q)
        out["steps"].append(row)
    ckpt.shutdown()
    out["dirs"] = sorted(os.listdir(f"{root}/ckpt"))
    out["cache_flag"] = worker._async_checkpoint_cuda_cache_active
    out["status"] = {s["target"].split(":")[1]: s["status"] for s in colo_shim.status()
                     if s["target"].endswith("PolicyWorkerImpl.finalize_async_save")}
    details = _megatron_details()
    out["stats"] = _gained(before.get("nemo_rl_main", {}), details.get("nemo_rl_main", {}), keep_zero=True)
    out["shim_errors"] = _gained(before.get("shim_errors", {}), details.get("shim_errors", {}), keep_zero=False)
    q.close()
    return out


@contextlib.contextmanager
def _inject(where):
    """A fault in colo-shim's own part of main's offload (issue 32 item 3): the fence itself, or
    the bookkeeping of live queues that the fence and the offload's log line both read (put back
    at the end: the next case in this process runs with the real ones)."""
    from colo_shim.checkpoint import fence, state

    def broken(*args, **kwargs):
        raise RuntimeError(f"injected fault in colo-shim's {where}")

    real = fence.fence, state.live_queues
    if where == "fence":
        fence.fence = broken
    elif where == "bookkeeping":
        state.live_queues = broken
    try:
        yield
    finally:
        fence.fence, state.live_queues = real


def finalize_offloads(opts):
    """Save 0's finalize function offloads (fences) while save 1 is pending with its write gated:
    save 1 must not be finalized before save 0's finalize completed. The finalize function opens
    save 1's gate just before the fence, so the fence has a write in flight to deal with."""
    import colo_shim

    colo_shim.install(["nvrx", "megatron"])
    import torch
    from colo_shim.checkpoint import state
    from colo_shim.cli import saver as cs

    import gated_io

    cs.init_single_rank()
    root = tempfile.mkdtemp()
    q = cs.make_queue(shm=True)
    events, out = [], {}
    gate = f"{root}/gate1"
    states = [{"w": torch.full((256,), float(i)), "m": torch.randn(16, 4)} for i in range(2)]

    def offload_in_finalize():
        events.append("f0 start")
        open(gate, "w").close()
        out["fence"] = colo_shim.fence("offload from a finalize").as_dict()
        out["pending_in_f0"] = q.get_num_unfinalized_calls()
        caller = q.persistent_caller  # save 1's completion, read by the fence and handed back to NVRx
        out["written_in_f0"] = (caller.cur_item is not None) + len(state._handed_back.get(caller, ()))
        events.append("f0 end")

    cs.async_save(q, states[0], f"{root}/0", cached=True, shm=True)
    q.async_calls[-1].async_request.finalize_fns.append(offload_in_finalize)
    q.schedule_async_request(gated_io.gated(cs.request(states[1], f"{root}/1", cached=True, shm=True), gate))
    q.async_calls[-1].async_request.finalize_fns.append(lambda: events.append("f1"))
    if opts.get("cuda", True):
        state.note_cuda_sent(q)  # CPU machine: a writer holding GPU memory, which the fence must handle
    out["host_finalized"] = q.maybe_finalize_async_calls(blocking=True, no_dist=True)
    out["events"] = events
    out["pending_at_end"] = q.get_num_unfinalized_calls()
    out["equal"] = [_equal(cs, f"{root}/{i}", states[i]) for i in range(2)]
    q.close()
    return out


def _equal(cs, path, expected):
    import torch

    got = cs.load(path, expected)
    return all(torch.equal(got[k], expected[k]) for k in expected)


if __name__ == "__main__":
    import entry

    entry.main(globals())
