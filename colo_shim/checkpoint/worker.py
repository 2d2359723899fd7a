"""Runs inside the NVRx persistent checkpoint worker (reached there by pickled reference).

Kept tiny and free of colo_shim imports: it is unpickled by reference in a spawned worker that
may not have the shim active, and it must not import anything the worker does not already have.

Why it exists: NVRx's worker loop is single-threaded, so a request put on its queue runs only
after the write in front of it, and the offload that must free GPU memory would wait for the whole
write. But once `preload_fn` returned, the write reads only host copies; what still pins GPU memory
is bookkeeping (the worker's `_worker_data_cache` and the in-flight request's own references). So:

- `Preload` wraps a save's `preload_fn`: after the device-to-host copy it drops the request's
  references (the write never reads them again), and the first time it runs in a worker it opens a
  side door, a thread on an abstract unix socket, that the trainer can knock on while the worker's
  main thread is writing. On NVRx < 0.6 (no worker data cache) it also empties the request's own
  lists of tensors: the write reads the list preload returned, while the request's arguments share
  the original list with the preload partial, and NVRx 0.4.1's loop keeps its last request until
  the next one arrives (issue 32 item 2: without this the release freed nothing there).
- A knock ("<secret> drop") clears the worker's data cache once no copy is running, collects, and
  answers with what it freed and what the worker's live requests still reference, as one JSON
  line (the worker's own view: the trainer falls back to a restart when a request still holds a
  CUDA tensor). The trainer then runs `torch.cuda.ipc_collect()`.
- `drop_cached_tensors` is the same release sent the old way, down the worker's own queue (the
  fallback when the side door is not open); its `report` tensor is shared with the trainer.
"""

import functools
import gc
import json
import socket
import sys
import threading
import weakref

MARKER = -7_000_001  # call_idx of a queued drop request; never a real checkpoint index
# report slots: the function ran, the worker cache attribute exists, entries, tensors, CUDA tensors, bytes;
# then what requests alive in the worker still reference: tensors, CUDA tensors
RAN, FOUND, ENTRIES, TENSORS, CUDA, BYTES, REQ_TENSORS, REQ_CUDA = range(8)
SLOTS = 8
_CORE = "nvidia_resiliency_ext.checkpointing.async_ckpt.core"
_copying = threading.Lock()  # held while a save's device-to-host copy runs in this worker
_door = None  # (address, listening socket) of this worker's side door, once opened


def address(pid: int, token: str) -> str:
    """The side door of worker `pid`: abstract namespace, so nothing is left on disk if it dies."""
    return f"\0colo-shim-nvrx-{pid}-{token}"


def _tensors(obj, out, depth=0):
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        out.append(obj)
    elif depth < 8 and isinstance(obj, (list, tuple)):
        for item in obj:
            _tensors(item, out, depth + 1)
    elif depth < 8 and isinstance(obj, dict):
        for item in obj.values():
            _tensors(item, out, depth + 1)
    elif depth < 8 and isinstance(obj, functools.partial):
        _tensors([obj.args, obj.keywords], out, depth + 1)
    return out


def strip(obj, cuda_only: bool = True, tuples: bool = True) -> int:
    """Replace tensors (CUDA only, or all) inside the mutable lists of obj by None; how many.

    With tuples, a (key, tensor) tuple inside a list is replaced by the same tuple without the
    tensor, which is how NVRx < 0.6 write buckets hold their tensors."""
    return swap(obj, lambda t: not cuda_only or t.device.type == "cuda", lambda t: None, tuples)


def swap(obj, pick, new, tuples: bool = True, depth: int = 0) -> int:
    """Replace each tensor that pick(tensor) selects inside the mutable lists of obj by new(tensor)."""
    torch = sys.modules.get("torch")
    if torch is None or depth > 10:
        return 0
    if isinstance(obj, functools.partial):
        return swap(obj.args, pick, new, tuples, depth + 1) + swap(obj.keywords, pick, new, tuples, depth + 1)
    if isinstance(obj, dict):
        return sum(swap(v, pick, new, tuples, depth + 1) for v in obj.values())
    if not isinstance(obj, (list, tuple)):
        return 0

    def gone(t):
        return isinstance(t, torch.Tensor) and pick(t)

    swapped = 0
    for i, item in enumerate(obj):
        if gone(item) and isinstance(obj, list):
            obj[i] = new(item)
            swapped += 1
        elif tuples and isinstance(item, tuple) and isinstance(obj, list) and any(gone(x) for x in item):
            obj[i] = tuple(new(x) if gone(x) else x for x in item)
            swapped += 1
        elif not isinstance(item, torch.Tensor):
            swapped += swap(item, pick, new, tuples, depth + 1)
    return swapped


