"""One orchestrator call of bench/e2e/run.py on the CPU (tiny model, fake engine), shared by the
e2e tests: several runs go into one call, since each call pays for a fresh driver per run only."""

from __future__ import annotations

import json
import os
import subprocess

from harness.procs import PYTHON, REPO, clean_env
from helpers import deps_dir


def run_harness(tmp_path, runs: str, val_period: int = 2, **env) -> list:
    site = tmp_path / "site"
    site.mkdir()
    os.symlink(deps_dir("mcore", "0.19.2"), site / "mcore")
    os.symlink(deps_dir("nvrx", "0.7.0"), site / "nvrx070")
    out = tmp_path / "out"
    cmd = [PYTHON, os.path.join(REPO, "bench", "e2e", "run.py"), "--runs", runs, "--size", "tiny",
           "--fake-engine", "--site", str(site), "--out", str(out), "--work", str(tmp_path / "work"),
           "--ckpt-dir", str(tmp_path / "ckpt"), "--disk-dir", str(tmp_path / "disk"), "--val-period", str(val_period),
           "--per-run-s", "240"]
    proc = subprocess.run(cmd, env=clean_env(**env), capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.load(open(out / "e2e.json"))
