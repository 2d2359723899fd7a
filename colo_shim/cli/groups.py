"""Ending a process group without leaving its named semaphores in /dev/shm.

A child killed with its whole group (killpg) takes multiprocessing's resource tracker with it, and
the tracker is what unlinks the named semaphores of queues whose owner died: each such kill leaves
sem.mp-* files in /dev/shm until the machine reboots. So every member but the tracker is killed;
the tracker then cleans up and exits by itself once nobody holds its pipe.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time


def _group(pgid: int) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != b"Z":  # a zombie holds nothing; its parent reaps it
                found.append(int(pid))
        except (OSError, ValueError, IndexError):
            pass
    return found


def _is_tracker(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return b"resource_tracker" in fh.read()
    except OSError:
        return False


def end(pgid: int, tracker_wait: float = 30.0) -> None:
    """Kill every process of group pgid; the resource tracker is given tracker_wait seconds to finish
    its cleanup (it ends as soon as its pipe closes) before it is killed too."""
    if not os.path.isdir("/proc"):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        return
    trackers = []
    for pid in _group(pgid):
        if _is_tracker(pid):
            trackers.append(pid)
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + tracker_wait  # a safety limit only
    while trackers and time.monotonic() < deadline:
        trackers = [pid for pid in trackers if pid in _group(pgid)]
        time.sleep(0.02)
    for pid in trackers:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
