"""Mirrors made ahead of the offload that needs them (colo_shim/offload/ahead.py), on real megatron-core
0.19.2 in a colocated job's order (ahead_child.py): the first offload finds no optimizer state, the
first train step makes it, and the mirrors of that state are made in background threads before the
next offload, which then makes none itself; values stay bit-identical to a run without colo-shim."""

import json
import os

from helpers import deps_dir, doubles_path, run_python

HERE = os.path.dirname(os.path.abspath(__file__))


def _child() -> dict:
    proc = run_python(os.path.join(HERE, "ahead_child.py"), timeout=240,
                      pythonpath=(HERE, deps_dir("mcore", "0.19.2"), *doubles_path("v0_7")))
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _moved(seen: dict) -> None:
    assert seen["equal_after_offload"] and seen["on_host"] and seen["equal_after_reload"], seen


def test_mirrors_are_made_ahead_and_every_race_falls_back_cleanly():
    r = _child()
    first, before, second, third = r["first"], r["before_second"], r["second"], r["third"]
    for seen in (first, second, third):
        _moved(seen)
        assert seen["fallbacks"] == 0, seen
    # the first offload meets no optimizer state: it mirrors the main params itself
    assert first["fresh"] == first["inline_registrations"] > 0 and first["ahead_used"] == 0, first
    # the first step made Adam's state on the device; the hook after it had every mirror made, in other threads
    n = before["state_tensors"]
    assert before == {"state_tensors": n, "made_ahead": n, "background_registrations": n, "background_devices": ["0"],
                      "linked": n, "on_device": True} and n > 0 and r["quiet"], before
    # so the next offload makes nothing itself: no mirror, no registration
    assert (second["fresh"], second["inline_registrations"], second["ahead_used"]) == (0, 0, n), second
    assert (third["fresh"], third["inline_registrations"]) == (0, 0), third
    assert r["identical_to_plain"] is True  # three colocated steps, bit for bit as without colo-shim

    racing = r["racing"]  # an offload while a mirror made ahead is still being registered waits for it
    _moved(racing)
    assert racing["queued"] == racing["tensors"] and racing["registering"] and racing["waiting"] and racing["blocked"] >= 1 and racing["joined"], racing
    assert racing["still_on_device"] and racing["visible"] == 0, racing  # nothing half-registered was shown
    assert racing["offloads"] == racing["offloads_before"], racing  # and the waiting offload had copied nothing
    assert (racing["fresh"], racing["inline_registrations"], racing["ahead_used"]) == (0, 0, racing["tensors"]), racing

    late = r["not_ready"]  # an offload that stops waiting makes its own; the late ones are given back
    _moved(late)
    assert late["fresh"] == late["inline_registrations"] == late["tensors"] and late["quiet"], late
    assert late["discarded"] >= 1 and late["unlocked"] >= late["discarded"], late
    assert late["locked"] == late["mirrors"], late  # no registration outlives its mirror

    over = r["over_budget"]  # nothing is made ahead over the budget; the offload falls back as before
    _moved(over)
    assert over["requested"] == 0 and over["fallbacks"] == 2 and over["fresh"] == 0, over

    failing = r["failing"]  # page-locking fails in a background thread: mirrors off, the original copy runs
    assert failing["quiet"] and failing["mode"].startswith("original path: cudaHostRegister"), failing
    assert failing["mirrors"] == failing["locked"] == 0, failing
    for seen in (failing, failing["again"]):
        _moved(seen)
        assert seen["fallbacks"] > 0 and seen["fresh"] == seen["inline_registrations"] == 0, seen
    warnings = r["warnings"]
    assert sum("cudaHostRegister" in w for w in warnings) == 1, warnings
    assert sum("not ready after" in w for w in warnings) == 1, warnings
    assert r["report"]["pending"] == 0 and r["report"]["watched"] == 1, r["report"]
