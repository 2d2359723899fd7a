"""Checks on the shim's model after mcore_child.py's rounds: changed tensors get fresh mirrors, a
mirror held elsewhere is never written again, and every fallback (the node's budget taken by a
writer's host copies, knob off, family order, page-lock failure) leaves the values as the original
path does. Each check reports what it saw."""

import logging
import logging.handlers
import os

import torch

from harness.fake_cuda import FakeCuda, on_device
from mcore_child import same, slots, step


def _round(st, entry="chained", between=None):
    """offload -> (between) -> reload: host storages, whether every value came back, and what moved."""
    with FakeCuda():
        before = [t.clone() for t in slots(st, entry)]
        from mcore_child import move

        move(st, entry, True)
        hosts = slots(st, entry)
        seen = {"equal": same(before, hosts), "on_host": not any(on_device(t) for t in hosts),
                "ids": [id(t.untyped_storage()) for t in hosts], "mirrored": sum(map(_mirrored, hosts))}
        del hosts
        if between:
            between()
        move(st, entry, False)
        seen["restored"] = same(before, slots(st, entry)) and all(on_device(t) for t in slots(st, entry))
    return seen


def _mirrored(t) -> bool:
    from colo_shim.offload import mirrors

    m = mirrors._mirrors.get(id(t.untyped_storage()))
    return m is not None and m.host.untyped_storage() is t.untyped_storage()


def _state(st):
    return st.opt.chained_optimizers[0].optimizer.state


