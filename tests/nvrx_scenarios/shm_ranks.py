"""Scenarios for ranks that share one /dev/shm (issue 16 item 2), each on a private tmpfs.

`python shm_ranks.py NAME '{json}'` re-executes itself under `unshare -Urm` (a user and mount
namespace: no root needed) with a fresh tmpfs of opts["mib"] MiB mounted at opts["mount"]:
/dev/shm itself, where torch then really allocates NVRx's staged copies, or a private directory
named by COLO_SHIM_STAGE_SHM_DIR. Processes meet at multiprocessing barriers and events; the lock
decides every race, no step waits on time. The last stdout line is the JSON result.
"""

import json
import logging
import multiprocessing
import os
import signal
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
MIB = 1 << 20
_INSIDE = "COLO_SHIM_TEST_IN_TMPFS"


def _reexec_in_tmpfs(name, opts):
    mount = opts["mount"]
    os.makedirs(mount, exist_ok=True)
    os.environ[_INSIDE] = "1"
    mounter = 'mount -t tmpfs -o size="$1" tmpfs "$2" && shift 2 && exec "$@"'
    os.execvp("unshare", ["unshare", "-Urm", "sh", "-c", mounter, "sh", f"{opts['mib']}m", mount,
                          sys.executable, os.path.abspath(__file__), name, json.dumps(opts)])


def _ledger_view() -> dict:
    """The node's ledger as this process sees it ({} without one: lets the old code run to its failure)."""
    try:
        from colo_shim.checkpoint import shm_ledger
    except ImportError:
        return {}
    return shm_ledger.snapshot()


def _shm_free(path="/dev/shm") -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


class _Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


# --- the ledger alone, real processes -----------------------------------------------------------

def _reserver(mib, barrier, results, hold_mib=0, done=None, stay=None):
    from colo_shim.checkpoint import shm_ledger

    barrier.wait()
    granted, room = shm_ledger.reserve(mib * MIB)
    keep = None
    if granted and hold_mib:  # allocate for real in the tmpfs, then tell the ledger
        keep = open(os.path.join(shm_ledger.directory(), f"buf{os.getpid()}"), "wb")
        os.posix_fallocate(keep.fileno(), 0, hold_mib * MIB)
        shm_ledger.allocated(hold_mib * MIB)
    results.put((mib, granted, room // MIB))
    if done is not None:
        done.set()
    if stay is not None:
        stay.wait()  # alive, holding, until killed or told to go


def ledger_race(opts):
    """n processes race for opts['each'] MiB each; the lock grants exactly what fits."""
    ctx = multiprocessing.get_context("spawn")
    barrier, results, stay = ctx.Barrier(opts["n"]), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_reserver, args=(opts["each"], barrier, results, 0, None, stay))
             for _ in range(opts["n"])]
    for p in procs:
        p.start()
    got = [results.get() for _ in procs]  # all alive, holding their reservations, until every one decided
    stay.set()
    for p in procs:
        p.join()
    return {"granted": sum(1 for _, g, _ in got if g), "rooms": sorted(r for *_, r in got)}


def _lock_holder(path, locked, release):
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a rank stopped inside the ledger's critical section
    locked.set()
    release.wait()
    os.close(fd)


def ledger_busy(opts):
    """A ledger lock held past COLO_SHIM_STAGE_LEDGER_WAIT: reserve gives up (LedgerBusy, an OSError
    that check_room answers with the per-rank share) instead of stalling the save; once the holder
    lets go, reserving works again."""
    from colo_shim.checkpoint import shm_ledger

    os.environ[shm_ledger.WAIT_ENV] = "0.2"
    shm_ledger.reserve(MIB)  # creates the ledger file
    shm_ledger.release()
    ctx = multiprocessing.get_context("spawn")
    locked, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_lock_holder, args=(shm_ledger._ledger_path(shm_ledger.directory()), locked, release))
    holder.start()
    locked.wait()
    try:
        shm_ledger.reserve(MIB)
        busy = None
    except OSError as exc:
        busy = type(exc).__name__
    release.set()
    holder.join()
    return {"busy": busy, "after": shm_ledger.reserve(MIB)[0]}


