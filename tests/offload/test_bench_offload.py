"""bench/offload on the CPU (--tiny, the mcore path), so the H200 script cannot rot between runs:
both children run in a colocated job's order (an offload before any optimizer state, then the
rounds), every round is bit-identical, and with colo-shim the later rounds reuse mirrors."""

import json
import os
import subprocess

from harness.procs import PYTHON, REPO, clean_env
from helpers import deps_dir


def test_bench_runs_tiny_on_the_cpu(tmp_path):
    os.symlink(deps_dir("mcore", "0.19.2"), tmp_path / "mcore")
    out = tmp_path / "offload.json"
    cmd = [PYTHON, os.path.join(REPO, "bench", "offload", "bench_offload.py"), "--tiny", "--paths", "mcore",
           "--rounds", "2", "--site", str(tmp_path), "--out", str(out)]
    proc = subprocess.run(cmd, env=clean_env(), capture_output=True, text=True, timeout=240, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    plain, shim = json.loads(out.read_text())
    for record in (plain, shim):
        assert record["path"] == "mcore" and record["bit_identical"] is True and record["tensors"] > 0, record
        assert len(record["offload_s"]) == len(record["reload_s"]) == 2 and record["gib"] > 0, record
    assert (plain["colo_shim"], shim["colo_shim"]) == (False, True) and plain["shim"] is None
    report = shim["shim"]
    assert report["fresh"] == record["tensors"] and report["fallbacks"] == 0, report  # each tensor mirrored once
    assert report["reused"] >= record["tensors"], report  # and every later offload reused it
    assert report["mode"].startswith("pageable mirrors"), report
    for record in (plain, shim):  # a job's first refit: an offload before the optimizer has state
        first = record["before_state"]
        assert 0 < first["gib"] < record["gib"] and first["offload_s"] >= 0, record
    assert "| mcore | True |" in proc.stdout and "1st with state s" in proc.stdout
