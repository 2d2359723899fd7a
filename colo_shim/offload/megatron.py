"""Patch family `offload`: the colocated optimizer offload and reload copy at the bus's speed.

Every colocated step moves the trainer's optimizer state to host memory before the refit and back
before training. megatron-core and NeMo-RL move it tensor by tensor into fresh pageable memory,
each copy synchronous: on an H200, 10.52 GiB took 7.1-7.4 s out (1.6 GB/s) and 1.8-2.1 s back,
most of a colocated step. Into page-locked host tensors made once and reused, with async copies
and one synchronize, the same bytes took 0.22 s (issue 23; README "Optimizer offload").

So each entry point below first moves, through mirrors.py, exactly the tensors its own body
would move (the same walk, the same `is_cuda` test), then runs its own body, which finds nothing
left to move and does the rest as before (logging, `empty_cache`, whatever a later release adds).
What ends where is unchanged: the same slots hold host tensors after an offload and new device
tensors after a reload, the old device tensors are dropped as the original drops them.
- megatron-core `MegatronOptimizer.offload_to_cpu` / `restore_from_cpu`: main params (`p.data`)
  and optimizer state; `ChainedOptimizer`'s do all chained optimizers with one synchronize.
- megatron-core `_ParamAndGradBuffer.offload_to_cpu`: its first call makes the buffer's host copy
  with `.cpu().pin_memory()` (two copies, the second of pinned memory allocated then); here that
  copy starts page-locked, and upstream's own `copy_(non_blocking=True)` fills it. Later calls
  are upstream's, untouched. Not counted in the host budget: upstream keeps that copy anyway.
- NeMo-RL `MegatronPolicyWorker(Impl).move_optimizer(device)` (Adam state only), as each layout
  declares it (the same module layouts as the `megatron` family); Ray actor classes are reached
  by the registry (core/ray_actors.py).

The checkpoint fence (family `megatron`) must run before any of these copies: it makes checkpoint
writers let go of the storage being replaced. Neither family imports the other: core/families.py
lists `offload` before `megatron`, the registry wraps in that order, so the fence's wrapper is the
outer one; where a process installed them the other way round, a wrapper here sees a live colo-shim
wrapper still to run inside it and takes the original path instead (one warning).

Mirrors are made ahead of the offload that needs them where they can be (ahead.py: after an optimizer
step, in background threads), else at that offload. Host memory: mirrors stay while training,
bounded per node (budget.py). COLO_SHIM_OFFLOAD=off (or
COLO_SHIM_DISABLE=offload) turns mirrors off; the knob's default in core/config.py says whether they are on.
"""

from __future__ import annotations

import sys

from colo_shim.core import config, wrapping
from colo_shim.core import guard as shim
from colo_shim.core.registry import Patch, Target
from colo_shim.offload import ahead, mirrors

# on: in bench/e2e on the H200 (call 17) the node host peak rose 0.89 GiB (<= 1 GiB, issue 23) while
# offload_before_refit fell from 10.6 s to 0.56 s; the steady footprint while training rose 9.7 GiB
DEFAULT = config.KNOBS[config.OFFLOAD].default
# megatron-core: the same method bodies from 0.15 (notes) to 0.20.0 (Megatron-LM 14346b65, NeMo-RL main's
# pin); _ParamAndGradBuffer.offload_to_cpu from 0.16
MCORE, RANGE, BUF_RANGE = "megatron-core", ">=0.15,<0.21", ">=0.16,<0.21"
OPT, BUF = "megatron.core.optimizer.optimizer", "megatron.core.distributed.param_and_grad_buffer"
BUFFER = "_ParamAndGradBuffer.offload_to_cpu"
WORKER = "nemo_rl.models.policy.{}megatron_policy_worker"  # "" up to v0.4, "workers." from v0.5


def declaration() -> Patch:
    """The family as the registry sees it; built at the end of this module, once the wrappers exist."""
    return Patch(
        name="offload",
        summary="optimizer offload and reload copying at pageable-memory speed (1.6 GB/s of a 55 GB/s link)",
        targets=(
            _mcore("MegatronOptimizer.offload_to_cpu", _optimizer_slots, to_host=True),
            _mcore("MegatronOptimizer.restore_from_cpu", _optimizer_slots, to_host=False),
            _mcore("ChainedOptimizer.offload_to_cpu", _chained_slots, to_host=True),
            _mcore("ChainedOptimizer.restore_from_cpu", _chained_slots, to_host=False),
            Target(BUF, "_ParamAndGradBuffer.offload_to_cpu", _buffer_first_offload, MCORE, BUF_RANGE),
            _nemo(WORKER.format(""), "MegatronPolicyWorker.__ray_actor_class__"),  # v0.3, v0.4
            _nemo(WORKER.format("workers."), "MegatronPolicyWorker.__ray_actor_class__", fixed=_impl_layout),  # v0.5
            _nemo(WORKER.format("workers."), "MegatronPolicyWorkerImpl"),  # v0.6 .. main
        ),
        report=_report,
    )


def _mcore(attribute: str, walk, to_host: bool) -> Target:
    return Target(OPT, attribute, _entry(attribute, walk, to_host), MCORE, RANGE)


