"""The node's ledger of the host memory colo-shim's processes keep, so that the ranks on a node share one budget.

A budget per process needs the number of processes on the node, and NeMo-RL's and Ray's workers are
started with RANK / WORLD_SIZE / LOCAL_RANK only: eight ranks that each took "half of MemAvailable"
could page-lock four times the node's memory, and page-locked memory cannot be swapped out. Each
rank also read MemAvailable at its own moment. So the processes of one job on one node meet in one
small file in the node's shared memory (COLO_SHIM_LEDGER_DIR, else /dev/shm), named by the job
(_KEYS), and everything happens under an exclusive fcntl.flock on it:
- the first process fixes the node's budget there (the caller's `fix`); later ones read that number;
- each process records under its pid what it holds, per kind (KINDS); the node's total counts the
  rows of live processes only (pid plus start time, so a reused pid is not taken for a dead rank),
  so a rank that crashed holds nothing from the next reading on;
- a claim that would take the node's total over the budget is refused, so two ranks asking at once
  cannot both take the last bytes.
The kernel drops a flock with its holder, so a crash never leaves the ledger locked; a lock held
longer than _WAIT (a stopped process) counts as a failure, never a hang. The last process to leave
removes the file; one that finds only dead rows starts afresh, and a process joining removes the
ledgers of this user that only dead processes hold. Where no ledger can be made (no /dev/shm, a
read-only mount) `claim` returns None and the caller decides alone.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import json
import logging
import os
import re
import threading
import time

from colo_shim.core import config

KINDS = ("mirrors", "buffer", "writer")  # optimizer mirrors, DDP buffer mirrors, NVRx writers' host copies
DEFAULT_DIR = "/dev/shm"
# what names one job's processes on a node, most specific first; "none" is torchrun's id when none was given
_KEYS = (("TORCHELASTIC_RUN_ID",), ("RAY_JOB_ID",), ("SLURM_JOB_ID",), ("MASTER_ADDR", "MASTER_PORT"))
_WAIT = 5.0
_PROC = os.path.exists("/proc/self/stat")
log = logging.getLogger("colo_shim.ledger")
_lock = threading.Lock()
_mine: dict = {}  # kind -> bytes this process holds
_state: dict = {"pid": None, "error": None}  # pid: the process that has a row (a forked child has none)


def path(environ=None) -> str:
    env = os.environ if environ is None else environ
    key = next((":".join(env[n].strip() for n in names) for names in _KEYS
                if all(env.get(n, "").strip() not in ("", "none") for n in names)), "node")
    return os.path.join(config.get(config.LEDGER_DIR) or DEFAULT_DIR,
                        f"{_prefix()}{re.sub(r'[^A-Za-z0-9_.:-]', '_', key)[:120]}.ledger")


def _prefix() -> str:
    """Per user: another user's ledger of the same job key is not ours to read or remove."""
    return f"colo_shim-{getattr(os, 'getuid', lambda: 0)()}-"


def mine(kind: str | None = None) -> int:
    return _mine.get(kind, 0) if kind else sum(_mine.values())


def error() -> str | None:
    return _state["error"]


def claim(kind: str, nbytes: int, fix) -> dict | None:
    """Record that this process holds nbytes of kind, unless the node's total would then pass the budget.

    No more than this process's row already holds is always granted: it adds nothing to the node
    (mirrors replaced by new ones of the same size), and taking it back would free nothing sooner.
    fix() -> (bytes, words): the node's budget, called by the process that finds the ledger empty.
    Returns what the node looks like under the lock (ok, budget, total, ...); None: no ledger here.
    """
    pid = os.getpid()
    with _lock:
        try:
            with _opened(path()) as data:
                if "budget" not in data:
                    data["budget"], data["source"] = fix()
                    data["fixed_by"] = pid
                row = _row(data, pid)
                ok = nbytes <= row.get(kind, 0) or _total(data) - row.get(kind, 0) + nbytes <= data["budget"]
                if ok:
                    row[kind] = _mine[kind] = int(nbytes)
                else:
                    row["refused"] = row.get("refused", 0) + 1
                return dict(_view(data), ok=ok, path=path())
        except Exception as exc:
            _state["error"] = f"{type(exc).__name__}: {exc}"
            if _state["pid"] == pid:  # it worked before: refuse rather than pin memory nobody counts
                return dict(_view({"rows": {}}), ok=False, source=f"unusable: {_state['error']}", path=path())
            return None


