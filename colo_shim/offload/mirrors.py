"""Persistent host mirrors: where an offloaded optimizer tensor lands, the same memory every step.

`.cpu()` / `.to("cpu")` per tensor means fresh pageable memory at every offload and one
synchronous copy after the other (1.6 GB/s on an H200); into page-locked tensors made once, with
async copies and one synchronize per device, the same bytes move at 50 GB/s (issue 23). So a tensor gets a
mirror (pages.py) at its first offload, and later offloads copy into it.

Never stale bytes, in either direction:
- a mirror is reused only for the tensor colo-shim's own restore made from it: the same storage
  object, shape, stride, offset and dtype. A tensor resized or replaced since (a new param group,
  a checkpoint load that built new tensors) or aliased into a second slot gets a fresh mirror.
- a mirror that something besides colo-shim still holds (a reference or a view kept from the
  offloaded optimizer) is never written again: colo-shim lets go of it and makes a fresh one.
- every copy is of the whole tensor, and slots change only after the synchronize: a failure part
  way leaves the optimizer as it was, and the caller's original path runs.

Over the node's host budget (budget.py), or where page-locking fails (then for good), a call takes
the original path, with one warning per process. Mirrors nothing reaches any more are dropped at the next call.
Without CUDA initialized (CPU-only torch) mirrors stay pageable; report() says so.
A mirror made ahead (ahead.py) is visible here only once page-locked, linked as a restore links one.
"""

from __future__ import annotations

import atexit
import logging
import sys
import threading
import time
import weakref

from colo_shim.offload import budget, pages

log = logging.getLogger("colo_shim.offload")

GIB = budget.GIB
DATA = object()  # slot key: the tensor behind a parameter's `.data`, not a dict entry


class Mirror:
    __slots__ = ("host", "nbytes", "locked", "kind", "baseline", "device", "device_id", "layout", "ahead")

    def __init__(self, tensor, nbytes: int, kind: str):
        self.host, self.nbytes, self.kind, self.locked, self.ahead = tensor, nbytes, kind, False, False
        self.baseline = self.device = self.device_id = self.layout = None


_lock = threading.RLock()
_mirrors: dict[int, Mirror] = {}  # id(host storage) -> mirror; the mirror keeps that storage alive
_by_device: dict[int, Mirror] = {}  # id(device storage a restore made from a mirror) -> that mirror
_state: dict = {"broken": None, "atexit": False}
_warned: set = set()
stats = dict(offloads=0, restores=0, fallbacks=0, over_budget=0, reused=0, fresh=0, replaced=0, dropped=0,
             bytes_moved=0, offload_s=0.0, restore_s=0.0, last_fallback="", ahead=0, ahead_used=0, ahead_discarded=0)


def tensor_of(slot):
    return slot[0].data if slot[1] is DATA else slot[0][slot[1]]


def _put(slot, value) -> None:
    holder, key = slot
    if key is DATA:
        holder.data = value
    else:
        holder[key] = value


def _refs(tensor) -> tuple:
    """Who holds a mirror: Python references to it, and tensors (views, `.data`) sharing its storage."""
    use = getattr(sys.modules["torch"]._C, "_storage_Use_Count", None)
    return sys.getrefcount(tensor), use(tensor.untyped_storage()._cdata) if use else 0


def _held(m: Mirror) -> bool:
    return _refs(m.host) != m.baseline


def _layout(t) -> tuple:
    return tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.untyped_storage().nbytes()


def offload(slots, where: str) -> bool:
    """Copy each slot's device tensor into its mirror, synchronize each device once, then point the slot at it.

    False: nothing changed, and the caller's original path moves these tensors.
    """
    return _guarded(where, slots, _offload)


def restore(slots, where: str) -> bool:
    """Copy each slot's host tensor to the device (async from page-locked memory), then synchronize it."""
    return _guarded(where, slots, _restore)


def buffer_mirror(t, where: str):
    """A page-locked tensor laid out as `t.cpu()`, for the host copy a DDP buffer keeps; None: as upstream."""
    found = []

    def body(slots, where, locking):
        if locking:  # pageable memory would be slower than upstream's pinned copy
            found.append(_publish(make(t, True, "buffer")).host)
        return True

    _guarded(where, [t], body)
    return found[0] if found else None


def _guarded(where: str, slots, body) -> bool:
    if not slots:
        return True
    with _lock:
        if _state["broken"]:
            return fallback(where, "page-lock", _state["broken"])
        try:
            _sweep()
            return bool(body(slots, where, pages.host.ready()))
        except pages.LockFailed as exc:
            return broke(where, exc)
        except (RuntimeError, OSError, MemoryError) as exc:  # device/host full, as for the original; bugs: core/guard
            return fallback(where, "error", f"{type(exc).__name__}: {exc}")
        finally:  # the node's ledger learns what this process holds now (mirrors dropped, a copy failed)
            budget.settle(held(), held("buffer"))


def _offload(slots, where: str, locking: bool) -> bool:
    start, claimed, plan, need = time.perf_counter(), set(), [], 0
    for slot in slots:
        t = tensor_of(slot)
        m = _reuse(t, claimed)
        need += 0 if m is not None else pages.size(t)
        plan.append([slot, t, m])
    ok, why = budget.claim(held() + need)
    if not ok:
        return fallback(where, "budget", why)
    for step in plan:
        step[2] = step[2] or _publish(make(step[1], locking))
    for _, t, m in plan:
        m.host.copy_(t, non_blocking=locking)
    if locking:
        pages.synchronize(t for _, t, _ in plan)
    for slot, t, m in plan:  # only now: a failure above left every slot as it was
        _put(slot, m.host)
        _unlink(m)
        stats["bytes_moved"] += m.nbytes
    stats["offloads"] += 1
    stats["offload_s"] = round(time.perf_counter() - start, 6)
    return True