def _nemo(module: str, cls: str, fixed=None) -> Target:
    """move_optimizer(device): absent from some layouts (target-missing there, as in the megatron family)."""
    where = f"nemo_rl {cls.split('.')[0]}.move_optimizer"
    return Target(module, f"{cls}.move_optimizer", _entry(where, _nemo_slots, None), None, "", upstream_fixed=fixed,
                  required=False)


def _impl_layout(module):
    if hasattr(module, "MegatronPolicyWorkerImpl"):
        return "covered by the MegatronPolicyWorkerImpl target (NeMo-RL >= v0.6 layout)"
    return None


def on() -> bool:
    return config.get(config.OFFLOAD) == "on"


def _entry(where: str, walk, to_host):
    """Wrapper: move what the body would move through mirrors, then run the body.

    to_host None: NeMo-RL's move_optimizer, whose direction is its `device` argument.
    """
    def wrapper(wrapped, instance, args, kwargs):
        towards = to_host
        if towards is None:
            device = kwargs.get("device", args[0] if args else None)
            towards = {"cpu": True, "cuda": False}.get(device) if isinstance(device, str) else None
        if towards is not None:  # colo-shim's part never keeps the body from running, nor raises (core/guard.py)
            shim.step(f"offload: mirrors at {where}", _mirror, wrapped, instance, where, walk, towards)
        return wrapped(*args, **kwargs)

    return wrapper


def _mirror(wrapped, instance, where: str, walk, to_host: bool) -> None:
    if not _go(wrapped, where, to_host):
        return
    try:
        slots = walk(instance, to_host)
    except (AttributeError, KeyError, TypeError, StopIteration) as exc:  # a layout this walk does not know:
        mirrors.fallback(where, "error", f"{type(exc).__name__}: {exc}")  # the body moves everything
        return
    if to_host:  # mirrors being made ahead first; then have them made after each optimizer step
        ahead.settle()
        ahead.watch(instance, walk, on)
    (mirrors.offload if to_host else mirrors.restore)(slots, where)


def _go(wrapped, where: str, to_host: bool = True) -> bool:
    """Mirrors are on, and before an offload no other colo-shim wrapper (the fence) is still to run."""
    if not on():
        return False
    inner = wrapping.inner_keys(wrapped) if to_host else ()
    if inner:
        return mirrors.fallback(where, "order", f"{inner[0]} would run after the copy (installed before this "
                                                 "family: install both at once, COLO_SHIM=1)")
    return True


def _plain(t) -> bool:
    """Tensors the mirrors take; anything else (a DTensor, a subclass) is left to the body."""
    torch = sys.modules["torch"]
    return type(t) in (torch.Tensor, torch.nn.Parameter)


def _optimizer_slots(opt, to_host: bool) -> list:
    """What MegatronOptimizer.offload_to_cpu / restore_from_cpu move, found the way they find it."""
    inner = getattr(opt, "optimizer", None)
    if inner is None or getattr(opt, "is_stub_optimizer", False):
        return []
    slots = [(p, mirrors.DATA) for group in inner.param_groups for p in group["params"]
             if _plain(p) and p.is_cuda == to_host]
    return slots + [(state, k) for state in inner.state.values() for k, v in state.items()
                    if _plain(v) and v.is_cuda == to_host]


def _chained_slots(chained, to_host: bool) -> list:
    """Every chained optimizer that runs megatron-core's own method (an override would move its own way)."""
    name = "offload_to_cpu" if to_host else "restore_from_cpu"
    base = next(c for c in type(chained).__mro__ if c.__name__ == "MegatronOptimizer")
    return [slot for opt in chained.chained_optimizers if _defining(type(opt), name) is base
            for slot in _optimizer_slots(opt, to_host)]


def _defining(cls, name: str):
    return next((c for c in cls.__mro__ if name in vars(c)), None)


def _nemo_slots(worker, to_host: bool) -> list:
    """NeMo-RL's move_optimizer walk: a ChainedOptimizer's `state`, else `_get_state()` (Adam state only)."""
    opt = getattr(worker, "optimizer", None)
    if opt is None:
        return []
    if hasattr(opt, "chained_optimizers") or not hasattr(opt, "_get_state"):
        state = opt.state
    else:
        state = opt._get_state()
    return [(s, k) for _, s in state.items() for k, v in s.items() if _plain(v) and v.is_cuda == to_host]


def _buffer_first_offload(wrapped, instance, args, kwargs):
    """Upstream's first call pins `param_data.cpu()`: give it the page-locked copy to fill instead."""
    move_params = kwargs.get("move_params", args[0] if args else True)
    if move_params:
        shim.step(f"offload: mirrors at {BUFFER}", _buffer_mirror, wrapped, instance)
    return wrapped(*args, **kwargs)


def _buffer_mirror(wrapped, instance) -> None:
    data = getattr(instance, "param_data", None)
    if (data is not None and getattr(instance, "param_data_cpu", False) is None and _plain(data)
            and data.is_cuda and data.untyped_storage().nbytes() > 0 and _go(wrapped, BUFFER)):
        copy = mirrors.buffer_mirror(data, BUFFER)
        if copy is not None:
            instance.param_data_cpu = copy


def _report() -> dict:
    found = dict(mirrors.report(), on=on(), default=DEFAULT, made_ahead=ahead.report())
    if not found["on"]:
        found["mode"] = f"off ({config.OFFLOAD}=off): the original copies run"
    return found


PATCH = declaration()