def ledger_lifecycle(opts):
    """Allocated bytes are counted once; a dead reserver's bytes come back; normal exit releases."""
    from colo_shim.checkpoint import shm_ledger

    ctx = multiprocessing.get_context("spawn")
    out, one = {}, ctx.Barrier(1)  # kept alive here: the child opens its semaphore when it starts

    def holder(mib, hold_mib):  # a process that reserved (and allocated hold_mib), alive until `stay`
        results, done, stay = ctx.Queue(), ctx.Event(), ctx.Event()
        proc = ctx.Process(target=_reserver, args=(mib, one, results, hold_mib, done, stay))
        proc.start()
        done.wait()
        return proc, stay, results.get()

    # 1: A reserves 24 MiB and allocates it for real, stays alive; then B asks for 36 MiB of the 40 left
    a, stay, out["a"] = holder(24, 24)
    out["b_36"] = shm_ledger.reserve(36 * MIB)[0]
    shm_ledger.abandon()
    out["b_44"] = shm_ledger.reserve(44 * MIB)[0]
    out["while_a_holds"] = shm_ledger.snapshot()
    stay.set()
    a.join()
    os.unlink(os.path.join(shm_ledger.directory(), f"buf{a.pid}"))
    out["after_a_exit"] = shm_ledger.snapshot()
    # 2: C reserves 50 MiB and is killed before it allocates; D then gets the 50 MiB
    c, _, out["c"] = holder(50, 0)
    out["d_before_kill"] = shm_ledger.reserve(50 * MIB)[0]
    os.kill(c.pid, signal.SIGKILL)
    c.join()
    out["d_after_kill"] = shm_ledger.reserve(50 * MIB)[0]
    out["after_kill"] = shm_ledger.snapshot()
    # 3: a held reservation ends when the staged tensor it was tied to is freed
    import torch

    shm_ledger.abandon()
    staged = torch.empty(4 * MIB // 4).share_memory_()
    shm_ledger.reserve(staged.nbytes)
    shm_ledger.allocated(staged.nbytes, keepalive=staged)
    out["held_while_tensor"] = shm_ledger.snapshot()["mine_held"] // MIB
    del staged
    out["held_after_free"] = shm_ledger.snapshot()["mine_held"]
    return out


# --- real NVRx staged saves ---------------------------------------------------------------------

def _nemo_rl_rank(rank, opts, barrier, results):
    """One NeMo-RL-style Ray worker: the variables NeMo-RL sets, and no LOCAL_WORLD_SIZE."""
    for name in ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE",
                 "SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE", "MPI_LOCALNRANKS"):
        os.environ.pop(name, None)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", NODE_RANK="0",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(opts["port"]),
                      AVAILABLE_ADDR_LIST=str(["10.0.0.7", "10.0.0.7"]))
    caught = _Warnings()
    logging.getLogger("colo_shim").addHandler(caught)
    import colo_shim

    colo_shim.install(["nvrx"])
    import torch
    import torch.distributed as dist
    from nvidia_resiliency_ext.checkpointing.async_ckpt import filesystem_async

    from colo_shim.cli import saver

    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(rank)
    live = {f"rank{rank}.w": torch.randn(opts["ckpt_mib"] * MIB // 4)}
    q = saver.make_queue(shm=False)
    out = {"rank": rank, "equal": [], "staged": []}
    # Two saves: NVRx 0.7.0 drops the first save's shm cache when its worker starts (its restart
    # callback), so both ranks contend again at the second; that one keeps its buffers.
    for i in range(2):
        path = os.path.join(opts["root"], f"ckpt{i}")
        barrier.wait()  # both ranks plan, check and reserve at the same moment
        saver.async_save(q, live, path, cached=True, shm=False)
        at_schedule = {k: v.clone() for k, v in live.items()}
        saver.finalize(q)
        got = saver.load(path, at_schedule)
        out["equal"].append(all(torch.equal(got[k], at_schedule[k]) for k in live))
        stage = next(r["details"] for r in colo_shim.status() if r["name"] == "nvrx")["stage"]
        out["staged"].append(stage["staged_saves"])
        live[f"rank{rank}.w"].add_(1)
    out["stage"] = stage
    out["warnings"] = [m for m in caught.messages if "stage" in m]
    barrier.wait()
    out["ledger_after_save"] = _ledger_view()
    barrier.wait()
    filesystem_async.FileSystemWriterAsync.cleanup_tensor_caches()  # NeMo-RL main does this at refit
    barrier.wait()
    out["ledger_after_cleanup"] = _ledger_view()
    q.close()
    results.put(out)
    dist.destroy_process_group()


def two_ranks(opts):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        opts["port"] = s.getsockname()[1]
    opts["root"] = tempfile.mkdtemp()
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_nemo_rl_rank, args=(r, opts, barrier, results)) for r in range(2)]
    for p in procs:
        p.start()
    out = sorted((results.get() for _ in procs), key=lambda r: r["rank"])
    for p in procs:
        p.join()
    return {"ranks": out, "exitcodes": [p.exitcode for p in procs]}


