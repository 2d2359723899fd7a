"""Patch family `megatron`: fence async checkpoints before training storage is replaced.

Every entry point that offloads or swaps training storage (megatron-core buffers, DDP grad
buffers, optimizers; NeMo-RL's Megatron policy worker in each module layout v0.3 .. main) runs
colo_shim.fence() first, so no in-flight save or cached writer pins the old GPU storage or later
writes it. The entry points that bring storage back re-warm a writer that the `restart` release
strategy ended. Queue constructors are tracked because megatron-core's own queue and
Megatron-Bridge's GlobalState have no instance registry.

NeMo-RL v0.3-v0.5 declare `@ray.remote class MegatronPolicyWorker`, so the module attribute is a
Ray ActorClass; the plain class is reached through its `__ray_actor_class__`. From v0.6 the code
lives in MegatronPolicyWorkerImpl. Calls through the actor go through methods `@ray.remote`
captured before any patch; core/ray_actors.py makes them reach these wrappers, in the driver and in
the actor process (where the pre-v0.6 class is a by-value copy). Where NeMo-RL's offload_before_refit/offload_after_refit
call finalize_async_save themselves (PR #3322) the shim stays out of them; main from #2828 to #3322 has the method
but offloads that never call it, and is fenced like a release (seen in the code, not the version); main's
finalize_async_save itself is wrapped so that, with the default release, the offloads neither wait
for the write nor end the writer (checkpoint/nemo_rl_main.py says exactly when), and in the driver
main's background wait asks the actors before it occupies them (checkpoint/nemo_rl_driver.py).
"""

from __future__ import annotations

from colo_shim.core import guard, versions
from colo_shim.core.registry import Patch, Target
from colo_shim.checkpoint import fence, nemo_rl_driver, nemo_rl_main, state


MCORE = "megatron-core"
BUF = "megatron.core.distributed.param_and_grad_buffer"
DDP = "megatron.core.distributed.distributed_data_parallel"
OPT = "megatron.core.optimizer.optimizer"
MC_ASYNC = "megatron.core.dist_checkpointing.strategies.async_utils"
BRIDGE = "megatron.bridge.training.state"
NEMO_OLD = "nemo_rl.models.policy.megatron_policy_worker"  # v0.3, v0.4
NEMO_NEW = "nemo_rl.models.policy.workers.megatron_policy_worker"  # v0.5 .. main
NEMO_POLICY = "nemo_rl.models.policy.lm_policy"  # the driver's Policy
NEMO_GROUPS = "nemo_rl.distributed.worker_groups"


def declaration() -> Patch:
    """The family as the registry sees it; built at the end of this module, once the wrappers exist."""
    return Patch(
        name="megatron",
        summary="offloading training storage while an async checkpoint save or cached writer pins it",
        targets=(
            Target(BUF, "_ParamAndGradBuffer.offload_to_cpu", _fence_before("_ParamAndGradBuffer.offload_to_cpu"),
                   MCORE, ">=0.16"),
            Target(BUF, "_ParamAndGradBuffer.reload_from_cpu", _rewarm_after("_ParamAndGradBuffer.reload_from_cpu"),
                   MCORE, ">=0.16"),
            Target(DDP, "DistributedDataParallel.offload_grad_buffers",
                   _fence_before("DistributedDataParallel.offload_grad_buffers"), MCORE, ">=0.16"),
            Target(OPT, "MegatronOptimizer.offload_to_cpu", _fence_before("MegatronOptimizer.offload_to_cpu"),
                   MCORE, ">=0.15"),
            Target(OPT, "ChainedOptimizer.offload_to_cpu", _fence_before("ChainedOptimizer.offload_to_cpu"),
                   MCORE, ">=0.15"),
            Target(OPT, "MegatronOptimizer.restore_from_cpu", _rewarm_after("MegatronOptimizer.restore_from_cpu"),
                   MCORE, ">=0.15"),
            Target(OPT, "ChainedOptimizer.restore_from_cpu", _rewarm_after("ChainedOptimizer.restore_from_cpu"),
                   MCORE, ">=0.15"),
            Target(MC_ASYNC, "AsyncCallsQueue.__init__", _tracking("track_queue", "megatron-core queue"), MCORE, ">=0.12"),
            Target(BRIDGE, "GlobalState.__init__", _tracking("track_holder", "Megatron-Bridge state"), "megatron-bridge", "",
                   required=False),
            *_nemo_targets(NEMO_OLD, "MegatronPolicyWorker.__ray_actor_class__"),
            *_nemo_targets(NEMO_NEW, "MegatronPolicyWorker.__ray_actor_class__", extra_fixed=_impl_layout),
            *_nemo_targets(NEMO_NEW, "MegatronPolicyWorkerImpl"),
            Target(NEMO_NEW, "MegatronPolicyWorkerImpl.finalize_async_save", nemo_rl_main.finalize_async_save, None, "",
                   required=False),  # NeMo-RL main only (PR #3322); target-missing before
            Target(NEMO_POLICY, "Policy.finalize_async_save", nemo_rl_driver.wait_off_actor, None, "",
                   required=False),  # the driver's side of the same: checkpoint/nemo_rl_driver.py
            *(Target(NEMO_GROUPS, f"RayWorkerGroup.{m}", nemo_rl_driver.atomic_send, None, "", required=False)
              for m in nemo_rl_driver.SEND_METHODS),
        ),
        report=_report,
    )


