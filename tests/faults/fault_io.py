"""Worker-side faults, pickled by reference into the NVRx worker (the child's sys.path reaches here).

Each announces, by a file the trainer waits for, that the worker reached the point where the fault
holds it, so a test kills or knocks at a known point of the save instead of after a guessed delay.
"""

import ctypes
import functools
import os
import sys
import threading

import gated_io

_DOOR = "colo_shim.checkpoint.worker"


def _touch(path):
    open(path, "w").close()


def held_copy(request, started, gate):
    """The save's copy to host (preload) starts, then waits for `gate` (a kill comes first)."""
    return request._replace(preload_fn=functools.partial(_copy_when_open, started, gate, request.preload_fn))


def _copy_when_open(started, gate, preload_fn):
    _touch(started)
    return gated_io.wait_then_write(gate, preload_fn)


def held_write(request, started, gate, written: bool):
    """The save's write waits for `gate` before writing (written=False) or after (written=True)."""
    return request._replace(async_fn=functools.partial(_write_held, started, gate, written, request.async_fn))


def _write_held(started, gate, written, write_fn, *args, **kwargs):
    if written:
        write_fn(*args, **kwargs)
        _touch(started)
        return gated_io.wait_then_write(gate, lambda: None)
    _touch(started)
    return gated_io.wait_then_write(gate, write_fn, *args, **kwargs)


def gil_held_write(request, started, fifo, dropped):
    """The save's write holds the GIL (a C call that does not release it) until the trainer writes a
    byte into `fifo`: the side door's thread cannot answer meanwhile. `dropped` marks each cache drop."""
    return request._replace(async_fn=functools.partial(_write_holding_gil, started, fifo, dropped, request.async_fn))


def _write_holding_gil(started, fifo, dropped, write_fn, *args, **kwargs):
    door = sys.modules[_DOOR]
    forget = door._forget_cache

    def forget_and_mark():
        counts = forget()
        _touch(dropped)
        return counts

    door._forget_cache = forget_and_mark
    fd = os.open(fifo, os.O_RDWR)  # a reader and a writer: read() blocks until the trainer writes
    _touch(started)
    ctypes.PyDLL(None).read(fd, ctypes.create_string_buffer(1), 1)  # PyDLL: the GIL stays held
    os.close(fd)
    return write_fn(*args, **kwargs)


def door_stuck_write(request, stuck, holding=False):
    """The save writes as usual, and from now on the side door's thread never answers a knock: it
    blocks before taking the worker's copy lock or (holding=True) once it holds it."""
    return request._replace(async_fn=functools.partial(_stick_door, stuck, holding, request.async_fn))


class _StuckForDoor:
    """The worker's copy lock as the door thread sees it: entered, it never returns (before or after
    taking the real lock); other threads (the worker's copies) get the real lock."""

    def __init__(self, lock, holding):
        self.lock, self.holding = lock, holding

    def __enter__(self):
        if threading.current_thread().name == "colo-shim-release":
            if self.holding:
                self.lock.acquire()
            threading.Event().wait()
        return self.lock.__enter__()

    def __exit__(self, *exc):
        return self.lock.__exit__(*exc)

    def acquire(self, *args, **kwargs):
        return self.lock.acquire(*args, **kwargs)

    def release(self):
        return self.lock.release()


def _stick_door(stuck, holding, write_fn, *args, **kwargs):
    door = sys.modules[_DOOR]
    if not isinstance(door._copying, _StuckForDoor):
        door._copying = _StuckForDoor(door._copying, holding)
    _touch(stuck)
    return write_fn(*args, **kwargs)
