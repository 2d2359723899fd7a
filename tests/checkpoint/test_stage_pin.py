"""Issue 16 item 7: staged /dev/shm buffers are page-locked once and unlocked on every release.

Real NVRx 0.7.0 buffers (its `_shm_tensor_cache`, filled by the writer's staging path), real
worker, CPU tensors. There is no GPU here, so only the two CUDA runtime calls are replaced
(colo_shim.checkpoint.pinning.host, one seam; the recorder refuses a double registration as CUDA
does); bench/bench_stage_pin.py runs the real cudaHostRegister on a GPU. Registered: each buffer
of an entry when NVRx first reuses it (the first save on a new worker has its buffers dropped by
NVRx's worker-restart callback, so they are never registered). Unregistered, after a device
synchronize, when NVRx's cleanup_tensor_caches, colo-shim's close or a refused save drops them,
and at interpreter exit; kept when only the cache keys are cleared (the in-place drop).
"""

import pytest

from nvrx_scenarios import runner

SCRIPT = runner.os.path.join(runner.HERE, "stage_drain.py")
STAGE = {"COLO_SHIM_NVRX_RELEASE": "stage"}
RELEASES = ("cleanup_tensor_caches", "close", "refused")


def _run(opts, env=STAGE):
    outcome = runner.run("pin_lifecycle", opts, nvrx="0.7.0", script=SCRIPT, timeout=300, env=env)
    return outcome, outcome.result


def _kinds(events):
    return [e[0] for e in events]


def test_buffers_are_registered_once_and_unregistered_on_every_release_and_at_exit():
    _, result = _run({})
    phases = {}
    for p in result["phases"]:
        phases.setdefault(p["tag"], []).append(p)
    assert all(p["equal"] for p in result["phases"] if "equal" in p)
    assert not any(e[3] for e in result["events"] if e[0] == "register"), "a buffer was registered twice"
    assert not any(p["events"] for p in phases["new"] + phases["new_worker_again"])
    pinned = None
    for tag in ("first_reuse", "reuse_after_cleanup", "reuse_after_close", "reuse_after_refused"):
        p = phases[tag][0]
        assert _kinds(p["events"]) == ["register"] * 3, (tag, p)
        assert sorted(e[1] for e in p["events"]) == p["cache_ptrs"]  # exactly the cached buffers
        assert sum(e[2] for e in p["events"]) == p["cache_bytes"] == p["pinned_bytes"] == 6144
    for tag in ("steady", "reuse_after_keep_shm", "keep_shm"):
        assert phases[tag][0]["events"] == [], tag
    for tag in RELEASES:
        p = phases[tag][-1]
        assert _kinds(p["events"]) == ["synchronize"] + ["unregister"] * 3, (tag, p)
        assert all(e[3] for e in p["events"]), "unregistered something that was not registered"
        assert p["pinned_bytes"] == 0 and p["cache_ptrs"] == []
    pinned = result["pinned_at_end"]
    assert len(pinned) == 3
    assert _kinds(result["events_at_exit"]) == ["synchronize"] + ["unregister"] * 3
    assert sorted(e[1] for e in result["events_at_exit"][1:]) == pinned and result["pinned_after_exit"] == []
    stage = result["stage"]
    assert stage["pin"] is True and stage["pin_registrations"] == 12 and stage["pin_unregistrations"] == 9
    assert stage["pinned_bytes"] == 6144 and stage["pin_failures"] == 0 and stage["ipc_saves"] == 1


def test_pin_switch_off_registers_nothing():
    _, result = _run({"short": True}, env=dict(STAGE, COLO_SHIM_STAGE_PIN="0"))
    assert result["events"] == [] and result["events_at_exit"] == []
    assert result["stage"]["pin"] is False and result["stage"]["pin_registrations"] == 0
    assert all(p["equal"] for p in result["phases"])


def test_failed_registration_warns_once_and_saves_go_on_unpinned():
    outcome, result = _run({"short": True, "fail": True})
    assert _kinds(result["events"]) == ["register_failed"]  # no further attempt after the first failure
    assert outcome.stderr.count("page-locking the staged /dev/shm buffers failed") == 1
    assert result["stage"]["pin_failures"] == 1 and result["stage"]["pinned_bytes"] == 0
    assert all(p["equal"] for p in result["phases"])


def test_no_registration_without_cuda_in_the_trainer():
    """The real CUDA seam on this CPU machine: CUDA is never initialised, so nothing is registered."""
    _, result = _run({"short": True, "real_host": True})
    assert result["stage"]["pin_registrations"] == 0 and result["stage"]["pin_failures"] == 0
    assert all(p["equal"] for p in result["phases"])