def alloc_fails(opts):
    """Something outside the ledger fills /dev/shm between the check and NVRx's allocation: that
    save goes through CUDA IPC (one warning) instead of raising; the next save stages again."""
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
    from nvidia_resiliency_ext.checkpointing.async_ckpt import state_dict_saver

    import colo_shim

    caught = _Warnings()
    logging.getLogger("colo_shim").addHandler(caught)
    colo_shim.install(["nvrx"])
    import torch

    from colo_shim.cli import saver

    saver.init_single_rank()
    filler = "/dev/shm/someone_else"
    fill_to = opts["leave_mib"] * MIB

    class OtherJobFills(DefaultSavePlanner):
        def finish_plan(self, plan):  # after prepare_local_plan (the check), before prepare_write_data
            if fill_to:
                with open(filler, "wb") as f:
                    os.posix_fallocate(f.fileno(), 0, _shm_free() - fill_to)
            return super().finish_plan(plan)

    def gone(save_fn):  # after prepare_write_data, before the request reaches the worker
        if os.path.exists(filler):
            os.unlink(filler)
        return save_fn

    state_dict_saver.DefaultSavePlanner = OtherJobFills
    torch.manual_seed(3)
    live = {f"t{i}": torch.randn(opts["ckpt_mib"] * MIB // 4 // 4) for i in range(4)}
    q = saver.make_queue(shm=False)
    root = tempfile.mkdtemp()
    out = {"saves": []}
    for i in range(2):
        try:
            saver.async_save(q, live, f"{root}/s{i}", cached=True, shm=False, wrap=gone)
            raised = None
        except Exception as exc:
            raised = f"{type(exc).__name__}: {exc}"
            gone(None)
        at_schedule = {k: v.clone() for k, v in live.items()}
        if raised is None:
            saver.finalize(q)
        stage = dict(next(r["details"] for r in colo_shim.status() if r["name"] == "nvrx")["stage"])
        out["saves"].append({"raised": raised, "stage": stage, "ledger": _ledger_view(),
                             "equal": raised is None and all(torch.equal(saver.load(f"{root}/s{i}", at_schedule)[k],
                                                                         at_schedule[k]) for k in live)})
        for v in live.values():
            v.add_(1)
        fill_to = 0  # the second save finds /dev/shm as the ledger saw it
    out["warnings"] = [m for m in caught.messages if "stage" in m]
    q.close()
    return out


if __name__ == "__main__":
    name, options = sys.argv[1], json.loads(sys.argv[2] if len(sys.argv) > 2 else "{}")
    if not os.environ.get(_INSIDE):
        _reexec_in_tmpfs(name, options)
    if options["mount"] != "/dev/shm":
        os.environ["COLO_SHIM_STAGE_SHM_DIR"] = options["mount"]
    print(json.dumps(globals()[name](options), default=str), flush=True)
    for child in multiprocessing.active_children():  # the results-queue manager, any worker left
        child.kill()
    os._exit(0)  # skip NVRx __del__ joins at teardown: the result is already out
