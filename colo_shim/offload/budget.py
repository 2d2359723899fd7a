"""How much host memory the offload mirrors may keep on a node, and what `colo-shim doctor` says about it.

The original offload frees its host copies at every reload; mirrors stay allocated while the
trainer trains, when checkpoint writers, vLLM's level-1 backup and data loaders want host memory
too, and page-locked memory cannot be swapped out: too much of it is how a node dies. The node is
what runs out, so the budget is the node's, shared by all colo-shim processes of a job on it:
COLO_SHIM_OFFLOAD_HOST_GIB GiB per node, else SHARE of MemAvailable (plus what the measuring
process already holds), fixed once by the first process that asks and kept in the node's ledger
(core/ledger.py), so the ranks agree on one number whenever each of them starts. Every optimizer
offload claims its mirrors there against the node's total, which counts:
- each process's optimizer mirrors (claimed: over the budget, the offload takes the original path);
- its DDP buffer mirrors (never refused: upstream page-locks a copy of that size anyway);
- its NVRx writer's host copies as checkpoint/state.py notes them: the bytes of the largest save
  sent to a persistent writer. A lower bound: torch's pinned allocator in the writer rounds blocks
  up and keeps them, and a non-persistent writer's copies (made in the trainer) are not noted.
Where no ledger can be made, each process takes the node's budget divided by the ranks its launcher
names on the node, else by the node's GPUs (core/node.py). Reads /proc and the environment only:
doctor imports nothing heavy.
"""

from __future__ import annotations

from colo_shim.core import config, ledger, node

GIB = float(1 << 30)
SHARE = 0.5
NONE = 1 << 62  # no budget: MemAvailable unknown
_alone: list = []  # without a ledger: this process's share, measured once
_seen: dict = {}  # the node as this process's last claim saw it


def node_budget() -> tuple:
    """(bytes, words): the node's budget as the process that fixes it computes it."""
    gib = config.get(config.OFFLOAD_HOST_GIB)
    if gib is not None:
        return int(gib * GIB), f"{config.OFFLOAD_HOST_GIB}={gib:g} (per node)"
    avail = node.mem_available()
    if avail is None:
        return NONE, "MemAvailable unknown: no budget"
    held = ledger.mine()  # already out of MemAvailable, and counted in the node's total
    return int(SHARE * (avail + held)), f"{SHARE:g} x (MemAvailable {avail / GIB:.1f} GiB + {held / GIB:.1f} GiB held)"


def claim(mirrors: int) -> tuple:
    """(may this process's optimizer mirrors hold `mirrors` bytes, why not in words)."""
    seen = ledger.claim("mirrors", mirrors, node_budget)
    if seen is None:
        cap, source = share()
        held = ledger.mine() - ledger.mine("mirrors") + mirrors
        if held <= cap:
            return True, ""
        return False, f"this process would hold {held / GIB:.3g} GiB, over its share of {cap / GIB:.3g} GiB ({source})"
    _seen.clear()
    _seen.update(seen)
    if seen["ok"]:
        return True, ""
    total = seen["total"] - ledger.mine("mirrors") + mirrors
    return False, (f"the node's colo-shim processes would hold {total / GIB:.3g} GiB, over the node's budget of "
                   f"{seen['budget'] / GIB:.3g} GiB ({_fixed(seen)})")


def settle(mirrors: int, buffers: int) -> None:
    """What this process holds after a call (mirrors dropped, a copy that failed part way)."""
    ledger.note("buffer", buffers)
    ledger.note("mirrors", mirrors)


def share() -> tuple:
    """Without a ledger: the node's budget over the ranks on it, measured once in this process."""
    if not _alone:
        cap, source = node_budget()
        count, how = ranks()
        why = ledger.error() or "none made yet"
        _alone.append((cap if cap >= NONE else cap // count, f"{source} / {count} ranks ({how}); no ledger: {why}"))
    return _alone[0]


def ranks() -> tuple:
    found = node.local_ranks()
    if not found["count"]:
        devices = node.devices()
        found = devices if devices["count"] else {"count": 1, "source": f"{found['source']}; {devices['source']}"}
    return found["count"], found["source"]


def limit() -> tuple:
    """(bytes, words): the node's budget now: the ledger's while its job runs, else what a first process would fix."""
    seen = ledger.peek()
    return (seen["budget"], _fixed(seen)) if seen else node_budget()


def _fixed(seen: dict) -> str:
    return f"{seen['source']}, fixed by pid {seen['fixed_by']} in {seen['path']}"


def report() -> dict:
    """This process's last view of the node, for status() and `doctor --from`."""
    if not _seen:
        return dict(budget_gib=None, budget_source=_alone[0][1] if _alone else None)
    return dict(budget_gib=round(_seen["budget"] / GIB, 3), budget_source=_fixed(_seen), ledger=_seen.get("path"),
                node_gib=round(_seen["total"] / GIB, 3), node_processes=_seen["processes"],
                node_refused=_seen["refused"])


def rows(default: str) -> list[dict]:
    """Doctor rows for the family `offload`: the switch, and the host memory the node's mirrors may take."""
    switch = config.get(config.OFFLOAD)
    seen = ledger.peek()
    cap, source = limit()
    if seen:
        now = (f"{seen['processes']} processes hold {seen['total'] / GIB:.1f} GiB (optimizer mirrors "
               f"{seen['mirrors'] / GIB:.1f}, DDP buffer mirrors {seen['buffer'] / GIB:.1f}, NVRx writers at least "
               f"{seen['writer'] / GIB:.1f}); offloads over the budget: {seen['refused']}, each took the original path")
    else:
        now = f"as a first process would fix it now: no job's ledger at {ledger.path()}"
    return [
        dict(name="offload", target=f"{config.OFFLOAD} (page-locked optimizer mirrors)", status=switch,
             reason=(f"default {default}; mirrors keep the offloaded optimizer state in host memory while "
                     "training (the original frees it at each reload): host memory while training rises by "
                     "that much (the node's peak rose 0.89 GiB on the H200); set it off where that memory is "
                     "short" if switch == "on" else f"default {default}; the original pageable copies run")),
        dict(name="offload", target=f"{config.OFFLOAD_HOST_GIB} (host budget per node)",
             status=f"{cap / GIB:.1f} GiB" if cap < NONE else "none",
             reason=f"{source}; {now}; an offload whose mirrors would go beyond it copies the original way "
                    "(one warning per process)"),
    ]
