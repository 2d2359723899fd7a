"""A checkpoint saved while the optimizer state sits in colo-shim's page-locked mirrors (issue 32 item 5a).

`python offloaded_save.py saved_while_offloaded '{json}'`: real megatron-core (its distributed optimizer,
built and moved as tests/offload/mcore_child.py does, in harness/fake_cuda.FakeCuda on this CPU
machine), families offload + megatron + nvrx with a page-locking recorder (fake_cuda.PageLocks) in
place of the CUDA runtime, and real NVRx (the version on PYTHONPATH) with its persistent spawned
worker. The optimizer is offloaded (its slots now hold the mirrors' host tensors), those tensors are
saved asynchronously, and the save is finalized; then one more restore / offload / restore round.

Why: NVRx's persistent worker receives each request through a torch.multiprocessing queue, and torch
pickles a host tensor by moving its storage into shared memory in place: a mirror sent live would
point at new, pageable pages while its page-locked ones stay registered. The last stdout line is the
JSON result.
"""

import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "offload"))


def _ptrs(tensors) -> list:
    return [t.untyped_storage().data_ptr() for t in tensors]


def saved_while_offloaded(opts):
    import mcore_child
    import torch
    from harness.fake_cuda import FakeCuda, PageLocks

    mcore_child.init()
    import colo_shim

    colo_shim.install(opts.get("families", ["offload", "megatron", "nvrx"]))
    from colo_shim.cli import saver
    from colo_shim.offload import mirrors, pages

    seam = pages.host = PageLocks()
    st = mcore_child.build()
    with FakeCuda():
        st.opt.offload_to_cpu()
    host = mcore_child.slots(st, "chained")
    out = {"mirrors": len(mirrors._mirrors), "locked_at_offload": sum(p in seam.locked for p in _ptrs(host)),
           "slots": len(host),
           # NVRx < 0.7 clones a host tensor only when it is a view of a larger storage: these go live
           "whole_storage": sum(t.untyped_storage().nbytes() == t.numel() * t.element_size() for t in host)}
    before, values = _ptrs(host), [t.clone() for t in host]
    root = tempfile.mkdtemp()
    q = saver.make_queue(shm=True)
    saver.async_save(q, {f"t{i}": t for i, t in enumerate(host)}, f"{root}/ckpt", cached=True, shm=True)
    out["finalized"] = len(saver.finalize(q))
    after = _ptrs(host)
    out["moved"] = sum(a != b for a, b in zip(before, after))
    out["locked_after_save"] = sum(p in seam.locked for p in after)
    out["shared_after_save"] = sum(t.is_shared() for t in host)
    got = saver.load(f"{root}/ckpt", {f"t{i}": t for i, t in enumerate(values)})
    out["checkpoint_equal"] = all(torch.equal(got[f"t{i}"], v) for i, v in enumerate(values))
    out["state_unchanged"] = all(torch.equal(t, v) for t, v in zip(host, values))
    del host, got
    with FakeCuda():  # the next round: back to the device, to the same mirrors, back again
        st.opt.restore_from_cpu()
        out["restored_equal"] = mcore_child.same(values, mcore_child.slots(st, "chained"))
        st.opt.offload_to_cpu()
        host = mcore_child.slots(st, "chained")
        out["round_same_pages"] = _ptrs(host) == before
        out["round_locked"] = sum(p in seam.locked for p in _ptrs(host))
        out["round_offload_equal"] = mcore_child.same(values, host)
        del host
        st.opt.restore_from_cpu()
        out["round_restore_equal"] = mcore_child.same(values, mcore_child.slots(st, "chained"))
    report = mirrors.report()
    out.update({k: report[k] for k in ("reused", "replaced", "fallbacks", "mirrors")})
    out["registrations_held"] = len(seam.locked)  # one per mirror: none orphaned
    q.close()
    return out


if __name__ == "__main__":
    import entry

    entry.main(globals())
