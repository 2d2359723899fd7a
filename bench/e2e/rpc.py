"""The driver's RPC to its GPU processes, as Ray actors give NeMo-RL's driver.

One spawned process per actor (each trainer rank, the vLLM engine), each serving one object over a
multiprocessing pipe, one call at a time, in order (a default Ray actor's concurrency). `submit`
returns a future so the driver can start the trainer's weight stream and the engine's receive at
once, as `refit_policy_generation` does with two `.remote()` calls and `ray.get`. A `Group` is the
trainer's ranks as NeMo-RL's RayWorkerGroup holds them: every call goes to all ranks before any
result is awaited, since a rank's call may enter a collective that only returns once every rank is in.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import traceback


class RemoteError(RuntimeError):
    """An exception raised inside the actor; the message carries its traceback."""


class Future:
    def __init__(self, remote, name):
        self.remote, self.name, self.done, self.value = remote, name, False, None

    def get(self):
        if not self.done:
            try:
                status, value = self.remote.conn.recv()
            except (EOFError, ConnectionError):
                raise RemoteError(f"{self.remote.label}.{self.name}: {self.remote.died()}") from None
            self.remote.pending = None
            self.done, self.value = True, (status, value)
        status, value = self.value
        if status != "ok":
            raise RemoteError(f"{self.remote.label}.{self.name}: {value}")
        return value


class Remote:
    def __init__(self, conn, proc, label):
        self.conn, self.proc, self.label, self.pending = conn, proc, label, None

    def submit(self, name, *args, **kwargs) -> Future:
        if self.pending is not None:  # one call in flight per actor, as Ray's ordered queue
            self.pending.get()
        self.conn.send((name, args, kwargs))
        self.pending = Future(self, name)
        return self.pending

    def call(self, name, *args, **kwargs):
        return self.submit(name, *args, **kwargs).get()

    def died(self) -> str:
        """Why the pipe closed: the actor's exit code (-9 is SIGKILL, what the kernel's OOM killer sends)
        and the node's available memory right then."""
        from bench.e2e.hostmem import GIB, mem_available

        self.proc.join(10)
        code = self.proc.exitcode
        why = {-9: " (SIGKILL: the OOM killer's signal)", None: " (still running)"}.get(code, "")
        try:
            avail = mem_available() / GIB
        except (OSError, StopIteration):
            avail = float("nan")
        return f"process died, exitcode {code}{why}; MemAvailable now {avail:.1f} GiB"

    def close(self, timeout=30):
        try:
            if self.pending is not None:
                self.pending.get()
            self.conn.send(("__exit__", (), {}))
            self.conn.recv()
        except Exception:
            pass
        self.proc.join(timeout)
        if self.proc.is_alive():
            self.proc.kill()


def _serve(conn, factory: str, kwargs: dict, env: dict | None = None) -> None:
    import os

    os.environ.update(env or {})  # a rank's RANK/WORLD_SIZE/...: set before anything reads them
    module, _, name = factory.partition(":")
    try:
        obj = getattr(importlib.import_module(module), name)(**kwargs)
        conn.send(("ok", None))
    except BaseException:  # noqa: BLE001 - the driver reports it
        conn.send(("err", traceback.format_exc()[-4000:]))
        return
    while True:
        try:
            name, args, kw = conn.recv()
        except EOFError:  # the driver died or left without close(): nobody is left to serve
            return
        if name == "__exit__":
            conn.send(("ok", None))
            return
        try:
            conn.send(("ok", getattr(obj, name)(*args, **kw)))
        except BaseException:  # noqa: BLE001
            conn.send(("err", traceback.format_exc()[-4000:]))


def _start(factory: str, label: str, kwargs: dict, env: dict | None) -> Remote:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(child, factory, kwargs, env), name=label, daemon=False)
    proc.start()
    return Remote(parent, proc, label)


def spawn(factory: str, label: str, **kwargs) -> Remote:
    """Start `module:Callable(**kwargs)` in a fresh spawned interpreter (the actor's own CUDA context)."""
    remote = _start(factory, label, kwargs, None)
    Future(remote, "__init__").get()
    return remote


class Group:
    """The ranks of one actor class: `submit` returns one future per rank, `call` all ranks' results
    in rank order. Every rank gets the call before any result is awaited (calling rank by rank would
    leave rank 0 alone in a collective, waiting for a rank that has not been asked yet)."""

    def __init__(self, remotes: list, label: str):
        self.remotes, self.label = remotes, label

    def submit(self, name, *args, **kwargs) -> list:
        return [r.submit(name, *args, **kwargs) for r in self.remotes]

    def call(self, name, *args, **kwargs) -> list:
        return [f.get() for f in self.submit(name, *args, **kwargs)]

    def close(self, timeout=30):
        for remote in self.remotes:
            remote.close(timeout)


def spawn_group(factory: str, label: str, envs: list, **kwargs) -> Group:
    """One process per entry of `envs` (that rank's environment), all started before any is awaited:
    their constructors meet in init_process_group."""
    remotes = [_start(factory, f"{label}{i}" if len(envs) > 1 else label, kwargs, env) for i, env in enumerate(envs)]
    for remote in remotes:
        Future(remote, "__init__").get()
    return Group(remotes, label)
