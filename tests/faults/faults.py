"""Fault scenarios on real NVRx (the version on PYTHONPATH), its real spawned worker and gloo, in one
child process: `python faults.py run '{"root": DIR, "scenarios": [...]}'`.

Each scenario has its own queue, hence its own worker, and its own directory under root; it prints
one JSON line when it ends (the test reads every line, so a scenario that hangs loses only itself and
those after it until the runner's safety deadline kills the process group). A scenario records what
the job saw (each save's and finalize's result or error), which checkpoints NVRx marked complete (its
`.metadata`, written by the finalize) and whether they load equal, and the `nvrx` row of
colo_shim.status() before and after. Without a GPU, NVRx runs its CPU shared-memory path.
"""

import json
import os
import signal
import sys
import threading
import time

import entry  # tests/nvrx_scenarios, on the runner's PYTHONPATH
import fault_io


def _state(seed, extra=False):
    import torch

    torch.manual_seed(seed)
    out = {"w": torch.randn(4096), "m": torch.randn(64, 8), "v": torch.rand(64, 8)}
    if extra:  # another structure: another NVRx cache key, no shm buffers shared with the first
        out["x"] = torch.randn(32)
    return out


def _row():
    import colo_shim

    return next(r["details"] for r in colo_shim.status() if r["name"] == "nvrx")


class Job:
    """One scenario's host job: a queue, its saves, its finalizes; what it saw."""

    def __init__(self, cs, root):
        self.cs, self.root, self.q, self.saw, self.saves = cs, root, cs.make_queue(shm=True), [], {}
        self.warmed = 0
        os.makedirs(root, exist_ok=True)

    def path(self, name):
        return os.path.join(self.root, name)

    def save(self, name, live, hold=None, **hold_args):
        req = self.cs.request(live, self.path(name), cached=True, shm=True)
        if hold is not None:
            req = hold(req, **hold_args)
        snapshot = {k: v.clone() for k, v in live.items()}
        try:
            idx = self.q.schedule_async_request(req)
        except Exception as exc:
            self.saw.append({"save": name, "raised": type(exc).__name__, "message": str(exc)})
            return None
        self.saves[name] = (idx, snapshot)
        self.saw.append({"save": name, "idx": idx})
        return idx

    def warm(self, live):
        """Two saves, finalized: NVRx >= 0.6 forgets its cache keys when it starts a worker (after the
        first save was planned), so from the third save on a save of this structure sends keys only."""
        for name in ("w0", "w1"):
            self.save(name, live)
            self.finalize()
        self.warmed = len(self.saw)

    def finalize(self, blocking=True, no_dist=True):
        pending = [c.idx for c in self.q.async_calls]
        try:
            count = len(self.q.maybe_finalize_async_calls(blocking=blocking, no_dist=no_dist))
            left = [c.idx for c in self.q.async_calls]  # NVRx returns the requests' own call_idx (0) here
            self.saw.append({"finalize": pending, "count": count, "left": left})
        except Exception as exc:
            self.saw.append({"finalize_raised": type(exc).__name__, "message": str(exc),
                             "left": [c.idx for c in self.q.async_calls]})

    def fence(self, timeout_knob):
        """An offload's fence with `timeout_knob` set to 1 s, on a queue played as one whose worker was
        sent CUDA tensors (on CPU nothing is: the fence would leave it alone)."""
        import colo_shim
        from colo_shim.checkpoint import state

        state.note_cuda_sent(self.q)
        os.environ[timeout_knob] = "1"
        try:
            self.saw.append({"fence": colo_shim.fence("fault").as_dict()["released"]})
        except Exception as exc:
            self.saw.append({"fence_raised": type(exc).__name__, "message": str(exc)})
        finally:
            os.environ.pop(timeout_knob)

    def pid(self):
        proc = self.q.persistent_caller.process if self.q.persistent_caller else None
        return proc.pid if proc is not None else None

    def kill(self):
        """SIGKILL the worker, as the OOM killer would; returns its pid."""
        pid = self.pid()
        os.kill(pid, signal.SIGKILL)
        return pid

    def result(self, before):
        checkpoints = {}
        for name in sorted(d for d in os.listdir(self.root) if os.path.isdir(self.path(d))):
            marked = os.path.exists(os.path.join(self.path(name), ".metadata"))
            idx, snapshot = self.saves.get(name, (None, None))
            checkpoints[name] = {"idx": idx, "marked_complete": marked, "files": sorted(os.listdir(self.path(name))),
                                 "equal": marked and snapshot is not None and self._equal(name, snapshot)}
        self.q.close()
        after = _row()
        delta = {k: after[k] - before.get(k, 0) for k in ("worker_deaths", "saves_lost") if k in after}
        return {"saw": self.saw[self.warmed:], "warm": self.saw[:self.warmed], "checkpoints": checkpoints,
                "status": delta,
                "last_worker_death": after.get("last_worker_death"), "fallbacks": after["release_fallbacks_by_cause"]}

    def _equal(self, name, snapshot):
        import torch

        got = self.cs.load(self.path(name), snapshot)
        return all(torch.equal(got[k], snapshot[k]) for k in snapshot)


def _wait_for(path):
    """The worker reached the point where the fault holds it (it wrote this file)."""
    while not os.path.exists(path):
        time.sleep(0.005)


