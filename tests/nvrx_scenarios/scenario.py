"""Child-process scenarios for the checkpoint-fence tests: `python scenario.py NAME '{json options}'`.

Each runs real NVRx (the version on PYTHONPATH), a real spawned persistent worker and real
torch.distributed (gloo), on the CPU shared-memory path because this machine has no GPU. The
shim is on only when the option "shim" is true. The last stdout line is the JSON result.
"""

import json
import os
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
_KEPT = []  # queues whose close must not run before the result is printed


def _setup(opts):
    if opts.get("shim"):
        import colo_shim

        colo_shim.install(opts.get("families", ["nvrx", "megatron"]))
        if not opts.get("host_only_left_writing"):
            # These scenarios play a writer the fence must wait for. On this CPU machine every save
            # holds only host memory, which the fence now leaves writing (issue 11) once NVRx
            # snapshotted it; treating host tensors as live (NVRx 0.4.1/0.5.0) keeps them waited on.
            from colo_shim.checkpoint import state as shim_state

            shim_state.host_snapshotted = lambda: False
    from colo_shim.cli import saver as checkpoint_saver

    checkpoint_saver.init_single_rank()
    return checkpoint_saver


def _state(step):
    import torch

    torch.manual_seed(step)
    return {"w": torch.randn(256), "m": torch.randn(64, 8), "v": torch.rand(64, 8)}


def _equal(cs, path, live):
    import torch

    got = cs.load(path, live)
    return all(torch.equal(got[k], live[k]) for k in live)


def cycle(opts):
    """save -> offload (storage replaced) -> reload (new address, new values) -> save, N times."""
    cs = _setup(opts)
    import colo_shim

    root = tempfile.mkdtemp()
    q = cs.make_queue(shm=True)
    live = _state(0)
    results, reports = [], []
    for i in range(opts.get("cycles", 3)):
        cs.async_save(q, live, f"{root}/c{i}", cached=True, shm=True)
        snapshot = {k: v.clone() for k, v in live.items()}
        if opts.get("shim"):
            if opts.get("force_release"):
                from colo_shim.checkpoint import state

                state.note_cuda_sent(q)  # on CPU nothing is sent as CUDA; exercise the release path
            reports.append(colo_shim.fence(f"cycle {i}").as_dict())
        offloaded = {k: v.to("cpu", copy=True) for k, v in live.items()}
        for v in live.values():
            v.untyped_storage().resize_(0)
        cs.finalize(q)  # the job's own finalize (its next save's leading one): the fence finalizes nothing
        live = {k: (v + i + 1).clone() for k, v in offloaded.items()}  # reload: new storage, new values
        results.append(_equal(cs, f"{root}/c{i}", snapshot))
    cs.async_save(q, live, f"{root}/last", cached=True, shm=True)
    cs.finalize(q)
    results.append(_equal(cs, f"{root}/last", live))
    q.close()
    return {"equal": results, "reports": reports}


def close_then_save(opts):
    """Three cached saves, close(), one more save: upstream blocks in preload_q.join() forever."""
    cs = _setup(opts)
    root = tempfile.mkdtemp()
    q = cs.make_queue(shm=True)
    live = _state(1)
    for i in range(3):
        live["w"].add_(1)
        cs.async_save(q, live, f"{root}/s{i}", cached=True, shm=True)
        cs.finalize(q)
    q.close(**({"abort": True} if opts.get("abort") else {}))
    print("closed", flush=True)
    live["w"].add_(1)
    cs.async_save(q, live, f"{root}/after", cached=True, shm=True)
    cs.finalize(q)
    ok = _equal(cs, f"{root}/after", live)
    q.close()
    return {"equal": ok}


def _slow_request(cs, q, live, path, mode, seconds=30.0):
    """Schedule a real save whose worker-side write first sleeps or breaks its target dir."""
    import slow_io

    q.schedule_async_request(slow_io.slowed(cs.request(live, path, cached=True, shm=True), mode, seconds, path))


