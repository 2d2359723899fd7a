"""The trainer's end of the writer's side door (worker.py): release while the write goes on.

Why a side door and not the worker's queue: the queue is FIFO behind the write in flight, so a
release sent there waits for the whole write (12 s of a 29 s colocated step on the H200). The door
is a unix socket served by a thread in the worker, answered within milliseconds while the worker's
main thread writes from its host copies.

Each save's preload_fn is wrapped at schedule time (worker.Preload); the first one a worker runs
opens the door. A worker that never opened it (colo-shim's code not importable there, or a save
scheduled before the shim was on) refuses the connection: the caller then falls back to the queued
release, with one warning. A worker that opened it but does not answer within
COLO_SHIM_NVRX_ACK_TIMEOUT seconds is treated the same way. The secret in every knock is per
trainer process, so no other process on the node can make a writer forget its cache.
"""

from __future__ import annotations

import json
import secrets
import socket
import time

from colo_shim.core import config
from colo_shim.checkpoint import state, worker

ACK_ENV = config.NVRX_ACK_TIMEOUT
DEFAULT_ACK_TIMEOUT = 30.0
_TOKEN = secrets.token_hex(6)
_SECRET = secrets.token_hex(16)


class NoAnswer(Exception):
    """The door is closed or did not answer: the caller uses the queued release instead."""


def wrap(request):
    """The same AsyncRequest with its preload_fn wrapped (once); other requests unchanged."""
    preload = getattr(request, "preload_fn", None)
    if preload is None or isinstance(preload, worker.Preload) or not hasattr(request, "_replace"):
        return request
    wait = 2 * config.env_float(ACK_ENV, DEFAULT_ACK_TIMEOUT)  # twice what an offload gives the door to answer
    return request._replace(preload_fn=worker.Preload(preload, _TOKEN, _SECRET, wait))


def knock(caller, wait) -> list:
    """Ask `caller`'s live worker to drop its cache now; the counts it freed (worker.RAN ...)."""
    proc = caller.process
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(0.05)
    try:
        try:
            sock.connect(worker.address(proc.pid, _TOKEN))
        except OSError as exc:
            raise NoAnswer(f"the writer (pid {proc.pid}) has no release door open ({exc.strerror or exc})")
        sock.sendall(f"{_SECRET} drop\n".encode())
        deadline = time.monotonic() + config.env_float(ACK_ENV, DEFAULT_ACK_TIMEOUT)
        data = b""
        while not data.endswith(b"\n"):
            try:
                chunk = sock.recv(4096)
                if not chunk:
                    raise NoAnswer(f"the writer (pid {proc.pid}) closed its release door without answering")
                data += chunk
                continue
            except socket.timeout:
                pass
            if not proc.is_alive():
                raise state.CheckpointWorkerDied(
                    f"colo_shim fence: rank {state.rank()}: checkpoint worker died while releasing its cache")
            if time.monotonic() > deadline:
                raise NoAnswer(f"the writer (pid {proc.pid}) did not answer within {ACK_ENV}")
            wait.tick(None, "its checkpoint writer to drop its cache", where=f"worker pid {proc.pid}")
        return json.loads(data)
    finally:
        sock.close()