def _requests_hold() -> list:
    """Tensors that requests alive in this worker still reference (NVRx's loop variable included).

    Measured on NVRx < 0.6 only, where requests are what holds the save's tensors; it walks every
    object of the worker (tens of milliseconds), which 0.6+'s fast release must not pay, and there
    the preload partial, the only holder, is dropped by Preload itself. -1: not measured."""
    request = getattr(sys.modules.get(_CORE), "AsyncRequest", None)
    if request is None or _has_data_cache():
        return [-1, -1]
    held = []
    for obj in gc.get_objects():
        if type(obj) is request:
            _tensors([obj.async_fn_args, getattr(obj.preload_fn, "fn", obj.preload_fn)], held)
    return [len(held), sum(1 for t in held if t.device.type == "cuda")]


def _forget_cache() -> list:
    """Forget the tensors the worker keeps (0.6+: its data cache); the counts say what went."""
    cache = getattr(getattr(sys.modules.get(_CORE), "PersistentAsyncCaller", None), "_worker_data_cache", None)
    found = isinstance(cache, dict)
    held = _tensors(list(cache.values()), []) if found else []
    counts = [1, int(found), len(cache) if found else 0, len(held),
              sum(1 for t in held if t.device.type == "cuda"), sum(t.untyped_storage().nbytes() for t in held)]
    alive = [weakref.ref(t) for t in held if t.device.type == "cuda"]
    del held
    if found:
        cache.clear()
    if any(ref() is not None for ref in alive):  # a cycle still holds GPU memory: a full collection (~0.1 s)
        gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    return counts + _requests_hold()


def drop_cached_tensors(report=None, *_args, **_kwargs) -> None:
    """The queued release (fallback): runs between writes, on the worker's main thread."""
    counts = _forget_cache()
    if report is not None:
        for slot, value in enumerate(counts):
            report[slot] = value


class Preload:
    """A save's preload_fn, wrapped: same result, then no reference to the tensors it copied.

    `wait`: how long the copy waits for a release the door is running (it holds the copy lock while it
    clears the cache, milliseconds). A door stuck there (e.g. in a CUDA call) would keep this copy, and
    the trainer in NVRx's preload_q.join(), waiting forever; so the worker ends itself instead: the
    trainer's watch sees the exit, raises CheckpointWorkerDied for this save and the next save gets a
    fresh worker."""

    def __init__(self, fn, token: str, secret: str, wait: float = 60.0):
        self.fn, self.token, self.secret, self.wait = fn, token, secret, wait

    def __call__(self):
        _open_door(self.token, self.secret)
        if not _copying.acquire(timeout=self.wait):
            _give_up(f"the release thread held the copy lock for over {self.wait:.0f} s")
        try:
            result = self.fn()
            if not _has_data_cache():  # NVRx < 0.6: the request's lists are the originals (issue 32 item 2)
                strip(self.fn, cuda_only=False)
            return result
        finally:
            self.fn = None
            _copying.release()

    def forget(self) -> None:
        self.fn = None


def _give_up(why: str) -> None:
    import os

    sys.stderr.write(f"colo_shim: checkpoint worker pid {os.getpid()} exits: {why}\n")
    sys.stderr.flush()
    os._exit(70)  # an exit is what the trainer's watch detects, whatever NVRx's loop would do with an exception


def _has_data_cache() -> bool:
    return hasattr(getattr(sys.modules.get(_CORE), "PersistentAsyncCaller", None), "_worker_data_cache")


def _open_door(token: str, secret: str) -> None:
    global _door
    import os

    where = address(os.getpid(), token)
    if _door is not None and _door[0] == where:
        return
    torch = sys.modules.get("torch")
    device = torch.cuda.current_device() if torch is not None and torch.cuda.is_initialized() else None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(where)
    sock.listen(4)
    _door = (where, sock)
    threading.Thread(target=_serve, args=(sock, secret, device), name="colo-shim-release", daemon=True).start()


def _serve(sock, secret: str, device) -> None:
    """One knock per connection; anything but our secret is ignored. Never raises into the worker."""
    if device is not None:
        sys.modules["torch"].cuda.set_device(device)
    while True:
        try:
            conn, _ = sock.accept()
        except OSError:
            return
        with conn:
            try:
                conn.settimeout(30)
                line = conn.makefile("r").readline().strip()
                if line != f"{secret} drop":
                    continue
                with _copying:  # a copy still running finishes first: it reads the cache
                    counts = _forget_cache()
                conn.sendall((json.dumps(counts) + "\n").encode())
            except Exception:  # the trainer falls back to the queued release when no answer comes
                continue