def _restore(slots, where: str, locking: bool) -> bool:
    start = time.perf_counter()
    if not sys.modules["torch"].cuda.is_available():  # no device to restore onto: the body decides
        return True
    plan = [(slot, t, t.to("cuda", non_blocking=True)) for slot in slots for t in (tensor_of(slot),)]
    if locking:
        pages.synchronize(new for _, _, new in plan)
    for slot, t, new in plan:
        _put(slot, new)
        m = _mirrors.get(id(t.untyped_storage()))
        if m is not None and m.kind == "optimizer" and _layout(m.host)[:4] == _layout(t)[:4]:
            _link(m, new)
        stats["bytes_moved"] += t.nbytes
    stats["restores"] += 1
    stats["restore_s"] = round(time.perf_counter() - start, 6)
    return True


def make(t, locking: bool = True, kind: str = "optimizer", device=None) -> Mirror:
    """Pages for t's mirror, page-locked when `locking`; nothing shared is touched (any thread may call it)."""
    m = Mirror(*pages.allocate(t), kind)
    if locking and m.nbytes:
        pages.lock(m.host, m.nbytes, device)
        m.locked = True
    return m


def _publish(m: Mirror) -> Mirror:
    if m.locked and not _state["atexit"]:
        _state["atexit"] = True
        atexit.register(drop_all)
    m.baseline = _refs(m.host)
    _mirrors[id(m.host.untyped_storage())] = m
    stats["ahead" if m.ahead else "fresh"] += 1
    return m


def wanted(t) -> bool:  # no mirror linked to t yet
    m = _by_device.get(id(t.untyped_storage()))
    return m is None or m.device is None or m.device() is not t.untyped_storage()


def room(nbytes: int) -> bool:
    """Mirrors this many bytes more fit the node's budget: claimed in the ledger before they are pinned."""
    with _lock:
        return not _state["broken"] and budget.claim(held() + nbytes)[0]


def adopt(t, m: Mirror, epoch: int) -> bool:
    """Show a mirror made ahead for device tensor t to the next offload; or give its pages back (False):
    mirrors broke, an offload ran since `epoch` (it moved t its own way), or t got a mirror meanwhile."""
    with _lock:
        if not _state["broken"] and stats["offloads"] == epoch and wanted(t):
            m.ahead = True
            _link(_publish(m), t)
            return True
        stats["ahead_discarded"] += 1
    pages.unlock([m.host] if m.locked else [], log)
    return False


def _reuse(t, claimed: set):
    storage = t.untyped_storage()
    m = _by_device.get(id(storage))
    if m is None or m.device is None or m.device() is not storage or id(m) in claimed:
        return None  # not a tensor our restore made, or a second slot holding it (the original copies twice)
    if _layout(t) != m.layout or _held(m):
        stats["replaced"] += 1
        _drop([m])
        return None
    claimed.add(id(m))
    stats["reused"] += 1
    stats["ahead_used"] += m.ahead
    m.ahead = False
    return m


def _link(m: Mirror, device_tensor) -> None:
    _unlink(m)
    storage = device_tensor.untyped_storage()
    m.device, m.device_id, m.layout = weakref.ref(storage), id(storage), _layout(device_tensor)
    _by_device[m.device_id] = m


def _unlink(m: Mirror) -> None:
    if m.device_id is not None and _by_device.get(m.device_id) is m:
        del _by_device[m.device_id]
    m.device = m.device_id = None


def _sweep() -> None:
    """Drop mirrors nothing reaches: no slot holds them and their restored tensor is gone."""
    gone = [m for m in _mirrors.values() if (m.device is None or m.device() is None) and not _held(m)]
    if gone:
        _drop(gone)


def _drop(mirrors) -> None:
    pages.unlock([m.host for m in mirrors if m.locked], log)
    for m in mirrors:
        _unlink(m)
        _mirrors.pop(id(m.host.untyped_storage()), None)
        m.locked = False
        stats["dropped"] += 1


def drop_all() -> None:
    """Let go of every mirror (interpreter exit: unlock while the CUDA context still exists)."""
    with _lock:
        _drop(list(_mirrors.values()))


def broke(where: str, exc) -> bool:
    """Page-locking failed (at an offload, or ahead of one): mirrors off for good in this process."""
    with _lock:
        _state["broken"] = str(exc)
        drop_all()
        return fallback(where, "page-lock", f"{exc}; mirrors stay off in this process")


def fallback(where: str, kind: str, why: str) -> bool:
    stats["fallbacks"] += 1
    stats["over_budget"] += kind == "budget"
    stats["last_fallback"] = f"{where}: {why}"
    if kind not in _warned:
        _warned.add(kind)
        log.warning("colo_shim: offload mirrors not used for %s: %s; the original copy runs (slower, same values)",
                    where, why)
    return False


def held(kind: str = "optimizer") -> int:
    return sum(m.nbytes for m in _mirrors.values() if m.kind == kind)


def mode() -> str:
    if _state["broken"]:
        return f"original path: {_state['broken']}"
    if pages.host.ready():
        return "page-locked mirrors"
    return "pageable mirrors (CUDA not initialized in this process: nothing to page-lock with)"


def report() -> dict:
    with _lock:
        locked = sum(m.nbytes for m in _mirrors.values() if m.locked)
        return dict(stats, **pages.stats, **budget.report(), mode=mode(), mirrors=len(_mirrors),
                    mirror_gib=round(held() / GIB, 4), buffer_mirror_gib=round(held("buffer") / GIB, 4),
                    page_locked_gib=round(locked / GIB, 4))
