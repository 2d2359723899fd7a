"""One /dev/shm for all ranks of a node: a reservation ledger that decides who may stage.

The ranks of a node check their first staged save at the same moment (planning is collective)
and then all allocate: a budget of "free space / local ranks" trusts one launcher variable that
NeMo-RL's Ray workers never set, so every rank budgeted the whole tmpfs, all passed, and one
rank's save died with `unable to allocate shared memory`. So the decision is taken under an
`fcntl.flock` on a small file in the shm directory itself, which every process of the node sees:
a rank may stage when the free space, less what other ranks reserved but have not yet allocated,
holds what it needs. Allocated bytes are already gone from the free space (torch fallocates shm
pages when it creates them), so they are never counted twice; while a rank is still allocating,
its whole reservation counts and the part already allocated is counted twice for that moment, an
error towards CUDA IPC, never towards a full tmpfs.

Who is alive is decided by a lock, not a pid: each process holds an exclusive flock on its own
token file for its lifetime; the kernel drops it when the process dies however it dies, so a
reservation of a dead process is reaped by the next rank that takes the ledger lock, and a reused
pid (or another pid namespace sharing /dev/shm) can never keep it alive. A reservation ends when
its buffers are freed in this process (a weakref finalizer on the staged tensors: NVRx's
`cleanup_tensor_caches`, colo-shim's `clear_training_caches`, exit all go through it).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import json
import logging
import os
import time
import uuid
import weakref

from colo_shim.core.node import local_ranks  # noqa: F401  (moved to core: the offload family counts ranks too)

log = logging.getLogger("colo_shim.nvrx")

DIR_ENV = "COLO_SHIM_STAGE_SHM_DIR"
WAIT_ENV = "COLO_SHIM_STAGE_LEDGER_WAIT"  # seconds a rank waits for the ledger lock (default 10)


class LedgerBusy(OSError):
    """Another process held the ledger lock past COLO_SHIM_STAGE_LEDGER_WAIT (stopped, or stuck)."""
_me: dict = {}  # token, pid, fd of the held token file, dir; reset in a forked child


def directory() -> str:
    return os.environ.get(DIR_ENV, "/dev/shm")


def free_bytes(path: str | None = None) -> int:
    st = os.statvfs(path or directory())
    return st.f_bavail * st.f_frsize


def _ledger_path(path: str) -> str:
    return os.path.join(path, f"colo_shim_stage.{os.getuid()}.ledger")


def _token_path(path: str, token: str) -> str:
    return os.path.join(path, f"colo_shim_stage.{os.getuid()}.{token}.alive")


def _identity(path: str) -> str:
    """This process's token, its token file created and locked before any entry names it."""
    if _me.get("pid") != os.getpid() or _me.get("dir") != path:
        token = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        final = _token_path(path, token)
        fd = os.open(final + ".new", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(final + ".new", final)  # visible to the sweep only once locked
        _me.clear()
        _me.update(token=token, pid=os.getpid(), fd=fd, dir=path)
    return _me["token"]


def _alive(path: str, token: str) -> bool:
    try:
        fd = os.open(_token_path(path, token), os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return True
        raise
    with contextlib.suppress(FileNotFoundError):  # its owner is gone: the lock was free
        os.unlink(_token_path(path, token))
    os.close(fd)
    return False


@contextlib.contextmanager
def _locked(path: str):
    """The ledger's entries, live ones only, under the node-wide lock; written back on exit."""
    fd = os.open(_ledger_path(path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        _flock(fd)
        raw = b""
        while chunk := os.read(fd, 1 << 16):
            raw += chunk
        try:
            entries = json.loads(raw) if raw else {}
        except ValueError:  # a writer killed between truncate and write: start again empty
            entries = {}
        mine = _me.get("token") if _me.get("pid") == os.getpid() else None
        entries = {t: e for t, e in entries.items() if t == mine or _alive(path, t)}
        yield entries
        data = json.dumps(entries, separators=(",", ":")).encode()
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, data)
    finally:
        os.close(fd)  # drops the flock


def _flock(fd: int) -> None:
    """The lock is held for microseconds; a holder that is stopped (SIGSTOP, a debugger) or stuck
    must not stall every rank's save or exit, so the wait is bounded and the caller falls back
    (OSError: per-rank share of the free space, or a release left to the reaper)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        pass
    try:
        limit = float(os.environ.get(WAIT_ENV, "10"))
    except ValueError:
        limit = 10.0
    deadline, delay = time.monotonic() + limit, 0.001
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise LedgerBusy(errno.EAGAIN, f"the /dev/shm ledger lock was held by another process for "
                                 f"more than {limit:g}s ({WAIT_ENV})") from None
            time.sleep(delay)
            delay = min(delay * 2, 0.05)


def _pending_of_others(entries: dict, token: str | None) -> int:
    return sum(int(e.get("pending", 0)) for t, e in entries.items() if t != token)


def available(path: str | None = None) -> int:
    """What a rank of this node could reserve now: free space less others' unallocated reservations."""
    path = path or directory()
    if not os.path.exists(_ledger_path(path)):  # nobody reserved yet; doctor creates nothing
        return free_bytes(path)
    with _locked(path) as entries:
        return max(0, free_bytes(path) - _pending_of_others(entries, _me.get("token")))


def _sweep(path: str, entries: dict) -> None:
    """Token files of processes that died without an entry (os._exit, killed while refused)."""
    prefix, suffix = f"colo_shim_stage.{os.getuid()}.", ".alive"
    for name in os.listdir(path):
        if name.startswith(prefix) and name.endswith(suffix):
            token = name[len(prefix):-len(suffix)]
            if token not in entries and token != _me.get("token"):
                _alive(path, token)  # unlinks it when its owner is gone


def reserve(need: int, budget: int | None = None, path: str | None = None) -> tuple[bool, int]:
    """(granted, room): reserve `need` bytes node-wide, or check them against an explicit budget.

    A grant replaces this process's earlier pending reservation (a save that never reached its
    allocation leaves one behind; this process is the only one that can be allocating for it)."""
    path = path or directory()
    token = _identity(path)
    with _locked(path) as entries:
        _sweep(path, entries)
        room = max(0, free_bytes(path) - _pending_of_others(entries, token)) if budget is None else budget
        granted = need <= room
        entry = entries.setdefault(token, {"pid": os.getpid(), "pending": 0, "held": 0})
        entry["pending"] = int(need) if granted else 0
        if not entry["pending"] and not entry["held"]:
            entries.pop(token)
    return granted, room


def allocated(nbytes: int, keepalive=None, path: str | None = None) -> None:
    """The reserved buffers exist now (the free space shows them): pending becomes held, until
    `keepalive` (a staged tensor) is freed in this process."""
    path = path or directory()
    token = _identity(path)
    with _locked(path) as entries:
        entry = entries.setdefault(token, {"pid": os.getpid(), "pending": 0, "held": 0})
        entry["pending"], entry["held"] = 0, int(entry["held"]) + int(nbytes)
        if not entry["held"]:
            entries.pop(token)
    if keepalive is not None and nbytes:
        weakref.finalize(keepalive, _freed, int(nbytes), path, os.getpid())


def abandon(path: str | None = None) -> None:
    """The save did not allocate (it failed or fell back): drop this process's pending bytes."""
    _update(path or directory(), pending=0)


def _freed(nbytes: int, path: str, pid: int) -> None:
    if pid != os.getpid():
        return
    try:
        _update(path, held_less=nbytes)
    except Exception as exc:  # a finalizer must never raise into whatever freed the tensor
        log.debug("colo_shim: shm ledger release failed: %s", exc)


def _update(path: str, pending: int | None = None, held_less: int = 0) -> None:
    if _me.get("pid") != os.getpid() or _me.get("dir") != path:
        return  # this process never reserved here
    with _locked(path) as entries:
        entry = entries.get(_me["token"])
        if entry is None:
            return
        if pending is not None:
            entry["pending"] = pending
        entry["held"] = max(0, int(entry["held"]) - held_less)
        if not entry["pending"] and not entry["held"]:
            entries.pop(_me["token"])


def release(path: str | None = None) -> None:
    """Forget everything this process reserved or holds (its staged buffers are gone)."""
    path = path or _me.get("dir") or directory()
    if _me.get("pid") != os.getpid():
        return
    with _locked(path) as entries:
        entries.pop(_me["token"], None)


def snapshot(path: str | None = None) -> dict:
    """The node's view, for status and doctor: live processes, bytes reserved and held."""
    path = path or directory()
    try:
        with _locked(path) as entries:
            mine = entries.get(_me.get("token"), {}) if _me.get("pid") == os.getpid() else {}
            return {"dir": path, "free": free_bytes(path), "processes": len(entries),
                    "pending": sum(int(e.get("pending", 0)) for e in entries.values()),
                    "held": sum(int(e.get("held", 0)) for e in entries.values()),
                    "mine_pending": int(mine.get("pending", 0)), "mine_held": int(mine.get("held", 0))}
    except OSError as exc:
        return {"dir": path, "error": f"{type(exc).__name__}: {exc}"}


@atexit.register
def _at_exit() -> None:
    try:
        if _me.get("pid") == os.getpid():
            release()
            os.unlink(_token_path(_me["dir"], _me["token"]))
    except Exception:
        pass
