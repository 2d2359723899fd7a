"""The pinned-host-memory release on a torch without `torch.cuda.host_memory_stats`.

torch 2.6.0 has `torch._C._host_emptyCache` but not `torch.cuda.host_memory_stats` (checked in
the 2.6.0 wheel: torch/cuda/memory.py defines no host_memory_stats, libtorch_python.so registers
_host_emptyCache). The test venv's torch is newer, so the child deletes the attribute from the
real torch before the release runs; everything else is the real torch.
"""

from helpers import last_json, run_python

CHILD = """
import json, sys, torch
import torch.cuda.memory
if sys.argv[1] == "old-torch":
    del torch.cuda.host_memory_stats
    del torch.cuda.memory.host_memory_stats
calls = []
real = torch._C._host_emptyCache
def counted():
    calls.append(1)  # the real release still runs; this only counts that it was asked for
    return real()
torch._C._host_emptyCache = counted
from colo_shim.discard import host_memory as hm
engine = type("Engine", (), {})()
row = hm.release_rpc(None)
hm.note(engine, [row])
print(json.dumps({"row": row, "calls": len(calls), "report": hm.report(), "last": hm.last(engine)}))
"""


def test_release_runs_and_reports_rss_without_host_memory_stats():
    r = last_json(run_python(CHILD, args=["old-torch"], timeout=120))
    assert r["calls"] == 1, r
    row = r["row"]
    assert row["supported"] is True and row["measure"] == "rss", row
    assert row["rss_before"] > 0 and row["rss_after"] > 0 and row["released"] >= 0, row
    assert r["last"]["measure"] == "rss" and r["report"]["rss_measured"] == 1 and r["report"]["unsupported"] == 0, r


def test_with_host_memory_stats_the_allocator_is_asked():
    r = last_json(run_python(CHILD, args=["current-torch"], timeout=120))
    row = r["row"]
    if row["supported"]:  # a CUDA process: the allocator's own numbers
        assert row["measure"] == "allocator" and r["calls"] == 1, r
    else:  # no CUDA here: nothing pinned, nothing to release (as before)
        assert r["calls"] == 0 and r["report"]["unsupported"] == 1 and r["report"]["rss_measured"] == 0, r
