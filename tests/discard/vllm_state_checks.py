"""Subprocess driver: the engine's discarded state across repeated and failed finishes (issue 8 item 4).

v0.7 layout, inline workers, engine double of vLLM 0.20 (level-2 sleeps overwrite the weights with
NaN; a sleep while asleep does nothing, as vLLM's executor). Each check drives a fresh
VllmGeneration through one sequence and records what happened; tests/discard/test_vllm_state.py
asserts on the JSON this prints. `reference` is the same model after the same refit, kept at
level 1 throughout: every check that generates must produce exactly its tokens.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _vllm_support as sup  # noqa: E402

os.environ.setdefault("NRL_DOUBLE_REFIT_PATH", tempfile.mktemp(prefix="refit-"))

import colo_shim  # noqa: E402

colo_shim.install(["vllm"])

import torch  # noqa: E402
import vllm  # noqa: E402  (the engine double)

from colo_shim.discard import guard, policy  # noqa: E402
from vllm_guard_checks import DATA, engine, error_of, fresh, levels, refit  # noqa: E402


def _result(pg, **extra) -> dict:
    st = guard.state_for(engine(pg))
    return {"levels": levels(pg), "nan_generations": engine(pg).core.nan_generations,
            "asleep": sorted(engine(pg).core.sleeping_tags), "discarded_now": st.discarded, **extra}


def _generate(pg):
    return pg.generate(DATA)["output_ids"].tolist()


def _learned(pg, policy_double):
    pg.finish_generation(refit_pending=True)  # setup: coverage unknown -> the worker keeps
    refit(pg, policy_double)                   # learns the refit's coverage


def check_reference():
    pg, pol = fresh()
    for _ in range(2):
        pg.finish_generation(refit_pending=False)
        refit(pg, pol)
    return _result(pg, output=_generate(pg))


def check_plain_finish_after_discard():
    """Level-2 finish, then a plain finish_generation() (keep), then a full wake-up."""
    pg, pol = fresh()
    _learned(pg, pol)
    pg.finish_generation(refit_pending=True)   # discards (level 2)
    pg.finish_generation()                      # no loop on the stack: keep; vLLM ignores it (asleep)
    wake_error = error_of(lambda: pg.prepare_for_generation())
    generate_error = error_of(lambda: _generate(pg))
    before = _result(pg, wake_error=wake_error, generate_error=generate_error)
    refit(pg, pol)                              # the way back: a refit rewrites the weights
    return {"before_refit": before, "after_refit": _result(pg, output=_generate(pg))}


def check_second_discard_while_asleep():
    """Two level-2 finishes in a row: the second must not copy the already discarded weights."""
    pg, pol = fresh()
    _learned(pg, pol)
    pg.finish_generation(refit_pending=True)
    pg.finish_generation(refit_pending=True)
    refit(pg, pol)
    st = guard.state_for(engine(pg))
    return _result(pg, output=_generate(pg), engine_sleeps=st.report()["sleeps"],
                   reasons=st.report()["reasons"])


def check_failed_finish_request_does_not_leak():
    """A level-2 finish whose worker sleep fails, then a keep finish: the keep finish must keep."""
    pg, pol = fresh()
    _learned(pg, pol)
    llm_engine = engine(pg).llm_engine

    def broken():
        raise RuntimeError("reset_prefix_cache failed")

    llm_engine.reset_prefix_cache = broken      # the worker's sleep() raises before llm.sleep
    failed = pg.finish_generation(refit_pending=True)
    del llm_engine.reset_prefix_cache
    pg.finish_generation(refit_pending=False)  # e.g. a validation finish: keep
    wake_error = error_of(lambda: pg.prepare_for_generation())
    return _result(pg, failed_finish_returned=failed, wake_error=wake_error,
                   output=None if wake_error else _generate(pg))


def check_stale_request_expires_in_engine():
    """A request the driver could not withdraw dies at the engine's next wake-up or generate."""
    out = {}
    for between in ("generate", "wake_weights"):
        pg, pol = fresh()
        _learned(pg, pol)
        llm = engine(pg)
        llm.wake_up(tags=[f"{guard.CONTROL}sleep_level=2", f"{guard.CONTROL}site=test"])
        if between == "generate":
            greedy = vllm.SamplingParams(temperature=0.0, max_tokens=2)
            llm.generate([{"prompt_token_ids": [1, 2]}], sampling_params=greedy)
        else:
            llm.wake_up(tags=["weights"])        # a refit's first step on an awake engine: vLLM ignores it
        llm.sleep(level=1)
        out[between] = levels(pg)
    return out


CHECKS = {name[len("check_"):]: fn for name, fn in globals().items() if name.startswith("check_")}

if __name__ == "__main__":
    torch.manual_seed(0)
    results = {}
    for name, fn in CHECKS.items():
        policy.reset()
        try:
            results[name] = fn()
        except Exception as exc:  # noqa: BLE001 - one broken check must not hide the others' results
            results[name] = {"crashed": f"{type(exc).__name__}: {exc}"}
    print("RESULT " + json.dumps(results))
