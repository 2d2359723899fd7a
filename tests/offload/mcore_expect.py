"""What every run of mcore_child.py must show, on a released megatron-core or a source tree
(test_offload_megatron.py, tests/compat/test_compat_megatron_core.py)."""

import json
import os

from helpers import doubles_path, run_python

HERE = os.path.dirname(os.path.abspath(__file__))
ENTRIES = ("chained", "optimizer", "nemo_rl", "buffer")


def run_child(mcore_path: str, opts=None) -> dict:
    proc = run_python(os.path.join(HERE, "mcore_child.py"), args=[json.dumps(opts or {})], timeout=240,
                      pythonpath=(HERE, mcore_path, *doubles_path("v0_7")))
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check_entry_points(result: dict) -> None:
    """Both phases moved the same tensors with the same values and freed the same device bytes; with
    the shim, every round after the first copied into the same host tensors."""
    assert result["identical"] is True  # after 2 x 4 rounds and 8 train steps, every value bit for bit
    for entry in ENTRIES:
        plain, shim = result["plain"][entry], result["shim"][entry]
        for seen in (plain, shim):
            for key in ("equal_after_offload", "equal_after_reload", "on_host", "back_on_device"):
                assert seen[key] == [True, True], (entry, key, seen)
        assert shim["device_bytes_freed"] == plain["device_bytes_freed"] and plain["device_bytes_freed"][0] > 0, entry
        assert shim["host_ids"][0] == shim["host_ids"][1], entry  # mirrors reused (the original's ids may recur)
    report = result["report"]
    assert report["mode"] == "page-locked mirrors" and report["fallbacks"] == 0 and report["replaced"] == 0
    assert result["seam"]["registrations"] == result["seam"]["locked"] == report["mirrors"] > 0
    assert report["buffer_mirror_gib"] > 0  # the DDP buffer's first offload filled a page-locked mirror
    log = result["shim"]["fence_log"]  # the checkpoint fence ran before every copy, at every entry point
    copies = [i for i, (what, _) in enumerate(log) if what == "copy"]
    assert copies and all(i > 0 and log[i - 1][0] == "fence" for i in copies), log
    assert {where for what, where in log if what == "copy"} >= {
        "ChainedOptimizer.offload_to_cpu", "MegatronOptimizer.offload_to_cpu",
        "nemo_rl MegatronPolicyWorkerImpl.move_optimizer", "_ParamAndGradBuffer.offload_to_cpu"}, log
    calls = result["status"]
    for target in ("MegatronOptimizer.offload_to_cpu", "ChainedOptimizer.restore_from_cpu",
                   "MegatronPolicyWorkerImpl.move_optimizer", "_ParamAndGradBuffer.offload_to_cpu"):
        assert calls[f"offload:{target}"][0] == "applied" and calls[f"offload:{target}"][1] > 0, calls


def check_changes_and_fallbacks(checks: dict) -> None:
    assert checks["reuse"] == {"same_as_before": True, "equal": True}
    assert checks["syncs_per_round"] == 2  # one synchronize for the offload, one for the reload
    assert checks["held_elsewhere"] == {"kept_untouched": True, "equal": True, "one_fresh_mirror": True,
                                        "kept_not_reused": True, "replaced": 1}
    assert checks["resized"] == {"equal": True, "restored": True, "fresh": 1, "then_reused": True}
    group = checks["new_param_group"]
    assert group["fresh"] == 2 and group["reused"] == group["slots"] - 2 and group["equal"] and group["restored"]
    rebuilt = checks["new_tensors"]
    assert rebuilt["equal"] and rebuilt["restored"] and rebuilt["mirrors_after"] == rebuilt["mirrors_before"]
    assert rebuilt["old_unlocked"] == rebuilt["state_tensors"]  # the replaced tensors' mirrors are given back
    assert checks["budget"] == {"equal": True, "restored": True, "fallbacks": 2, "no_mirror_used": True, "warned": 1}
    assert checks["knob_off"] == {"equal": True, "restored": True, "untouched": True, "no_mirror_used": True}
    assert checks["order_inverted"] == {"equal": True, "restored": True, "no_copy": True, "fallbacks": 2, "warned": 1,
                                        "restore_still_mirrored": True, "uninstall_restored_originals": True}
    failed = checks["page_lock_fails"]
    assert failed["equal"] and failed["restored"] and failed["mode"].startswith("original path: cudaHostRegister")
    assert failed["mirrors_left"] == failed["locked_left"] == 0 and failed["warned"] == 1
    assert not any("left inert" in w for w in checks["warnings"]), checks["warnings"]