def dead_worker(opts):
    """The worker dies with a save pending, before the fence or (during=True) while the fence waits for
    its write: the fence raises, never hangs; with next_save the job's next save gets a fresh worker."""
    cs = _setup(opts)
    import threading

    import colo_shim

    q = cs.make_queue(shm=True)
    _slow_request(cs, q, _state(2), tempfile.mkdtemp() + "/d", "sleep")
    victim, fencing = q.persistent_caller.process.pid, threading.Event()

    def kill():
        os.kill(victim, signal.SIGKILL)
        print("killed", flush=True)

    def kill_once_fencing():
        fencing.wait()
        time.sleep(0.3)  # into the fence's wait: the write it waits for sleeps 30 s
        kill()

    killer = threading.Thread(target=kill_once_fencing) if opts.get("during") else None
    if killer:
        killer.start()
    else:
        kill()
    t0 = time.monotonic()
    try:
        fencing.set()
        if opts.get("shim"):
            colo_shim.fence("dead worker")
        else:
            cs.finalize(q)
        out = {"raised": None}
    except Exception as exc:
        out = {"raised": type(exc).__name__, "message": str(exc), "seconds": time.monotonic() - t0}
    if killer:
        killer.join()
    if opts.get("next_save"):  # the job goes on: two more saves, each followed by its blocking finalize
        out["finalizes"], out["equal"] = [], []
        for seed in (5, 6):
            live, path = _state(seed), tempfile.mkdtemp() + "/next"
            cs.async_save(q, live, path, cached=True, shm=True)
            try:
                cs.finalize(q)
                out["finalizes"].append(None)
            except Exception as exc:  # noqa: BLE001 - what the job's finalize saw
                out["finalizes"].append(type(exc).__name__)
            out["equal"].append(_equal(cs, path, live))
        out["new_worker"] = q.persistent_caller.process.pid != victim
    return out


def timeout(opts):
    """A save slower than COLO_SHIM_FENCE_TIMEOUT: FenceTimeout names the rank and the queue."""
    cs = _setup(opts)
    import colo_shim

    q = cs.make_queue(shm=True)
    # kept past the return: NVRx's __del__ would close the queue there, which waits out the 20 s write;
    # the process exits without it once the result is out (see __main__)
    _KEPT.append(q)
    _slow_request(cs, q, _state(3), tempfile.mkdtemp() + "/t", "sleep", seconds=20)
    t0 = time.monotonic()
    try:
        colo_shim.fence("timeout")
        return {"raised": None}
    except Exception as exc:
        out = {"raised": type(exc).__name__, "message": str(exc), "seconds": time.monotonic() - t0}
    return out


def failing_write(opts):
    """The worker's write fails: the job's own finalize raises the same CheckpointException as
    without the shim; a fence (alone, or inside an offload) on the way raises nothing of it."""
    cs = _setup(opts)
    import colo_shim

    q = cs.make_queue(shm=True)
    out = []
    for via in opts.get("vias", ["finalize"]):
        _slow_request(cs, q, _state(4), tempfile.mkdtemp() + "/f", "break", seconds=0)
        step = via
        try:
            if via == "optimizer":
                _chained_optimizer().offload_to_cpu()
            elif via == "fence":
                colo_shim.fence("failing write")
            step = "finalize"
            cs.finalize(q)
            out.append({"via": via, "raised": None})
        except BaseException as exc:  # torch's CheckpointException is a BaseException
            out.append({"via": via, "raised": type(exc).__name__, "raised_in": step, "message": str(exc)[:3000],
                        "pending_after": q.get_num_unfinalized_calls()})
    return {"results": out}


def _chained_optimizer():
    """Real megatron-core ChainedOptimizer over a real FP32Optimizer built without CUDA.

    FP32Optimizer.__init__ allocates its loss scale on 'cuda', so the FP32Optimizer is made with
    __new__ and the real MegatronOptimizer.__init__ (CPU-safe); offload_to_cpu is the real method.
    """
    import torch
    from megatron.core.optimizer.optimizer import ChainedOptimizer, FP32Optimizer, MegatronOptimizer
    from megatron.core.optimizer.optimizer_config import OptimizerConfig

    param = torch.nn.Parameter(torch.randn(16))
    adam = torch.optim.Adam([param])
    param.grad = torch.ones_like(param)
    adam.step()
    inner = FP32Optimizer.__new__(FP32Optimizer)
    MegatronOptimizer.__init__(inner, adam, OptimizerConfig(), lambda opt, config=None: None)
    inner.is_stub_optimizer = False
    return ChainedOptimizer([inner])


def _minimal_buffer():
    """Real _ParamAndGradBuffer/DistributedDataParallel methods on minimal instances.

    Both constructors need megatron parallel state and allocate on torch.cuda.current_device(),
    which a CPU machine cannot give; the offload methods themselves only touch the fields set
    here, so the real unbound methods run unchanged.
    """
    import torch
    from megatron.core.distributed.distributed_data_parallel import DistributedDataParallel
    from megatron.core.distributed.param_and_grad_buffer import _ParamAndGradBuffer

    buf = _ParamAndGradBuffer.__new__(_ParamAndGradBuffer)
    buf.grad_data, buf.param_data, buf.param_data_cpu, buf.grad_data_size = torch.ones(1024), None, None, 0
    ddp = DistributedDataParallel.__new__(DistributedDataParallel)
    torch.nn.Module.__init__(ddp)
    ddp.buffers, ddp.expert_parallel_buffers = [buf], []
    return buf, ddp