def _dead(pid):
    """Wait until the killed worker has exited (all its threads), without reaping it: finding that out
    is colo-shim's part."""
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)


def dead_idle(job, live):
    """The worker dies between saves (nothing pending); the job's next call is a save."""
    job.warm(live)
    old = job.kill()
    _dead(old)
    if job.save("s1", live) is None:  # planned to reuse what the dead worker cached: refused, not sent
        job.save("s1b", live)
    job.finalize()
    return {"old_pid": old, "new_pid": job.pid()}


def mid_write_then_finalize(job, live):
    """A reported save, then a save killed while its write waits; the job's next call is a finalize."""
    job.warm(live)
    job.save("s0", live)
    while job.q.persistent_caller.comp_q.empty():  # the worker reported s0 (not yet finalized)
        time.sleep(0.005)
    other = _state(7, extra=True)
    job.save("s1", other, fault_io.held_write, started=job.path("started"), gate=job.path("gate"), written=False)
    _wait_for(job.path("started"))
    old = job.kill()
    _dead(old)
    job.finalize()
    job.save("s2", live)
    job.finalize()
    return {"old_pid": old, "new_pid": job.pid()}


def written_then_save(job, live):
    """A save's bytes are all written but the worker dies before reporting it; next comes a save."""
    job.warm(live)
    job.save("s1", live, fault_io.held_write, started=job.path("started"), gate=job.path("gate"), written=True)
    _wait_for(job.path("started"))
    old = job.kill()
    _dead(old)
    if job.save("s2", live) is None:
        job.save("s2b", live)
    job.finalize()
    return {"old_pid": old, "new_pid": job.pid()}


def mid_copy(job, live):
    """The worker is killed while the save's copy to host runs, the trainer blocked in the save."""
    job.warm(live)
    killed = {}

    def killer():
        _wait_for(job.path("started"))
        killed["pid"] = job.kill()

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    job.save("s1", live, fault_io.held_copy, started=job.path("started"), gate=job.path("gate"))
    thread.join()
    job.finalize()
    job.save("s2", live)
    job.finalize()
    return {"old_pid": killed.get("pid"), "new_pid": job.pid()}


def no_answer(job, live):
    """The side door accepts the fence's knock and never answers (its thread is stuck)."""
    job.warm(live)
    job.save("s1", live, fault_io.door_stuck_write, stuck=job.path("stuck"))
    job.finalize()
    job.fence("COLO_SHIM_NVRX_ACK_TIMEOUT")
    job.save("s2", {k: v + 1 for k, v in live.items()})
    job.finalize()
    return {"old_pid": None, "new_pid": job.pid()}


def stuck_holding(job, live):
    """The side door's thread is stuck while it holds the worker's copy lock (as in a CUDA call that
    never returns): the next save's copy must not wait for it forever. The worker ends itself after
    twice COLO_SHIM_NVRX_ACK_TIMEOUT (1 s here); that save raises, the one after runs on a fresh worker."""
    job.warm(live)
    job.save("s1", live, fault_io.door_stuck_write, stuck=job.path("stuck"), holding=True)
    job.finalize()
    job.fence("COLO_SHIM_NVRX_ACK_TIMEOUT")  # the knock gets the door stuck; the fence falls back to the queue
    old = job.pid()
    os.environ["COLO_SHIM_NVRX_ACK_TIMEOUT"] = "1"
    try:
        job.save("s2", {k: v + 1 for k, v in live.items()})
    finally:
        os.environ.pop("COLO_SHIM_NVRX_ACK_TIMEOUT")
    job.finalize()
    job.save("s3", {k: v + 2 for k, v in live.items()})
    job.finalize()
    return {"old_pid": old, "new_pid": job.pid()}


def late_answer(job, live):
    """The write holds the worker's GIL past COLO_SHIM_FENCE_TIMEOUT: the fence raises FenceTimeout,
    then the door, freed, drops the worker's cache late. The next save must still complete."""
    job.warm(live)
    fifo = job.path("fifo")
    os.mkfifo(fifo)
    job.save("s1", live, fault_io.gil_held_write, started=job.path("started"), fifo=fifo,
             dropped=job.path("dropped"))
    _wait_for(job.path("started"))
    job.fence("COLO_SHIM_FENCE_TIMEOUT")
    with open(fifo, "wb", buffering=0) as f:
        f.write(b"x")  # the write goes on; then the door reads the knock and drops the cache
    _wait_for(job.path("dropped"))
    job.finalize()
    old = job.pid()
    if job.save("s2", {k: v + 1 for k, v in live.items()}) is None:
        job.save("s2b", {k: v + 1 for k, v in live.items()})
    job.finalize()
    return {"old_pid": old, "new_pid": job.pid()}


def run(opts):
    import colo_shim

    colo_shim.install(["nvrx", "megatron"])
    from colo_shim.cli import saver as cs

    cs.init_single_rank()
    for name in opts["scenarios"]:
        before, t0 = _row(), time.monotonic()
        job = Job(cs, os.path.join(opts["root"], name))
        out = globals()[name](job, _state(len(name)))
        out.update(job.result(before), scenario=name, seconds=round(time.monotonic() - t0, 2))
        print(json.dumps(out, default=str), flush=True)
    return {"done": opts["scenarios"]}


if __name__ == "__main__":
    entry.main({"run": run})
