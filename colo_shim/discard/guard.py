"""Engine-side state: which sleep level really ran, and never generating on discarded weights.

This runs in the process that owns the vLLM engine object (the NeMo-RL generation worker),
which is not the driver that decided to discard. The driver's request arrives as control tags
on a wake_up call (see discard/vllm.py for why), and the engine checks here whether discarding
is correct for *this* worker: vLLM version, refit coverage known and stable. It falls back to
level 1 whenever it is not, because keeping is always correct and discarding is not.

Upstream's level-2 attempt (NeMo-RL #2495) had no such tracking, so a finish without a
following refit produced garbage silently (vLLM #29341). Here a level-2 sleep marks the engine
discarded; only a successful weight update clears it; a kv_cache/full wake-up or a generate
call before that raises ColoShimDiscardError naming the finish call site and the way out.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections import Counter

from colo_shim.core import versions
from colo_shim.discard import coverage as cov

log = logging.getLogger("colo_shim.vllm")

CONTROL = "colo_shim:"
BUFFERS_SAVED = (0, 8, 5)   # vLLM PR #16889: named buffers survive level 2
PRESERVE_NAMES = (0, 31)    # sleep_preserve_parameter_names


class ColoShimDiscardError(RuntimeError):
    """The shim discarded weights and cannot restore them correctly."""


def way_out(site: str) -> str:
    where = f"the finish_generation call at {site}" if site else "that finish_generation call"
    return f"Way out: set COLO_SHIM_DISCARD=never, or pass refit_pending=False to {where}."


def vllm_version() -> tuple[int, ...] | None:
    raw = versions.installed_version("vllm")
    if not raw:
        return None
    parts = []
    for piece in raw.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts) or None


class EngineState:
    def __init__(self, engine):
        self.kind = type(engine).__name__
        self.pending_level: int | None = None
        self.pending_site = ""
        self.asleep: set[str] = set()  # vLLM's sleeping tags as the wrappers saw them
        self.discarded = False
        self.site = ""
        self.origin = ""
        self.updated = False
        self.preserve_mode: str | None = None
        self.preserved_names: list[str] = []
        self.preserved_bytes = 0
        self.coverage = cov.Coverage()
        self.levels: Counter = Counter()
        self.reasons: Counter = Counter()
        self.guard_errors = 0
        self.warned_change = False
        self.history: list[dict] = []  # per sleep: level, reason, CPU bytes the shim itself holds
        self.host_memory = None  # host_memory._Record once a level-2 sleep returned pinned blocks

    def report(self) -> dict:
        return {
            "engine": self.kind,
            "sleeps": {f"level{k}": v for k, v in sorted(self.levels.items())},
            "reasons": dict(self.reasons),
            "discarded_now": self.discarded,
            "asleep": sorted(self.asleep),
            "coverage": self.coverage.state,
            "uncovered_names": self.coverage.uncovered(),
            "preserve_mode": self.preserve_mode,
            "preserved_names": self.preserved_names,
            "preserved_bytes": self.preserved_bytes,
            "weights_bytes": self.coverage.total_bytes(),
            "guard_errors": self.guard_errors,
            "history": self.history[-64:],
        }


_lock = threading.Lock()
_states: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def state_for(engine, create: bool = True) -> EngineState | None:
    with _lock:
        st = _states.get(engine)
        if st is None and create:
            st = _states[engine] = EngineState(engine)
        return st


def states() -> list[EngineState]:
    with _lock:
        return list(_states.values())


def report() -> list[dict]:
    return [st.report() for st in states()]


def is_control(tags) -> bool:
    return bool(tags) and all(isinstance(t, str) and t.startswith(CONTROL) for t in tags)


def control(st: EngineState, tags) -> None:
    """Driver's request for the next sleep: colo_shim:sleep_level=N, colo_shim:site=..., colo_shim:cancel."""
    for tag in tags:
        key, _, value = tag[len(CONTROL):].partition("=")
        if key == "sleep_level":
            st.pending_level = int(value)
        elif key == "site":
            st.pending_site = value
        elif key == "cancel":  # the finish that sent the request failed before its sleep
            expire(st)


def expire(st: EngineState) -> None:
    """A request belongs to the sleep right after it: anything else in between means its finish
    failed, and a stale level 2 must not reach a later sleep that was meant to keep."""
    st.pending_level, st.pending_site = None, ""


def request(st: EngineState, level: int, site: str) -> None:
    st.pending_level, st.pending_site = level, site