def run(st, seam, recorder) -> dict:
    from colo_shim.core import config
    from colo_shim.offload import mirrors

    log = logging.handlers.BufferingHandler(10_000)
    log.setLevel(logging.WARNING)
    logging.getLogger("colo_shim").addHandler(log)
    out, stats = {}, mirrors.stats
    base = _round(st)
    out["reuse"] = {"same_as_before": _round(st)["ids"] == base["ids"], "equal": base["equal"]}

    syncs = seam.syncs
    _round(st)
    out["syncs_per_round"] = seam.syncs - syncs  # one for the offload, one for the reload

    first = next(iter(_state(st).values()))
    kept, replaced = {}, stats["replaced"]
    held = _round(st, between=lambda: kept.update(t=first["exp_avg"], v=first["exp_avg"].clone()))
    step(st, 7)
    after = _round(st)
    out["held_elsewhere"] = {"kept_untouched": torch.equal(kept["t"], kept["v"]), "equal": after["equal"],
                             "one_fresh_mirror": len(set(after["ids"]) - set(held["ids"])) == 1,
                             "kept_not_reused": id(kept["t"].untyped_storage()) not in after["ids"],
                             "replaced": stats["replaced"] - replaced}
    del kept

    n = first["exp_avg"].numel()
    with FakeCuda():
        first["exp_avg"].resize_(n + 5)
        first["exp_avg"][n:] = 3.0
    fresh = stats["fresh"]
    resized = _round(st)
    fresh, again = stats["fresh"] - fresh, _round(st)
    with FakeCuda():
        first["exp_avg"].resize_(n)
    _round(st)
    out["resized"] = {"equal": resized["equal"], "restored": resized["restored"],
                      "fresh": fresh, "then_reused": again["ids"] == resized["ids"]}

    inner = st.opt.chained_optimizers[0].optimizer
    extra = _add_group(inner)
    fresh, reused = stats["fresh"], stats["reused"]
    group = _round(st)
    out["new_param_group"] = {"fresh": stats["fresh"] - fresh, "reused": stats["reused"] - reused,
                              "slots": len(group["ids"]), "equal": group["equal"], "restored": group["restored"]}
    _drop_group(inner, extra)
    del extra
    _round(st)  # its two mirrors are dropped here

    count, unlocked = len(mirrors._mirrors), seam.unregistrations
    _rebuild(inner)  # a reload that built new tensors: every state tensor replaced
    rebuilt = _round(st)
    out["new_tensors"] = {"equal": rebuilt["equal"], "restored": rebuilt["restored"], "mirrors_before": count,
                          "mirrors_after": len(mirrors._mirrors), "old_unlocked": seam.unregistrations - unlocked,
                          "state_tensors": sum(len(s) for s in inner.state.values())}

    from colo_shim.core import ledger

    # the node's budget was fixed at the first offload; a checkpoint writer's host copies (as
    # checkpoint/state.py notes NVRx's) now fill it, and the optimizer grows: what it already holds
    # stays its own, one more byte is refused
    ledger.note("writer", ledger.peek()["budget"])
    fallbacks, extra = stats["fallbacks"], _add_group(inner)
    over = _round(st)
    out["budget"] = {"equal": over["equal"], "restored": over["restored"], "fallbacks": stats["fallbacks"] - fallbacks,
                     "no_mirror_used": over["mirrored"] == 0, "warned": _said(log, "over the node's budget")}
    _drop_group(inner, extra)
    del extra
    ledger.note("writer", 0)

    os.environ[config.OFFLOAD] = "off"
    calls = stats["offloads"], stats["restores"]
    off = _round(st)
    out["knob_off"] = {"equal": off["equal"], "restored": off["restored"],
                       "untouched": (stats["offloads"], stats["restores"]) == calls,
                       "no_mirror_used": off["mirrored"] == 0}
    os.environ[config.OFFLOAD] = "on"  # back to what these checks run with (the default)

    import colo_shim
    from colo_shim.core import wrapping
    from megatron.core.optimizer.optimizer import ChainedOptimizer, MegatronOptimizer

    colo_shim.uninstall()  # outermost first: every original comes back, none left wrapped inert
    entries = [vars(cls)[name] for cls in (MegatronOptimizer, ChainedOptimizer)
               for name in ("offload_to_cpu", "restore_from_cpu")]
    originals = not any(isinstance(e, wrapping.ShimWrapper) for e in entries)
    colo_shim.install(["megatron"])
    colo_shim.install(["offload"])  # the other way round: the offload wrappers now sit outside the fence's
    calls, fallbacks, restores = stats["offloads"], stats["fallbacks"], stats["restores"]
    inverted = _round(st)
    out["order_inverted"] = {"equal": inverted["equal"], "restored": inverted["restored"],
                             "no_copy": stats["offloads"] == calls,
                             "restore_still_mirrored": stats["restores"] > restores,
                             "fallbacks": stats["fallbacks"] - fallbacks, "warned": _said(log, "would run after"),
                             "uninstall_restored_originals": originals}
    colo_shim.uninstall()
    colo_shim.install(["offload", "megatron"])
    _round(st)
    seam.fail = True
    _rebuild(inner)
    failed, again = _round(st), _round(st)
    out["page_lock_fails"] = {"equal": failed["equal"] and again["equal"], "restored": again["restored"],
                              "mode": mirrors.mode(), "mirrors_left": len(mirrors._mirrors),
                              "locked_left": len(seam.locked), "warned": _said(log, "cudaHostRegister")}
    out["warnings"] = _messages(log)
    return out


def _add_group(inner):
    """A parameter group added since the last offload (two tensors that need fresh mirrors)."""
    with FakeCuda():
        extra = torch.nn.Parameter(torch.randn(40).cuda())
        inner.add_param_group({"params": [extra]})
        inner.state[extra] = {"exp_avg": torch.randn(40, device="cuda")}
    return extra


def _drop_group(inner, extra):
    inner.param_groups.pop()
    del inner.state[extra]


def _rebuild(inner):
    with FakeCuda():
        for s in inner.state.values():
            for k, v in list(s.items()):
                s[k] = v.to("cuda", copy=True)


def _messages(log) -> list:
    return [record.getMessage() for record in log.buffer]


def _said(log, text) -> int:
    return sum(text in m for m in _messages(log))