def offload_entry(opts):
    """A save is in flight each time a megatron-core entry point replaces storage: with the shim,
    its writer (played as one sent CUDA tensors) is released there and the save goes on writing."""
    cs = _setup(dict(opts, host_only_left_writing=True))
    from colo_shim.checkpoint import state

    q = cs.make_queue(shm=True)
    out = {}
    for entry in opts["entries"]:
        _slow_request(cs, q, _state(5), tempfile.mkdtemp() + "/o", "sleep", seconds=0.3)
        if opts.get("shim"):
            state.note_cuda_sent(q)
        released = state.totals()["released"] if opts.get("shim") else 0
        buf, ddp = _minimal_buffer()
        if entry == "buffer":
            buf.offload_to_cpu(move_params=False, move_grads=True)
        elif entry == "ddp":
            ddp.offload_grad_buffers(synchronize=False, empty_cache=True)
        elif entry == "optimizer":
            _chained_optimizer().chained_optimizers[0].offload_to_cpu()
        elif entry == "chained":
            _chained_optimizer().offload_to_cpu()
        out[entry] = {"pending_after": q.get_num_unfinalized_calls(),
                      "storage_freed": buf.grad_data.untyped_storage().size() == 0}
        if opts.get("shim"):
            out[entry]["released"] = state.totals()["released"] - released
        cs.finalize(q)
    q.close()
    out["calls"] = _calls()
    return out


def _calls():
    import colo_shim

    return {s["target"].split(":")[1]: s["calls"] for s in colo_shim.status() if s["calls"]}


def restart_rewarm(opts):
    """restart strategy: the writer is closed at the fence and re-warmed when storage returns."""
    cs = _setup(opts)
    from colo_shim.checkpoint import state

    q = cs.make_queue(shm=True)
    live = _state(6)
    root = tempfile.mkdtemp()
    cs.async_save(q, live, f"{root}/a", cached=True, shm=True)
    state.note_cuda_sent(q)  # CPU: nothing is sent as CUDA; exercise the release path
    buf, _ = _minimal_buffer()
    buf.offload_to_cpu(move_params=False, move_grads=True)
    caller = q.persistent_caller
    closed = caller.process is None  # the worker ended after its write; the queue and its save stay
    pending_at_fence = q.get_num_unfinalized_calls()
    buf.reload_from_cpu(move_params=False, move_grads=True)
    warm_info = {"alive": caller.process is not None and caller.process.is_alive(),
                 "cpu_shm_mode": caller.cpu_shm_mode, "cpu_priority": caller.cpu_priority}
    live["w"].add_(1)
    t0 = time.monotonic()
    cs.async_save(q, live, f"{root}/b", cached=True, shm=True)
    cs.finalize(q)
    q.close()
    return {"closed_at_fence": closed, "pending_at_fence": pending_at_fence, "warm": warm_info,
            "equal": _equal(cs, f"{root}/b", live),
            "save_after_s": time.monotonic() - t0, "calls": _calls()}


def nemo_rl_worker(opts):
    """NeMo-RL Megatron policy worker double: offload entry points with a save in flight, its writer
    played as one sent CUDA tensors: each entry that replaces storage must release it first."""
    cs = _setup(dict(opts, host_only_left_writing=True))
    import importlib

    import torch
    from colo_shim.checkpoint import state

    for name in ("nemo_rl.models.policy.workers.megatron_policy_worker", "nemo_rl.models.policy.megatron_policy_worker"):
        try:
            mod = importlib.import_module(name)
            break
        except ImportError:
            continue
    cls = getattr(mod, "MegatronPolicyWorkerImpl", None) or mod.MegatronPolicyWorker.__ray_actor_class__
    model = torch.nn.Linear(8, 8)
    adam = torch.optim.Adam(model.parameters())
    model(torch.ones(2, 8)).sum().backward()
    adam.step()
    kwargs = {"worker_sharding_annotations": None}
    if "pre_init_communication_queue" in cls.__init__.__code__.co_varnames:
        kwargs["pre_init_communication_queue"] = None
    worker = cls({"model": model, "optimizer": adam}, None, **kwargs)
    q = cs.make_queue(shm=True)
    worker.async_calls_queue = q
    out = {"module": mod.__name__, "class": cls.__name__}
    for method in opts["methods"]:
        _slow_request(cs, q, _state(7), tempfile.mkdtemp() + "/n", "sleep", seconds=0.3)
        if opts.get("shim"):
            state.note_cuda_sent(q)
        before = state.totals()
        if method == "move_model_cpu":
            worker.move_model(worker.model, "cpu")
        elif method == "move_model_cuda":
            worker.move_model(worker.model, "cuda")
        elif method == "move_optimizer_cpu":
            worker.move_optimizer("cpu")
        else:
            getattr(worker, method)()
        after = state.totals()
        out[method] = {"pending_after": q.get_num_unfinalized_calls(),
                       "fences": after["fences"] - before["fences"],
                       "finalized_by_shim": after["finalized"] - before["finalized"],
                       "released": after["released"] - before["released"]}
        cs.finalize(q)
    import colo_shim

    out["status"] = {s["target"].split(":")[1]: [s["status"], s["calls"]] for s in colo_shim.status()
                     if s["target"].startswith(mod.__name__) and s["status"] != "pending"}
    out["events"] = worker.events
    q.close()
    return out


