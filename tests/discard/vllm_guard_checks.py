"""Subprocess driver for the discarded-weights guard and fallbacks (v0.7 layout, inline workers).

Each check builds a fresh VllmGeneration on the engine double, drives it into one situation and
records what happened (errors with their messages, levels the engine really used, warnings);
tests/discard/test_vllm_guard.py asserts on the JSON this prints.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _vllm_support as sup  # noqa: E402

os.environ.setdefault("NRL_DOUBLE_REFIT_PATH", tempfile.mktemp(prefix="refit-"))

import colo_shim  # noqa: E402

colo_shim.install(["vllm"])

import torch  # noqa: E402

from colo_shim.discard import guard as discard_guard

from colo_shim.discard import policy as discard_policy  # noqa: E402
from nemo_rl.distributed.virtual_cluster import RayVirtualCluster  # noqa: E402
from nemo_rl.models.generation.vllm import VllmGeneration  # noqa: E402

DATA = sup.batches(1)[0]


class Capture(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


CAPTURE = Capture()
logging.getLogger("colo_shim").addHandler(CAPTURE)
logging.getLogger("colo_shim").setLevel(logging.INFO)


def fresh(**gen):
    discard_policy.reset()
    policy = sup.PolicyDouble(os.environ["NRL_DOUBLE_REFIT_PATH"])
    pg = VllmGeneration(RayVirtualCluster([1]), sup.generation_config(**gen))
    return pg, policy


def refit(pg, policy):
    pg.prepare_for_generation(tags=["weights"])
    policy.stream_weights_via_ipc_zmq()
    ok = pg.worker_group.get_all_worker_results(pg.update_weights_via_ipc_zmq())
    pg.prepare_for_generation(tags=["kv_cache"])
    return ok


def engine(pg):
    return pg.worker_group.workers[0].llm


def levels(pg):
    return [e["level"] for e in engine(pg).core.events if e["event"] == "sleep"]


def error_of(call):
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - recorded for the test to judge
        return {"type": type(exc).__name__, "message": str(exc)}
    return None


def check_full_wake_without_refit():
    pg, policy = fresh()
    pg.finish_generation(refit_pending=True)  # setup: coverage unknown -> worker keeps
    refit(pg, policy)                          # learns coverage
    pg.finish_generation(refit_pending=True)   # now really discarded
    err = error_of(lambda: pg.prepare_for_generation())
    gen_err = error_of(lambda: pg.generate(DATA))
    return {"levels": levels(pg), "prepare_error": err, "generate_error": gen_err,
            "asleep": sorted(engine(pg).core.sleeping_tags), "nan_generations": engine(pg).core.nan_generations}


def check_generate_after_direct_level2():
    pg, _ = fresh()
    engine(pg).sleep(level=2)
    engine(pg).wake_up(tags=["weights"])
    return {"generate_error": error_of(lambda: engine(pg).generate([{"prompt_token_ids": [1, 2]}],
                                                                  sampling_params=_sp()))}


def _sp():
    import vllm

    return vllm.SamplingParams(temperature=0.0, max_tokens=2)


def check_worker_sleep_level_kwarg():
    pg, policy = fresh()
    worker = pg.worker_group.workers[0]
    worker.sleep(level=2)                       # coverage unknown: the worker keeps
    refit(pg, policy)
    worker.sleep(level=2)                       # coverage learned: discards
    refit(pg, policy)
    out = pg.generate(DATA)["output_ids"].tolist()
    return {"levels": levels(pg), "nan_generations": engine(pg).core.nan_generations, "output": out}


def check_explicit_false_beats_always():
    os.environ["COLO_SHIM_DISCARD"] = "always"
    try:
        pg, policy = fresh()
        pg.finish_generation()
        refit(pg, policy)
        pg.finish_generation(refit_pending=False)
        pg.prepare_for_generation()
        return {"levels": levels(pg), "decisions": discard_policy.report()["recent"]}
    finally:
        del os.environ["COLO_SHIM_DISCARD"]


def check_bad_mode_value():
    os.environ["COLO_SHIM_DISCARD"] = "sometimes"
    try:
        CAPTURE.lines.clear()
        pg, _ = fresh()
        pg.finish_generation()
        pg.finish_generation()
        return {"mode": discard_policy.mode(), "warnings": [line for line in CAPTURE.lines if "sometimes" in line]}
    finally:
        del os.environ["COLO_SHIM_DISCARD"]


def check_coverage_change():
    pg, policy = fresh()
    CAPTURE.lines.clear()
    pg.finish_generation(refit_pending=True)
    refit(pg, policy)                            # learn
    pg.finish_generation(refit_pending=True)     # discard (level 2)
    dropped = "model.norm.weight"
    saved = policy.state.pop(dropped)
    err = error_of(lambda: refit(pg, policy))    # refit misses a covered parameter: cannot restore
    policy.state[dropped] = saved
    pg2, policy2 = fresh()
    CAPTURE.lines.clear()  # from here on: one worker whose coverage changes while it keeps
    pg2.finish_generation(refit_pending=True)
    refit(pg2, policy2)
    policy2.state.pop(dropped)
    pg2.finish_generation(refit_pending=False)
    refit(pg2, policy2)                          # coverage changes while kept: fall back to level 1
    pg2.finish_generation(refit_pending=True)
    refit(pg2, policy2)                          # a further refit: still level 1, no second warning
    pg2.finish_generation(refit_pending=True)
    st = discard_guard.state_for(engine(pg2))
    return {"error": err, "levels_after_change": levels(pg2), "coverage": st.coverage.state,
            "warnings": [line for line in CAPTURE.lines if "coverage changed" in line]}


def check_unreported_coverage():
    pg, policy = fresh()
    cls = type(engine(pg).core.worker.model_runner.model)
    original = cls.load_weights
    cls.load_weights = lambda self, weights: (original(self, weights), None)[1]  # a model that reports nothing
    try:
        pg.finish_generation(refit_pending=True)
        refit(pg, policy)
        pg.finish_generation(refit_pending=True)
        return {"levels": levels(pg), "coverage": discard_guard.state_for(engine(pg)).coverage.state}
    finally:
        cls.load_weights = original


def check_shim_error_falls_back():
    pg, policy = fresh()
    pg.finish_generation(refit_pending=True)
    refit(pg, policy)
    from colo_shim.discard import coverage as discard_coverage

    original = discard_coverage.snapshot_rpc
    discard_coverage.snapshot_rpc = None  # the in-worker copy step cannot run
    try:
        pg.finish_generation(refit_pending=True)
    finally:
        discard_coverage.snapshot_rpc = original
    pg.prepare_for_generation()
    out = pg.generate(DATA)["output_ids"].tolist()
    return {"levels": levels(pg), "nan_generations": engine(pg).core.nan_generations, "output": out}


def check_noncolocated():
    pg, _ = fresh(colocated=False)
    ok = pg.finish_generation(refit_pending=True)
    return {"ok": ok, "levels": levels(pg), "finishes": discard_policy.report()["finishes"]}


CHECKS = {name[len("check_"):]: fn for name, fn in globals().items() if name.startswith("check_")}

if __name__ == "__main__":
    torch.manual_seed(0)
    print("RESULT " + json.dumps({name: fn() for name, fn in CHECKS.items()}))
