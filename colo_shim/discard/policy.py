"""Driver-side decision: does a refit rewrite the weights before this engine generates again?

Only then may finish_generation discard (level 2); everywhere else it must keep (level 1).
Upstream got this wrong twice: a global knob (NeMo-RL PR #2523) also discarded after
validation, and a flag passed from the main loop only (#2495, reverted in #2658) still broke
DAPO incomplete batches. The answer depends on where finish_generation is called from, which
the shim reads without editing the loop:

- the calling training loop, from the interpreter's frames (read-only): grpo_train,
  distillation_train, ppo_train, grpo_train_sync, SyncRolloutActor.rollout_to_tq (a Ray actor:
  its own process) and setup. Frames are robust to `from ... import grpo_train` and to the order
  in which the shim was installed, which wrapping module attributes is not;
- its `master_config` / `self.master_config` and, for PPO, `total_steps` and
  `policy_training_start_step` (critic warm-up steps are not followed by a refit);
- whether a `validate` function ran since the last finish (the finish after validation is never
  followed by a refit) - recorded by wrappers of the module-level validate functions;
- the generation config (LoRA, expert parallel on vLLM < 0.11, vLLM < 0.8.5).

Anything unknown keeps. The worker then applies its own gates (guard.plan_sleep).
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass

from colo_shim.core import config
from colo_shim.discard.guard import vllm_version

MODES = ("auto", "always", "never")
ENV = config.DISCARD

# (module, function) -> loop kind; the first match walking outwards from the caller wins.
LOOPS = {
    ("nemo_rl.algorithms.grpo", "grpo_train"): "grpo",
    ("nemo_rl.algorithms.grpo", "async_grpo_train"): "async_grpo",
    ("nemo_rl.algorithms.distillation", "distillation_train"): "distillation",
    ("nemo_rl.algorithms.ppo", "ppo_train"): "ppo",
    ("nemo_rl.algorithms.grpo_sync", "grpo_train_sync"): "grpo_sync",
    ("nemo_rl.experience.sync_rollout_actor", "rollout_to_tq"): "grpo_sync_actor",
    ("nemo_rl.algorithms.grpo", "setup"): "setup",
    ("nemo_rl.algorithms.distillation", "setup"): "setup",
    ("nemo_rl.algorithms.ppo", "setup"): "setup",
}
_SKIP_PREFIXES = ("colo_shim", "wrapt", "nemo_rl.models.generation")


@dataclass
class Decision:
    level: int
    reason: str
    source: str   # explicit | mode | auto | error
    site: str
    loop: str = ""


_lock = threading.Lock()
_validated = threading.local()
_counts: Counter = Counter()
_reasons: Counter = Counter()
_recent: deque = deque(maxlen=64)
_mirror: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def mode() -> str:
    """COLO_SHIM_DISCARD, read per call (tests and jobs may change it); a bad value is said once."""
    return config.env_choice(ENV, MODES, "auto")


def mark_validated() -> None:
    """Called by the validate wrappers: the next finish in this thread ends a validation."""
    _validated.flag = True


def _take_validated() -> bool:
    flag = getattr(_validated, "flag", False)
    _validated.flag = False
    return flag


MISSING = object()


def read(obj, *path):
    """The value at `path`, or MISSING; never raises.

    NeMo-RL's configs changed type under the shim: plain dicts up to v0.6, a pydantic MasterConfig
    over dict sections in v0.7, pydantic sections on main since PR #2518 (`master_config.grpo` is
    a GRPOConfig, not a dict). Reading only dicts made main's `use_dynamic_sampling` look false
    and DAPO's incomplete batches regenerate on discarded weights. So every step reads a Mapping
    by key and anything else (pydantic model, extras of extra="allow", namespace) by attribute,
    then by key; what cannot be read is MISSING and the caller keeps.
    """
    for key in path:
        if obj is None or obj is MISSING:
            return MISSING
        try:
            if isinstance(obj, Mapping):
                obj = obj[key] if key in obj else MISSING
                continue
            value = getattr(obj, key, MISSING)
            if value is MISSING and hasattr(type(obj), "__getitem__"):
                try:
                    value = obj[key]
                except (KeyError, IndexError, TypeError):
                    value = MISSING
            obj = value
        except Exception:  # noqa: BLE001 - a host config's property or __getattr__ may raise anything: unreadable
            return MISSING
    return obj


# loop kind -> config section holding use_dynamic_sampling (None: that loop has no DAPO)
DAPO_SECTION = {"grpo": "grpo", "grpo_sync": "grpo", "grpo_sync_actor": "grpo", "ppo": "ppo", "distillation": None}


def _caller() -> tuple[str, object]:
    """Call site (file:line in function) outside the shim and NeMo-RL's generation package."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__", "").startswith(_SKIP_PREFIXES):
        frame = frame.f_back
    if frame is None:
        return "unknown", None
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}", frame


