"""Patch family `vllm`: discard vLLM weights at finish_generation when, and only when, a refit follows.

NeMo-RL's colocated finish_generation always sleeps at level 1, copying every weight to pinned
CPU memory just before training - the job's CPU peak - although the refit overwrites them
before the next generation. This family adds `finish_generation(..., refit_pending=None)`:
True discards (level 2), False keeps, None lets colo-shim decide (COLO_SHIM_DISCARD=auto|always|
never; policy.py), and makes level 2 safe on every model (guard.py, coverage.py) and really
free host memory: the pinned level-1 backup that torch keeps cached after a wake-up is
returned before each level-2 sleep (host_memory.py).

Two processes take part. The driver (or the SyncRolloutActor) decides; the generation worker
owns the engine. The level cannot ride on `sleep()`: Ray checks actor-method arguments
against the signature recorded when `@ray.remote` ran, before any shim could add `level`. It
rides on the one worker method that accepts arbitrary keywords and forwards `tags` to the
engine: `wake_up(tags=["colo_shim:sleep_level=2", "colo_shim:site=..."])`. The engine-side
wrappers (vLLM's LLM / AsyncLLM, which every NeMo-RL layout calls the same way) consume those
tags; an engine without the shim receives a wake_up while awake, which vLLM ignores, and then
sleeps at level 1 - the safe outcome.

NeMo-RL's prepare_for_generation / finish_generation print and swallow worker exceptions, so the
driver keeps a mirror of what it discarded and raises ColoShimDiscardError itself when a wake-up
after an unrefitted discard fails.
"""

from __future__ import annotations

import contextvars
import inspect
import logging

from colo_shim.core import guard as shim
from colo_shim.core.registry import Patch, Target
from colo_shim.discard import coverage as cov
from colo_shim.discard import guard, policy
from colo_shim.discard import host_memory as hm

log = logging.getLogger("colo_shim.vllm")

GEN_V3 = "nemo_rl.models.generation.vllm"
GEN = "nemo_rl.models.generation.vllm.vllm_generation"
WORKER = "nemo_rl.models.generation.vllm.vllm_worker"
WORKER_ASYNC = "nemo_rl.models.generation.vllm.vllm_worker_async"
LLM_MOD = "vllm.entrypoints.llm"
ASYNC_MOD = "vllm.v1.engine.async_llm"
VLLM_RANGE = ">=0.7.0"
UPDATE_METHODS = ("update_weights_via_ipc_zmq", "update_weights_from_collective", "update_weights_from_ipc_handles")

DECIDE = "vllm: finish_generation sleep-level decision"
STEPS = "vllm: in-worker steps before a level-2 sleep"
RECORD = "vllm: coverage recording around a refit"
_busy = contextvars.ContextVar("colo_shim_vllm_busy", default=False)


def declaration() -> Patch:
    """The family as the registry sees it; built at the end of this module, once the wrappers exist."""
    return Patch(
        name="vllm",
        summary="colocated finish_generation copies every vLLM weight to CPU although a refit overwrites them",
        targets=tuple(_driver_targets() + _engine_targets()),
        report=_report,
    )


def _driver_targets():
    out = []
    for module, fixed, updates in ((GEN_V3, _package_layout, ("update_weights_from_ipc_handles", "update_weights_from_collective")),
                                   (GEN, None, ("update_weights_via_ipc_zmq", "update_weights_from_collective"))):
        out.append(Target(module, "VllmGeneration.finish_generation", _finish, upstream_fixed=fixed, required=False))
        out.append(Target(module, "VllmGeneration.prepare_for_generation", _prepare, upstream_fixed=fixed, required=False))
        out += [Target(module, f"VllmGeneration.{m}", _update, upstream_fixed=fixed, required=False) for m in updates]
    for module, name in (("nemo_rl.algorithms.grpo", "validate"), ("nemo_rl.algorithms.distillation", "validate"),
                         ("nemo_rl.algorithms.ppo", "validate"), ("nemo_rl.algorithms.grpo_sync", "validate_sync")):
        out.append(Target(module, name, _validate, required=False))
    out.append(Target(WORKER, "VllmGenerationWorkerImpl.sleep", _worker_sleep, required=False))
    out.append(Target(WORKER_ASYNC, "VllmAsyncGenerationWorkerImpl.sleep_async", _worker_sleep, required=False))
    return out


