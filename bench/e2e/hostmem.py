"""Host memory of an e2e run: the job's process tree, the node, /dev/shm (bench instruments, never the job).

The node is the limit that grows with the trainer (issue 34): the optimizer's mirrors, the NVRx
writer's host copies of a checkpoint, the checkpoints on /dev/shm and the engine's level-1 backup
all live there, so the recorder reads the tree in parts as well as in sum.
"""

from __future__ import annotations

import os
import threading
import time

GIB = float(1 << 30)


class Monitor(threading.Thread):
    """Peak host memory of the job: RSS of every process under the driver (trainer, engine, NVRx
    writer; not the checkpoint verifier, an instrument) plus /dev/shm in use, sampled every 0.2 s."""

    def __init__(self, exclude):
        super().__init__(daemon=True)
        self.exclude, self.peak_rss, self.peak_shm, self.stop = exclude, 0, 0, False
        self.min_avail = self.run_min_avail = float("inf")  # lowest MemAvailable: this step's, the run's

    def run(self):
        while not self.stop:
            try:
                self.peak_rss = max(self.peak_rss, tree_rss(os.getpid(), self.exclude()))
                self.peak_shm = max(self.peak_shm, _shm_used())
                self.min_avail = min(self.min_avail, mem_available())
                self.run_min_avail = min(self.run_min_avail, self.min_avail)
            except Exception:
                pass
            time.sleep(0.2)

    def take(self):
        out = (self.peak_rss, self.peak_shm, self.min_avail)
        self.peak_rss = self.peak_shm = 0
        self.min_avail = float("inf")
        return out


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))


def tree_rss(root: int, exclude) -> int:
    """RSS of `root` and its descendants, leaving out the subtrees of `exclude` (bench instruments)."""
    import psutil

    total, todo = 0, [psutil.Process(root)]
    while todo:
        proc = todo.pop()
        if proc.pid in exclude:
            continue
        try:
            total += proc.memory_info().rss
            todo.extend(proc.children())
        except psutil.Error:
            continue
    return total


def _shm_used() -> int:
    st = os.statvfs("/dev/shm")
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def mem_total() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))


def rss_parts(trainers: list, engines: list) -> dict:
    """RSS in GiB by role: the trainer ranks themselves, their children (NVRx's writer processes: the
    checkpoint's host copies), the engine's processes, and the driver alone."""
    import psutil

    def own(pid):
        try:
            return psutil.Process(pid).memory_info().rss
        except psutil.Error:
            return 0

    parts = {"trainer": sum(own(p) for p in trainers), "engine": sum(tree_rss(p, ()) for p in engines),
             "driver": own(os.getpid())}
    parts["writer"] = sum(tree_rss(p, ()) for p in trainers) - parts["trainer"]
    return {k: round(v / GIB, 3) for k, v in parts.items()}