def plan_sleep(st: EngineState, level_arg: int) -> tuple[int, list, str]:
    """Effective level and the in-worker steps to run before the sleep; plus the reason."""
    requested, site = st.pending_level, st.pending_site
    expire(st)
    if st.asleep:  # vLLM ignores a sleep while asleep ("Executor is already sleeping"): change nothing
        return level_arg, [], "engine already asleep: vLLM ignores this sleep"
    st.preserve_mode, st.preserved_names, st.preserved_bytes = None, [], 0
    if requested is None:  # a direct llm.sleep(level=N) by the caller: honoured, only tracked
        st.site = ""
        st.origin = "a direct engine.sleep(level=%d) call (not colo-shim's finish_generation)" % level_arg
        return level_arg, [], "caller's own level"
    st.site = site
    st.origin = f"the finish_generation at {site or 'an unknown site'}"
    if requested < 2:
        return requested, [], "requested keep"
    version = vllm_version()
    if version is None or version < BUFFERS_SAVED:
        return 1, [], "vLLM < 0.8.5 (or unknown): buffers are lost at level 2"
    if st.coverage.state != "learned":
        why = {"unknown": "refit coverage not learned yet (first refit runs at level 1)",
               "unreported": "the model's load_weights does not report what it wrote",
               "changed": "refit coverage changed between refits"}[st.coverage.state]
        return 1, [], why
    names = st.coverage.uncovered()
    st.preserved_names = names
    if not names:
        return 2, [], "refit rewrites every parameter"
    if version >= PRESERVE_NAMES and not cov.outside_model(names):  # vLLM's globs miss the drafter
        st.preserve_mode = "vllm-sleep_preserve_parameter_names"
        return 2, [(cov.set_preserve_globs_rpc, (names,))], "uncovered parameters kept by vLLM"
    st.preserve_mode = "shim-cpu-copy"
    return 2, [(cov.snapshot_rpc, (names,))], "uncovered parameters copied by colo-shim"


def after_steps(st: EngineState, results: list) -> None:
    st.preserved_bytes = sum(sum(r) if isinstance(r, list) else int(r or 0) for r in results)


def fallback(st: EngineState) -> int:
    """The steps before a level-2 sleep failed (core/guard.py logged and counted it): keep weights (level 1)."""
    st.reasons["shim error, kept"] += 1
    st.preserve_mode, st.preserved_names, st.preserved_bytes = None, [], 0
    return 1


def after_sleep(st: EngineState, level: int, reason: str) -> None:
    st.reasons[reason] += 1
    if st.asleep or level < 1:  # a no-op (vLLM ignores a sleep while asleep; level 0 only pauses
        return                     # scheduling): the weights stay what they were, discarded stays so
    st.asleep = {"weights", "kv_cache"}
    st.levels[level] += 1
    shim_bytes = st.preserved_bytes if level >= 2 and st.preserve_mode == "shim-cpu-copy" else 0
    st.history.append({"level": level, "reason": reason, "shim_cpu_bytes": shim_bytes,
                       "preserve_mode": st.preserve_mode if level >= 2 else None})
    if level >= 2 or not st.discarded:  # level 1 backs up garbage as faithfully as good weights
        st.discarded, st.updated = level >= 2, False
    st.coverage.start_cycle()
    if st.preserve_mode != "shim-cpu-copy" and level < 2:
        st.preserved_names, st.preserved_bytes = [], 0


def after_update(st: EngineState, result, records: list[dict] | None) -> None:
    expire(st)
    ok = bool(result) and all(bool(r) for r in (result if isinstance(result, list) else [result]))
    if ok:
        st.updated = True
    if records:
        st.coverage.add_update(records)


def _error(st: EngineState, what: str) -> ColoShimDiscardError:
    st.guard_errors += 1
    return ColoShimDiscardError(
        f"colo-shim: {what} on vLLM weights that were discarded (level-2 sleep) by {st.origin}, and no "
        f"weight update has rewritten them since; the shim cannot restore them correctly. {way_out(st.site)}")


def before_wake(st: EngineState, tags) -> list:
    """Raise before a kv_cache/full wake-up on discarded weights; return restore steps."""
    expire(st)
    wants_kv = tags is None or "kv_cache" in tags
    if not wants_kv:
        return []
    event, missing = st.coverage.finish_cycle()
    if event == "changed" and not st.warned_change:
        st.warned_change = True
        log.warning("colo_shim.vllm: refit coverage changed (%d names differ); this worker keeps its "
                    "weights (level 1) from now on", len(missing) or 1)
    if not st.discarded:
        return []
    if not st.updated:
        raise _error(st, "a %s wake-up" % ("full" if tags is None else "kv_cache"))
    lost = [n for n in missing if n not in set(st.preserved_names)]
    if lost:
        st.updated = False  # the next wake-up must raise too, not pass on a closed coverage cycle
        raise _error(st, f"the refit did not rewrite {len(lost)} parameter(s) ({', '.join(lost[:3])})")
    return []  # the shim's CPU copies went back at the weights wake-up (coverage.wake_steps)


def after_wake(st: EngineState, tags) -> None:
    st.asleep = set() if tags is None else st.asleep - set(tags)
    if tags is None or "kv_cache" in tags:
        st.discarded = False


def check_generate(st: EngineState) -> None:
    expire(st)
    if st.discarded:
        raise _error(st, "generate")