def _engine_targets():
    out = []
    for module, cls in ((LLM_MOD, "LLM"), (ASYNC_MOD, "AsyncLLM")):
        for name, wrapper in (("sleep", _engine_sleep), ("wake_up", _engine_wake),
                              ("generate", _engine_generate), ("collective_rpc", _engine_rpc)):
            out.append(Target(module, f"{cls}.{name}", wrapper, distribution="vllm", versions=VLLM_RANGE,
                              required=False))
    return out


def _package_layout(module):
    """v0.4+: `nemo_rl.models.generation.vllm` is a package re-exporting VllmGeneration."""
    if hasattr(module, "__path__"):
        return f"v0.4+ package layout: VllmGeneration is patched in {GEN}"
    return None


# ----------------------------------------------------------------------------- driver side

def _finish(wrapped, instance, args, kwargs):
    kwargs = dict(kwargs)
    refit_pending = kwargs.pop("refit_pending", None)
    colocated = policy.read(instance, "cfg", "colocated", "enabled")  # never raises; unreadable: untouched
    if _busy.get() or colocated is policy.MISSING or not colocated:  # non-colocated: prefix-cache reset
        return wrapped(*args, **kwargs)
    token = _busy.set(True)
    try:
        decision = shim.step(DECIDE, _decide, instance, refit_pending)
        if decision is None:  # contained (core/guard.py): keep; a request sent before the error must not stay
            _cancel(instance)
            decision = policy.Decision(1, "shim error, kept", "error", "unknown")
        shim.step("vllm: recording a finish_generation decision", policy.record, instance, decision)
        log.debug("colo_shim.vllm: finish_generation level %d (%s) at %s", decision.level, decision.reason, decision.site)
        done = False
        try:
            result = wrapped(*args, **kwargs)
            done = result is not False
            return result
        finally:
            if decision.level >= 2 and not done:  # the sleep did not run: withdraw its request
                _cancel(instance)
    finally:
        _busy.reset(token)


def _decide(instance, refit_pending) -> policy.Decision:
    decision = policy.decide(instance, refit_pending)
    if decision.level >= 2:
        tags = [f"{guard.CONTROL}sleep_level={decision.level}", f"{guard.CONTROL}site={decision.site}"]
        if instance.prepare_for_generation(tags=tags) is False:
            _cancel(instance)  # some workers may hold the request: it must not reach a later sleep
            decision = policy.Decision(1, "could not reach the workers; kept", "error", decision.site)
    return decision


def _cancel(instance) -> None:
    """The engine also drops a request at its next wake-up, generate or refit: a failure here is only counted."""
    shim.step("vllm: withdrawing a sleep request", instance.prepare_for_generation, tags=[f"{guard.CONTROL}cancel"])


def _prepare(wrapped, instance, args, kwargs):
    tags = kwargs.get("tags")
    if guard.is_control(tags):
        return wrapped(*args, **kwargs)
    result = wrapped(*args, **kwargs)
    if tags is None or "kv_cache" in tags:  # the discard error is the job's (documented), anything else the shim's
        shim.step("vllm: discarded-weights check after prepare_for_generation", _after_prepare, instance, tags,
                  result, passthrough=guard.ColoShimDiscardError)
    return result


def _after_prepare(instance, tags, result) -> None:
    entry = policy.discard_entry(instance)
    if entry is not None and result is False:
        since = ("and the weight update since did not restore them" if entry["refit"]
                 else "with no weight update since")
        raise guard.ColoShimDiscardError(
            f"colo-shim: prepare_for_generation(tags={tags!r}) failed on vLLM workers whose weights were "
            f"discarded (level-2 sleep) by the finish_generation at {entry['site']}, {since}; generating "
            f"now would use garbage weights. {guard.way_out(entry['site'])}")
    if result:
        policy.clear(instance)


def _update(wrapped, instance, args, kwargs):
    result = wrapped(*args, **kwargs)
    shim.step("vllm: noting a refit", policy.note_refit, instance)
    return result


def _validate(wrapped, instance, args, kwargs):
    result = wrapped(*args, **kwargs)
    shim.step("vllm: noting a validation", policy.mark_validated)
    return result


def _worker_sleep(wrapped, instance, args, kwargs):
    """v0.7 Impl classes: `sleep(level=N)` / `sleep_async(level=N)` for callers in the worker's process
    (inside the Ray actor too, via core/ray_actors.py); `.remote(level=N)` is refused by Ray's own
    signature check before it gets here."""
    kwargs = dict(kwargs)
    level = kwargs.pop("level", None)
    if level is not None and getattr(instance, "llm", None) is not None:
        shim.step("vllm: worker sleep-level request", _request, instance, level)
    return wrapped(*args, **kwargs)


