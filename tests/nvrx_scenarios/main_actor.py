"""NeMo-RL main's checkpointer wait through its real shape: the driver's Policy and a plain Ray actor.

`python main_actor.py main_actor '{json}'`: a real local Ray cluster, the main doubles' `Policy`
(driver) over one real `MegatronPolicyWorker` actor (Ray runs one call at a time there, as upstream),
real NVRx on PYTHONPATH with its spawned shm worker, gloo, CPU tensors. Each save's write is gated
(gated_io): it cannot finish before the scenario opens the gate, which it does only after both
refit offloads and the next training step returned. A blocking finalize that starts in the actor
while the gate is still closed is counted (`waited_gated`) and opens the gate itself, so code that
makes the actor wait for the write is seen doing so instead of hanging. The step order is main's:
save -> begin_finalization(wait_fn=policy.finalize_async_save) (a background thread) -> the next
refit's offload_before_refit / offload_after_refit -> training. The last stdout line is the JSON result.

Options: shim (colo-shim in the driver and, through the bootstrap, in the actor), actor_shim (false:
the actor has colo-shim off), inject ("probe": the actor's answer to the driver raises), steps.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

HERE = os.path.dirname(os.path.abspath(__file__))
BOOTSTRAP = os.path.join(os.path.dirname(os.path.dirname(HERE)), "colo_shim", "bootstrap")


def main_actor(opts):
    import tempfile

    import ray

    shim = opts.get("shim", True)
    import colo_shim

    colo_shim.install(["nvrx", "megatron"]) if shim else colo_shim.uninstall()
    os.environ["COLO_SHIM"] = "nvrx,megatron" if shim and opts.get("actor_shim", True) else "0"  # the actor's
    os.environ["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP, os.environ["PYTHONPATH"]])
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    root = tempfile.mkdtemp()
    try:
        return _steps(opts, root)
    finally:
        os.environ["PYTHONPATH"] = os.environ["PYTHONPATH"].split(os.pathsep, 1)[1]


def _steps(opts, root):
    import ray
    import torch
    from nemo_rl.distributed.virtual_cluster import RayVirtualCluster
    from nemo_rl.models.policy.lm_policy import Policy
    from nemo_rl.utils.checkpoint import CheckpointManager

    cfg = {"model": torch.nn.Linear(8, 8), "optimizer": None, "generation": {"colocated": {"enabled": True}},
           "checkpoint": {"async_save": True, "async_strategy": "nvrx", "use_persistent_ckpt_worker": True,
                          "ckpt_assume_constant_structure": True, "async_ckpt_use_cpu_shm": False}}
    policy = Policy(RayVirtualCluster([1], inline=False), cfg, None)
    actor = policy.worker_group.workers[0]
    ray.get(actor.__ray_call__.remote(setup_actor, root, opts.get("inject")))
    ckpt = CheckpointManager({"checkpoint_dir": f"{root}/ckpt", "keep_top_k": 1})
    before = _driver_stats()
    out = {"steps": []}
    for step in range(1, opts.get("steps", 2) + 1):
        ckpt.finalize_pending()  # grpo: before each save
        path = ckpt.init_tmp_checkpoint(step, {"step": step})
        policy.save_checkpoint(weights_path=os.path.join(path, "policy", "weights"))
        ckpt.begin_finalization(path, wait_fn=policy.finalize_async_save)
        policy.offload_before_refit()
        policy.offload_after_refit()
        row = ray.get(actor.__ray_call__.remote(after_offloads))
        ray.get(actor.__ray_call__.remote(train))  # the next step changes the live tensors, write still held
        open(f"{root}/gate{step}", "a").close()
        ckpt.finalize_pending()
        latest = ckpt.get_latest_checkpoint_path()
        row["latest"] = os.path.basename(latest) if latest else None
        row["equal"] = ray.get(actor.__ray_call__.remote(equal_to_save, os.path.join(latest, "policy", "weights")))
        out["steps"].append(row)
    ckpt.shutdown()
    out["actor"] = ray.get(actor.__ray_call__.remote(actor_report))
    after = _driver_stats()
    out["driver"] = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    ray.get(actor.__ray_call__.remote(close_queue))
    ray.kill(actor)
    return out


def _driver_stats() -> dict:
    import colo_shim

    rows = [r for r in colo_shim.status() if r["name"] == "megatron" and r.get("details")]
    return dict(rows[0]["details"].get("nemo_rl_driver", {})) if rows else {}


def setup_actor(worker, root, inject=None):
    """In the actor: a real NVRx queue, gated saves of the worker's live tensors, and the count of
    blocking finalizes that began while a write was still held."""
    import torch
    from colo_shim.checkpoint import state
    from colo_shim.cli import saver as cs

    import gated_io

    cs.init_single_rank()
    q = worker.async_calls_queue = cs.make_queue(shm=True)
    torch.manual_seed(5)
    worker.live = {"w": torch.randn(512), "m": torch.randn(64, 8)}
    worker.gate, worker.waited_gated, worker.step = None, 0, 0
    shim_on = "colo_shim" in sys.modules and os.environ.get("COLO_SHIM", "0") != "0"

    def save(path):
        worker.step += 1
        worker.gate = f"{root}/gate{worker.step}"
        worker.at_save = {k: v.clone() for k, v in worker.live.items()}
        q.schedule_async_request(gated_io.gated(cs.request(worker.live, path, cached=True, shm=True), worker.gate))
        if shim_on:
            state.note_cuda_sent(q)  # CPU machine: a save that went through CUDA IPC, so the fence releases

    real = q.maybe_finalize_async_calls

    def watched(blocking=False, no_dist=False):
        if blocking and q.get_num_unfinalized_calls() and worker.gate and not os.path.exists(worker.gate):
            worker.waited_gated += 1
            open(worker.gate, "a").close()  # the actor waits for a write the scenario still holds
        return real(blocking, no_dist)

    q.maybe_finalize_async_calls = watched
    worker.save_fn = save
    if inject == "probe":
        from colo_shim.checkpoint import nemo_rl_driver

        def broken(_worker=None):
            raise RuntimeError("injected fault in colo-shim's answer to the driver")

        nemo_rl_driver.written = broken  # what the driver's __ray_call__ resolves by name in this process
    return True


def after_offloads(worker):
    q = worker.async_calls_queue
    return {"gate_open_after_offloads": os.path.exists(worker.gate), "waited_gated": worker.waited_gated,
            "pending_after_offloads": q.get_num_unfinalized_calls()}


def train(worker):
    for v in worker.live.values():
        v.mul_(-3.0)


def equal_to_save(worker, path):
    import torch
    from colo_shim.cli import saver as cs

    got = cs.load(path, worker.at_save)
    return all(torch.equal(got[k], worker.at_save[k]) for k in worker.at_save)


def actor_report(worker):
    pid = getattr(getattr(worker.async_calls_queue, "persistent_caller", None), "process", None)
    return {"waited_gated": worker.waited_gated, "writer_alive": bool(pid is not None and pid.is_alive()),
            "events": [e for e in worker.events if "refit" in e or "finalize" in e]}


def close_queue(worker):
    """Close and drop the queue in the actor, so that its multiprocessing semaphores are unlinked here and
    now (their finalizers), not left to the actor's resource tracker racing the runner's end of the session."""
    import gc

    worker.async_calls_queue.close()
    worker.async_calls_queue = worker.save_fn = None
    worker.__dict__.pop("at_save", None)
    gc.collect()


def sends_atomic(opts):
    """Two threads send through one inline RayWorkerGroup (the double runs each call as it is sent):
    while thread A's send is inside the group, thread B's send must not reach any worker."""
    import threading

    import colo_shim

    colo_shim.install(["nvrx", "megatron"])
    import torch
    from colo_shim.checkpoint import nemo_rl_driver
    from nemo_rl.distributed.virtual_cluster import RayVirtualCluster
    from nemo_rl.models.policy.lm_policy import Policy

    cfg = {"model": torch.nn.Linear(2, 2), "optimizer": None}
    policy = Policy(RayVirtualCluster([2], inline=True), cfg, None)
    group, log = policy.worker_group, []
    for i, w in enumerate(group.workers):
        w.mark = lambda tag, i=i: log.append(f"{tag}{i}")
    with nemo_rl_driver.SENDS:  # A is sending (the lock is re-entrant: A's own send goes through)
        group.run_all_workers_single_data("mark", "a")
        b = threading.Thread(target=group.run_all_workers_single_data, args=("mark", "b"))
        b.start()
        while nemo_rl_driver.SENDS.waiting == 0 and b.is_alive():
            threading.Event().wait(0.001)
        held = {"b_waiting": nemo_rl_driver.SENDS.waiting, "b_finished_early": not b.is_alive(), "log": list(log)}
    b.join()
    return dict(held, log_after=log)


if __name__ == "__main__":
    import entry

    entry.main(globals())
