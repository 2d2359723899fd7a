"""Issue 8 item 6: the in-place release checks what the worker freed and gates on tested NVRx.

Real NVRx workers. "Renamed internals" and "dev snapshot" are real NVRx 0.7.0 copied with one
change each (the worker cache attribute renamed in its sources; the version in its metadata), as
an upstream refactor or a NeMo-RL v0.6-style 0.6.0 dev pin would present them. The three cases on
NVRx 0.7.0 itself share one scenario process (tests/nvrx_scenarios/entry.py), each with its own
worker and queue; a copy of NVRx, or a check of the process's one warning, has a process of its own.
"""

import os
import shutil

import pytest

from helpers import deps_dir, last_json, run_python
from nvrx_scenarios import runner

HOST = os.path.join(runner.HERE, "host_only.py")


def _host(name, opts, pythonpath, env=None):
    return run_python(HOST, pythonpath=(runner.HERE, pythonpath), args=(name, __import__("json").dumps(opts)),
                      env=env, timeout=180)


@pytest.fixture(scope="module")
def nvrx_070():
    cases = {"release_check": ("release_check", {}), "drop_report": ("drop_report", {}),
             "marker_order": ("marker_order", {})}
    return runner.run_cases(cases, nvrx="0.7.0", mcore=None, script=HOST, timeout=600)


@pytest.fixture(scope="module")
def renamed(tmp_path_factory):
    root = tmp_path_factory.mktemp("nvrx_renamed")
    shutil.copytree(deps_dir("nvrx", "0.7.0"), root, dirs_exist_ok=True)
    pkg = root / "nvidia_resiliency_ext" / "checkpointing" / "async_ckpt"
    for name in ("core.py", "filesystem_async.py"):
        path = pkg / name
        path.write_text(path.read_text().replace("_worker_data_cache", "_worker_tensor_cache"))
    return str(root)


@pytest.fixture(scope="module")
def dev_snapshot(tmp_path_factory):
    root = tmp_path_factory.mktemp("nvrx_dev")
    shutil.copytree(deps_dir("nvrx", "0.7.0"), root, dirs_exist_ok=True)
    (info,) = [p for p in root.iterdir() if p.name.endswith(".dist-info")]
    meta = info / "METADATA"
    meta.write_text(meta.read_text().replace("Version: 0.7.0", "Version: 0.6.0.dev20260301", 1))
    info.rename(root / "nvidia_resiliency_ext-0.6.0.dev20260301.dist-info")
    return str(root)


@pytest.mark.parametrize("nvrx, entries", (("0.6.0", 0), ("0.7.0", 1)))
def test_drop_reports_what_the_worker_freed(request, nvrx, entries):
    # host tensors on this machine: 0.7.0's shared-memory path caches them under one key, 0.6.0's
    # caches GPU tensors only, so its worker holds nothing (and the fence then expects nothing)
    if nvrx == "0.7.0":
        out = request.getfixturevalue("nvrx_070").result("drop_report")
    else:
        out = last_json(_host("drop_report", {}, deps_dir("nvrx", nvrx)))
    assert out["door"] == out["queued"], out  # the side door and the queued drop free the same
    ran, found, got_entries, tensors, cuda, nbytes, req_tensors, req_cuda = out["door"]
    assert (ran, found, got_entries, cuda) == (1, 1, entries, 0), out
    assert (req_tensors, req_cuda) == (-1, -1), out  # requests are walked on NVRx < 0.6 only
    assert (tensors >= 3 and nbytes >= 6144) if entries else (tensors, nbytes) == (0, 0)


def test_inplace_release_is_used_when_the_drop_matches(nvrx_070):
    out = nvrx_070.result("release_check")
    assert out["released"] == [["inplace"], ["inplace"]] and out["fallbacks"] == 0
    assert out["equal"] == [True, True]


def test_renamed_worker_cache_falls_back_to_restart_with_one_warning(renamed):
    proc = _host("release_check", {}, renamed)
    out = last_json(proc)
    assert out["released"] == [["restart"], ["restart"]] and out["fallbacks"] == 2
    assert out["equal"] == [True, True]  # the restarted writer re-sends; no save is lost or stale
    assert proc.stderr.count("in-place drop freed no cached entry") == 1


def test_dev_snapshot_is_untested_restart_is_used_and_doctor_says_so(dev_snapshot):
    proc = _host("release_check", {}, dev_snapshot)
    out = last_json(proc)
    assert out["released"] == [["restart"], ["restart"]]
    assert proc.stderr.count("is not a release the inplace release was tested on") == 1
    doctor = run_python("import sys; from colo_shim.cli import main; sys.exit(main(['doctor']))",
                        pythonpath=(dev_snapshot,), timeout=60)
    rows = [line for line in doctor.stdout.splitlines() if "in-place release (NVRx internals)" in line]
    assert rows and "untested" in rows[0] and "0.6.0.dev20260301" in rows[0], doctor.stdout
    assert "recommended restart" in doctor.stdout


def test_a_completion_read_while_releasing_is_handed_back_and_a_late_marker_is_skipped(nvrx_070):
    out = nvrx_070.result("marker_order")
    assert out["handed_back"] == out["expected"]  # read while waiting for our marker, kept for NVRx
    assert out["finalized_nonblocking"] == 1  # ... and the host's next (non-blocking) finalize gets it
    assert out["timed_out"] is True and out["owed_after_timeout"] == 1
    assert out["finalized"] == [1, 1] and out["pending_at_end"] == 0 and out["owed_at_end"] == 0
    assert out["c_equal"] is True and out["comp_q_left"] is None  # the marker was not taken for save c