def _loop(frame) -> tuple[str, object]:
    depth = 0
    while frame is not None and depth < 64:
        kind = LOOPS.get((frame.f_globals.get("__name__", ""), frame.f_code.co_name))
        if kind:
            return kind, frame
        frame, depth = frame.f_back, depth + 1
    return "", None


def _config_gate(generation) -> str:
    """Reasons from the generation config alone (keep, whatever the loop)."""
    cfg = getattr(generation, "cfg", None)
    if any(v is not MISSING and bool(v) for v in (read(cfg, "vllm_kwargs", "enable_lora"),
                                                  read(cfg, "lora_cfg", "enabled"))):
        return "LoRA adapters do not survive level 2 (vLLM #39934)"
    version = vllm_version()
    ep = read(cfg, "vllm_cfg", "expert_parallel_size")
    ep = 1 if ep is MISSING or ep is None else ep
    if (not isinstance(ep, int) or ep > 1) and (version is None or version < (0, 11)):
        return "expert parallel on vLLM < 0.11 (or unknown) breaks at level 2 (vLLM PR #25458)"
    if version is not None and version < (0, 8, 5):
        return "vLLM < 0.8.5 loses buffers at level 2"
    return ""


def _auto(kind: str, frame) -> tuple[int, str]:
    loc = frame.f_locals if frame is not None else {}
    if kind == "setup":
        return 2, "setup: the first refit rewrites every weight"
    if kind in ("grpo", "distillation", "grpo_sync", "grpo_sync_actor", "ppo"):
        mc = loc.get("master_config")
        if mc is None and "self" in loc:
            mc = getattr(loc["self"], "master_config", None)
        if mc is None:
            return 1, f"{kind}: training config not readable"
        section = DAPO_SECTION[kind]
        if section:
            dapo = read(mc, section, "use_dynamic_sampling")
            if dapo is MISSING and kind == "grpo" and "dynamic_sampling" not in frame.f_globals:
                dapo = False  # v0.3: no DAPO at all (no dynamic_sampling in grpo.py, no key in its config)
            if not isinstance(dapo, bool):
                return 1, f"{kind}: {section}.use_dynamic_sampling not readable"
            if dapo:
                return 1, ("DAPO dynamic sampling: batch completeness is decided after this finish; "
                           "an incomplete batch generates again without a refit")
        if kind == "ppo":
            steps, start = loc.get("total_steps"), loc.get("policy_training_start_step")
            if not isinstance(steps, int) or not isinstance(start, int):
                return 1, "ppo: step counters not readable"
            if steps < start:
                return 1, "PPO critic warm-up: the policy is not trained, no refit follows"
        return 2, f"{kind} rollout finish: the training step's refit rewrites the weights"
    if kind == "async_grpo":
        return 1, "async GRPO: refits are not tied to finishes"
    return 1, "no known training loop on the stack"


def decide(generation, refit_pending) -> Decision:
    site, frame = _caller()
    validated = _take_validated()
    if refit_pending is not None:
        return Decision(2 if refit_pending else 1, f"explicit refit_pending={bool(refit_pending)}", "explicit", site)
    chosen = mode()
    if chosen == "never":
        return Decision(1, f"{ENV}=never", "mode", site)
    gate = _config_gate(generation)
    if gate:
        return Decision(1, gate, "config", site)
    if chosen == "always":
        return Decision(2, f"{ENV}=always", "mode", site)
    if validated:
        return Decision(1, "finish after validate(): no refit follows", "auto", site)
    kind, loop_frame = _loop(frame)
    level, reason = _auto(kind, loop_frame)
    return Decision(level, reason, "auto", site, kind)


def record(generation, decision: Decision) -> None:
    with _lock:
        _counts["discard" if decision.level >= 2 else "keep"] += 1
        _reasons[decision.reason] += 1
        _recent.append({"site": decision.site, "level": decision.level, "reason": decision.reason,
                        "source": decision.source, "loop": decision.loop})
        try:  # a keep finish after a discard restores nothing: only a successful wake-up clears
            if decision.level >= 2:
                _mirror[generation] = {"site": decision.site, "refit": False}
        except TypeError:  # not weak-referenceable: no driver-side mirror for it
            pass


def note_refit(generation) -> None:
    with _lock:
        entry = _mirror.get(generation) if _weakable(generation) else None
        if entry is not None:
            entry["refit"] = True


def discard_entry(generation) -> dict | None:
    """{'site', 'refit'} of this generation's last discard until a wake-up succeeds, else None."""
    with _lock:
        entry = _mirror.get(generation) if _weakable(generation) else None
        return dict(entry) if entry is not None else None


def clear(generation) -> None:
    with _lock:
        if _weakable(generation):
            _mirror.pop(generation, None)


def _weakable(obj) -> bool:
    try:
        weakref.ref(obj)
        return True
    except TypeError:
        return False


def report() -> dict:
    with _lock:
        return {"mode": mode(), "finishes": dict(_counts), "reasons": dict(_reasons),
                "recent": list(_recent)}


def reset() -> None:
    with _lock:
        _counts.clear()
        _reasons.clear()
        _recent.clear()
        _mirror.clear()
    _validated.flag = False
