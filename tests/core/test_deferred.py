"""Activation waits for the first target import (start-up cost), then installs before it loads."""

import importlib

from helpers import TARGETS, deps_dir, doubles_path, last_json, run_python

from colo_shim.core.families import FAMILIES, MODULES, TRIGGERS


def test_triggers_cover_every_declared_target():
    for name in FAMILIES:
        patch = importlib.import_module(MODULES[name]).PATCH
        for target in patch.targets:
            root = target.module.partition(".")[0]
            assert root in TRIGGERS[name], (name, target.key)
            assert target.module != root, "a target that is itself a trigger root would load before its hook"


def test_active_process_without_targets_loads_nothing_heavy():
    child = run_python("""
        import json, sys
        before = set(sys.modules)
        import colo_shim
        loaded = set(sys.modules) - before
        print(json.dumps(sorted(m for m in loaded if not m.startswith("colo_shim")) +
                         sorted(m for m in loaded if m.startswith("colo_shim."))))
    """, env={"COLO_SHIM": "1"})
    assert last_json(child) == ["colo_shim.core", "colo_shim.core.config", "colo_shim.core.deferred",
                                "colo_shim.core.families", "colo_shim.core.knobs"]  # no stdlib module beyond start-up's


def test_first_target_import_installs_before_the_target_loads():
    child = run_python("""
        import json, sys, colo_shim
        from nvidia_resiliency_ext.checkpointing.async_ckpt import core
        from colo_shim.core import wrapping
        print(json.dumps([isinstance(vars(core.AsyncCallsQueue)["close"], wrapping.ShimWrapper),
                          "colo_shim.core.registry" in sys.modules]))
    """, pythonpath=(deps_dir("nvrx", "0.7.0"),), env={"COLO_SHIM": "nvrx"})
    assert last_json(child) == [True, True]


def test_unrequested_family_roots_do_not_trigger():
    child = run_python("""
        import json, sys, colo_shim
        import nemo_rl.models.generation.vllm.vllm_generation as g
        finish = vars(g.VllmGeneration)["finish_generation"]
        print(json.dumps(["colo_shim.core.registry" in sys.modules, type(finish).__name__]))
    """, pythonpath=doubles_path("v0_7"), env={"COLO_SHIM": "nvrx"})
    assert last_json(child) == [False, "function"]


def test_target_already_imported_before_activation_is_patched_at_once():
    child = run_python("""
        import json, os, sys
        import shimtarget.sub  # not a family root: stays unpatched
        import nemo_rl.models.generation.vllm.vllm_generation as g
        os.environ["COLO_SHIM"] = "vllm"
        import colo_shim
        print(json.dumps(type(vars(g.VllmGeneration)["finish_generation"]).__name__))
    """, pythonpath=(*doubles_path("v0_7"), TARGETS))
    assert last_json(child) == "ShimWrapper"