def _request(worker, level) -> None:
    guard.request(guard.state_for(worker.llm), int(level), f"{type(worker).__name__}.sleep(level={level})")


# ----------------------------------------------------------------------------- engine side

def _engine_sleep(wrapped, instance, args, kwargs):
    asked = args[0] if args else kwargs.get("level", 1)
    kw = {k: v for k, v in kwargs.items() if k != "level"}
    planned = shim.step("vllm: planning a sleep", _plan, instance, asked)
    if planned is None:  # contained: the caller's own sleep, as without colo-shim
        return wrapped(*args, **kwargs)
    st, level, steps, reason = planned
    if inspect.iscoroutinefunction(wrapped):
        async def run():
            lvl, why = level, reason
            if not await shim.step_async(STEPS, _steps_async(instance, st, steps), default=False):
                lvl, why = guard.fallback(st), "shim error, kept"
            if lvl >= 2:  # issue 9: a level-1 backup cached earlier would cancel the discard's saving
                await shim.step_async(hm.WHAT, hm.release_async(instance))
            out = await wrapped(*args[1:], level=lvl, **kw)
            shim.step("vllm: recording a sleep", guard.after_sleep, st, lvl, why)
            return out
        return run()
    if not shim.step(STEPS, _steps, instance, st, steps, default=False):
        level, reason = guard.fallback(st), "shim error, kept"
    if level >= 2:
        shim.step(hm.WHAT, hm.release, instance)
    out = wrapped(*args[1:], level=level, **kw)
    shim.step("vllm: recording a sleep", guard.after_sleep, st, level, reason)
    return out


def _plan(engine, asked) -> tuple:
    st = guard.state_for(engine)
    return (st, *guard.plan_sleep(st, asked))


def _steps(engine, st, steps) -> bool:
    guard.after_steps(st, [engine.collective_rpc(fn, args=a) for fn, a in steps])
    return True


async def _steps_async(engine, st, steps) -> bool:
    guard.after_steps(st, [await engine.collective_rpc(fn, args=a) for fn, a in steps])
    return True


def _engine_wake(wrapped, instance, args, kwargs):
    tags = args[0] if args else kwargs.get("tags")
    st = guard.state_for(instance)
    is_async = inspect.iscoroutinefunction(wrapped)
    if guard.is_control(tags):
        guard.control(st, tags)
        if is_async:
            async def nothing():
                return None
            return nothing()
        return None
    steps = guard.before_wake(st, tags)  # raises ColoShimDiscardError rather than wake on garbage
    if is_async:
        async def run():
            for fn, a in steps:
                await instance.collective_rpc(fn, args=a)
            out = await wrapped(*args, **kwargs)
            for fn, a in cov.wake_steps(st, tags):  # before the refit, so its post-processing wins
                await instance.collective_rpc(fn, args=a)
            guard.after_wake(st, tags)
            return out
        return run()
    for fn, a in steps:
        instance.collective_rpc(fn, args=a)
    out = wrapped(*args, **kwargs)
    for fn, a in cov.wake_steps(st, tags):
        instance.collective_rpc(fn, args=a)
    guard.after_wake(st, tags)
    return out


def _engine_generate(wrapped, instance, args, kwargs):
    guard.check_generate(guard.state_for(instance))
    return wrapped(*args, **kwargs)


def _engine_rpc(wrapped, instance, args, kwargs):
    method = args[0] if args else kwargs.get("method")
    if not (isinstance(method, str) and method.startswith("update_weights")):
        return wrapped(*args, **kwargs)
    st = guard.state_for(instance)
    if inspect.iscoroutinefunction(wrapped):
        async def run():
            began = await shim.step_async(RECORD, instance.collective_rpc(cov.begin_record_rpc))
            result = await wrapped(*args, **kwargs)
            records = await shim.step_async(RECORD, instance.collective_rpc(cov.end_record_rpc)) if began else None
            shim.step("vllm: noting a weight update", guard.after_update, st, result, records)
            return result
        return run()
    began = shim.step(RECORD, instance.collective_rpc, cov.begin_record_rpc)
    result = wrapped(*args, **kwargs)
    records = shim.step(RECORD, instance.collective_rpc, cov.end_record_rpc) if began else None
    shim.step("vllm: noting a weight update", guard.after_update, st, result, records)
    return result


def _report() -> dict:
    return {**policy.report(), "engines": guard.report(), "host_memory": hm.report()}


PATCH = declaration()
