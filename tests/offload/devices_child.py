"""Child: the mirrors' copies are waited for on every device their tensors live on (issue 32 item 5b).

Real megatron-core's distributed optimizer (mcore_child.py's model, on harness/fake_cuda's CPU stand-in
for CUDA) with families offload + megatron and the page-locking recorder, whose `synced` lists the
device of each synchronize colo-shim asked for (None: the calling thread's current one, which
torch.cuda.synchronize() alone waits for). Case `two`: half the optimizer state moved to cuda:1, as
a process driving two GPUs holds it; case `other`: all of it on cuda:1 while nothing made that the
current device (a thread's starts at 0). Each case offloads through ChainedOptimizer.offload_to_cpu
and restores through restore_from_cpu (megatron's `.cuda()`: the current device, cuda:0 here), and
checks the values both ways. The moved tensors are new storages, so their old mirrors are dropped at the
offload: that unregistering synchronizes the current device first (None), as before. Prints one JSON line.
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("COLO_SHIM_OFFLOAD", "on")

import torch  # noqa: E402

from harness.fake_cuda import FakeCuda, PageLocks  # noqa: E402
from mcore_child import build, init, same, slots  # noqa: E402


def place(st, every: int, params: bool = False) -> list:
    """Move every `every`-th optimizer state tensor (and with `params` the main params) to cuda:1; the
    devices of all the slots the offload will move."""
    n = 0
    for inner in st.opt.chained_optimizers:
        for p in (p for g in inner.optimizer.param_groups for p in g["params"]) if params else ():
            p.data = p.data.to("cuda:1")
        for state in inner.optimizer.state.values():
            for key, value in state.items():
                if torch.is_tensor(value):
                    if n % every == 0:
                        state[key] = value.to("cuda:1")
                    n += 1
    return sorted({t.device.index for t in slots(st, "chained")})


def case(st, seam, every: int, params: bool = False) -> dict:
    from colo_shim.offload import mirrors

    with FakeCuda():
        out = {"devices": place(st, every, params)}
        before = [t.clone() for t in slots(st, "chained")]
        del seam.synced[:]
        st.opt.offload_to_cpu()
        out["offload_synced"] = list(seam.synced)
        out["offload_equal"] = same(before, slots(st, "chained"))
        out["on_host"] = not any(t.is_cuda for t in slots(st, "chained"))
        del seam.synced[:]
        st.opt.restore_from_cpu()
        out["restore_synced"] = list(seam.synced)
        out["restore_equal"] = same(before, slots(st, "chained"))
    out["fallbacks"] = mirrors.report()["fallbacks"]
    return out


def main():
    init()
    import colo_shim
    from colo_shim.offload import pages

    colo_shim.install(["offload", "megatron"])
    seam = pages.host = PageLocks()
    st = build()
    print(json.dumps({"two": case(st, seam, 2), "other": case(st, seam, 1, params=True)}))


if __name__ == "__main__":
    main()