def _nemo_targets(module: str, cls: str, extra_fixed=None) -> tuple:
    def t(name, wrapper, fixed=extra_fixed):
        return Target(module, f"{cls}.{name}", wrapper, None, "", upstream_fixed=fixed, required=False)

    def offload(name):
        fixed = _either(*(f for f in (extra_fixed, _offload_finalizes(name)) if f))
        return t(name, _fence_before(f"{where}.{name}"), fixed)

    where = f"nemo_rl {cls.split('.')[0]}"
    return (
        offload("offload_before_refit"),
        offload("offload_after_refit"),
        t("move_model", _fence_before(f"{where}.move_model(cpu)", device_arg=1)),
        t("move_optimizer", _fence_before(f"{where}.move_optimizer(cpu)", device_arg=0)),
        t("prepare_for_lp_inference", _fence_before(f"{where}.prepare_for_lp_inference")),
        t("prepare_for_training", _rewarm_after(f"{where}.prepare_for_training")),
    )


def _offload_finalizes(method: str):
    """PR #3322 made each refit offload call finalize_async_save first. The method alone is no evidence: main had
    it from #2828 on, 83 commits before, with offloads that never call it (the window colo-shim must fence)."""

    def check(module):
        impl = getattr(module, "MegatronPolicyWorkerImpl", None)
        if impl is not None and versions.calls(getattr(impl, method, None), "finalize_async_save"):
            return f"NeMo-RL's {method} finalizes the async save itself (PR #3322)"
        return None

    return check


def _impl_layout(module):
    if hasattr(module, "MegatronPolicyWorkerImpl"):
        return "covered by the MegatronPolicyWorkerImpl targets (NeMo-RL >= v0.6 layout)"
    return None


def _either(*checks):
    def check(module):
        for fn in checks:
            found = fn(module)
            if found:
                return found
        return None

    return check


def _fence_before(reason: str, device_arg: int | None = None):
    """Wrapper running the fence first; with device_arg, only when moving to the CPU."""

    def wrapper(wrapped, instance, args, kwargs):
        if device_arg is not None:
            device = kwargs.get("device", args[device_arg] if len(args) > device_arg else None)
            if not str(device).startswith("cpu"):
                return wrapped(*args, **kwargs)
        fence.guarded(reason)
        return wrapped(*args, **kwargs)

    return wrapper


def _rewarm_after(reason: str):
    def wrapper(wrapped, instance, args, kwargs):
        result = wrapped(*args, **kwargs)
        guard.step(f"megatron: re-warm after {reason}", fence.rewarm, reason)
        return result

    return wrapper


def _tracking(register: str, what: str):
    """Wrapper for a constructor: hand the new object to fence.<register>."""

    def wrapper(wrapped, instance, args, kwargs):
        result = wrapped(*args, **kwargs)
        guard.step(f"megatron: track {what}", getattr(state, register), instance)
        return result

    return wrapper


def _report() -> dict:
    return {**state.totals(), **nemo_rl_main.report(), **nemo_rl_driver.report()}


PATCH = declaration()