def note(kind: str, nbytes: int) -> None:
    """What this process holds of a kind that is never refused (a DDP buffer's copy, a writer's)."""
    with _lock:
        if _mine.get(kind, 0) == nbytes:
            return
        _mine[kind] = int(nbytes)
        if _state["pid"] != os.getpid():
            return  # recorded when this process joins, at its first claim
        try:
            with _opened(path()) as data:
                _row(data, os.getpid())
        except Exception as exc:
            _state["error"] = f"{type(exc).__name__}: {exc}"
            log.debug("colo_shim: ledger note failed: %s", exc)


def leave() -> None:
    """Take this process's row out; the last process removes the file."""
    with _lock:
        if _state["pid"] != os.getpid():
            return
        _state["pid"] = None
        with contextlib.suppress(Exception), _opened(path()) as data:
            data["rows"].pop(str(os.getpid()), None)
            if not data["rows"]:
                os.unlink(path())


def peek(where: str | None = None) -> dict | None:
    """The node as the ledger says now (doctor), without joining or making the file; None: no ledger."""
    try:
        with _opened(where or path(), create=False) as data:
            return dict(_view(data), path=where or path()) if data.get("rows") else None
    except Exception:
        return None


def _row(data: dict, pid: int) -> dict:
    if _state["pid"] != pid:
        _state["pid"] = pid
        atexit.register(leave)
        _sweep_dir()
    row = data["rows"].setdefault(str(pid), {"start": _stamp(pid)})
    row.update(_mine)
    return row


def _total(data: dict) -> int:
    return sum(row.get(kind, 0) for row in data["rows"].values() for kind in KINDS)


def _view(data: dict) -> dict:
    rows = data["rows"].values()
    return dict(budget=data.get("budget", 0), source=data.get("source", ""), fixed_by=data.get("fixed_by"),
                total=_total(data), processes=len(data["rows"]), refused=sum(r.get("refused", 0) for r in rows),
                **{kind: sum(r.get(kind, 0) for r in rows) for kind in KINDS})


def _live(pid: str, row) -> bool:
    try:
        stamp = _stamp(int(pid))
    except ValueError:
        return False
    return stamp is not None and isinstance(row, dict) and stamp == row.get("start")


def _stamp(pid: int):
    """What tells a live process from a later one with its pid (its start time); None when it is gone."""
    if not _PROC:  # no /proc: that the pid lives is all there is to tell
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except OSError:
            pass
        return "alive"
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return None if fields[0] in ("Z", "X") else fields[19]
    except (OSError, IndexError):
        return None


@contextlib.contextmanager
def _opened(where: str, create: bool = True):
    """The ledger's content, dead rows dropped, under the lock; what the body changes is written back."""
    import fcntl

    fd = _lock_file(where, create, fcntl)
    try:
        raw = os.pread(fd, 1 << 20, 0).split(b"\n", 1)[0]
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:
            data = {}
        rows = data.get("rows") if isinstance(data, dict) and isinstance(data.get("rows"), dict) else {}
        data = dict(data if isinstance(data, dict) else {}, rows={p: r for p, r in rows.items() if _live(p, r)})
        if not data["rows"]:
            data.pop("budget", None)  # fixed by processes that are all gone: the next one measures again
        before = json.dumps(data, sort_keys=True)
        yield data
        text = json.dumps(data, sort_keys=True)
        if create and text != before and os.path.exists(where):
            os.pwrite(fd, (text + "\n").encode(), 0)
            os.ftruncate(fd, len(text) + 1)
    finally:
        os.close(fd)


def _lock_file(where: str, create: bool, fcntl) -> int:
    """An fd of the file now at `where`, locked; a leaving last process may unlink the one first opened."""
    deadline = time.monotonic() + _WAIT
    while True:
        fd = os.open(where, os.O_RDWR | os.O_CREAT if create else os.O_RDONLY, 0o600)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{where} stayed locked for {_WAIT:g} s") from None
                    time.sleep(0.002)
            if os.path.exists(where) and os.stat(where).st_ino == os.fstat(fd).st_ino:
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
        if not create:
            raise FileNotFoundError(where)


def _sweep_dir() -> None:
    """Remove this user's ledgers that only dead processes hold (jobs killed before they could leave)."""
    here = path()
    for other in glob.glob(os.path.join(os.path.dirname(here), f"{_prefix()}*.ledger")):
        if other != here:
            with contextlib.suppress(Exception), _opened(other, create=False) as data:
                if not data["rows"]:
                    os.unlink(other)