def two_ranks(opts):
    """Two gloo ranks, each with its own worker, whose fences may decide differently (one writer's
    side door open, the other's not): the job's collective finalize must still match on both."""
    return {"ranks": spawn_ranks(_rank_main, tempfile.mkdtemp(), opts)[0]}


def spawn_ranks(target, root, opts, n=2):
    """Starts target(rank, root, opts, results) in n spawned ranks and returns (their answers by rank,
    their exit codes). A rank that ended without answering is the answer, not a wait for a deadline."""
    import queue

    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, root, opts, results)) for r in range(n)]
    for p in procs:
        p.start()
    out = []
    while len(out) < len(procs):
        try:
            out.append(results.get(timeout=1))
        except queue.Empty:
            # a rank that answered may have ended; one that ended unanswered cannot answer any more (a
            # normal exit flushes its queue first, so its answer would have been read above)
            answered = {r["rank"] for r in out}
            dead = [(i, p.exitcode) for i, p in enumerate(procs) if p.exitcode is not None and i not in answered]
            if dead:
                for p in procs:
                    p.kill()
                raise RuntimeError(f"rank(s) died before answering: {dead}")
    for p in procs:
        p.join(timeout=30)
    return sorted(out, key=lambda r: r["rank"]), [p.exitcode for p in procs]


def cpu_collectives():
    """NVRx builds its finalize collectives' tensors on torch.cuda.current_device(); on this CPU
    machine gloo takes the same tensors on the CPU. Only the device changes, not one collective."""
    import torch

    torch.cuda.current_device = lambda: "cpu"


def _rank_main(rank, root, opts, results):
    os.environ.update(RANK=str(rank))
    import torch
    import torch.distributed as dist

    import colo_shim

    colo_shim.install(["nvrx", "megatron"])
    from colo_shim.checkpoint import door, state
    from colo_shim.cli import saver as cs

    cpu_collectives()
    # a file store in the scenario's own directory: a port picked free can be taken before rank 0 binds it
    dist.init_process_group("gloo", init_method=f"file://{root}/store", rank=rank, world_size=2)
    q = cs.make_queue(shm=True)
    torch.manual_seed(rank)
    live = {f"r{rank}.w": torch.randn(128), f"r{rank}.m": torch.randn(32)}
    equal, reports = [], []
    for i in range(opts.get("cycles", 2)):
        cs.async_save(q, live, f"{root}/s{i}", cached=True, shm=True)
        snapshot = {k: v.clone() for k, v in live.items()}
        state.note_cuda_sent(q)  # both writers play ones that were sent CUDA tensors
        if opts.get("mixed") and rank == 1:
            door._TOKEN += "-closed"  # this rank's writer has no side door: it waits for its write
        reports.append(colo_shim.fence(f"rank {rank} cycle {i}").as_dict())
        live = {k: v + 1 for k, v in live.items()}
        q.maybe_finalize_async_calls(blocking=True, no_dist=False)  # the job's finalize: collectives
        got = cs.load(f"{root}/s{i}", snapshot)
        equal.append(all(torch.equal(got[k], snapshot[k]) for k in snapshot))
    idle = []
    if rank == 0:  # rank 1 is not fencing: an idle fence must not enter any collective
        for _ in range(2000):
            t0 = time.perf_counter()
            colo_shim.fence("idle")
            idle.append(time.perf_counter() - t0)
    dist.barrier()
    q.close()
    idle.sort()
    results.put({"rank": rank, "equal": equal, "released": [r["released"] for r in reports],
                 "finalized": [r["calls_finalized"] for r in reports],
                 "idle_median_us": idle[len(idle) // 2] * 1e6 if idle else None})
    dist.destroy_process_group()


if __name__ == "__main__":
    name, options = sys.argv[1], json.loads(sys.argv[2] if len(sys.argv) > 2 else "{}")
    result = globals()[name](options)
    print(json.dumps(result), flush=True)
    import multiprocessing

    for child in multiprocessing.active_children():  # no orphan workers, even after a failure
        child.kill()
    os._exit(0)  # skip NVRx __del__ joins at teardown: the result is already out
