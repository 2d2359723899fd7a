"""How much host memory the offload mirrors may keep, and what `colo-shim doctor` says about them.

The original offload frees its host copies at every reload; mirrors stay allocated while the
trainer trains, when checkpoint staging, vLLM's level-1 backup and data loaders want host memory
too, and page-locked memory cannot be swapped out. So a rank's optimizer mirrors are capped:
COLO_SHIM_OFFLOAD_HOST_GIB (GiB per rank), else SHARE of the node's MemAvailable divided by the
ranks the launcher says share the node (core/node.py), measured once, before the rank's first
mirror, so every rank of a node sees the same number. Over the cap, the offload takes the original
path (mirrors.py). Whether the family is on by default waits on the H200 host peak (issue 23: at
most 1 GiB above the same job without it); doctor says which way it is set and what it would cost.
Read from /proc and the environment only: doctor imports nothing heavy.
"""

from __future__ import annotations

from colo_shim.core import config, node

GIB = float(1 << 30)
SHARE = 0.5
_measured: list = []  # the first share computed in this process


def limit(held: int = 0) -> tuple:
    """(bytes this rank's optimizer mirrors may hold, where that number comes from).

    DDP buffer mirrors do not count: upstream keeps a page-locked copy of that size anyway.
    """
    gib = config.get(config.OFFLOAD_HOST_GIB)
    if gib is not None:
        return int(gib * GIB), f"{config.OFFLOAD_HOST_GIB}={gib:g}"
    if not _measured:
        _measured.append(share(held))
    return _measured[0]


def share(held: int = 0) -> tuple:
    avail, ranks = node.mem_available(), node.local_ranks()
    if avail is None:
        return 1 << 62, "MemAvailable unknown: no budget"
    count = ranks["count"] or 1
    return (int(SHARE * (avail + held) / count),
            f"{SHARE:g} x MemAvailable {avail / GIB:.1f} GiB / {count} ranks ({ranks['source']})")


def measured():
    return _measured[0] if _measured else None


def rows(default: str) -> list[dict]:
    """Doctor rows for the family `offload`: the switch, and the host memory mirrors may take per rank."""
    switch = config.get(config.OFFLOAD)
    explicit = config.get(config.OFFLOAD_HOST_GIB) is not None
    cap, source = limit() if explicit else share()
    return [
        dict(name="offload", target=f"{config.OFFLOAD} (page-locked optimizer mirrors)", status=switch,
             reason=(f"default {default}; mirrors keep the offloaded optimizer state in host memory while "
                     "training (the original frees it at each reload): host memory while training rises by "
                     "that much (the node's peak rose 0.89 GiB on the H200); set it off where that memory is "
                     "short" if switch == "on" else f"default {default}; the original pageable copies run")),
        dict(name="offload", target=f"{config.OFFLOAD_HOST_GIB} (host budget per rank)",
             status=f"{cap / GIB:.1f} GiB" if cap < 1 << 62 else "none",
             reason=f"{source}; an offload whose mirrors would go beyond it copies the original way (one warning)"),
    ]
