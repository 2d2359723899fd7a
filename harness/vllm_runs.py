"""A vLLM scenario script on the NeMo-RL and vLLM doubles, in a fresh interpreter per layout.

Layout roots share module names (nemo_rl...), so each layout runs in its own interpreter; the vLLM
version comes from a `vllm-<ver>.dist-info` metadata directory on PYTHONPATH (metadata only: the
behaviour is the engine double's, see tests/doubles/vllm_engine). The scenario scripts and the
doubles stay with the tests that check them (tests/discard, tests/doubles); bench/bench_discard.py
measures the same scenario, and both reach it through here, as a child, never as an import.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from harness.procs import REPO

DOUBLES = os.path.join(REPO, "tests", "doubles")
SCENARIOS = os.path.join(REPO, "tests", "discard")
PYTHON = sys.executable


def dist_info(tmp_root: str, version: str) -> str:
    """A `vllm-<version>.dist-info` metadata directory: the vLLM version the engine double reports."""
    path = os.path.join(tmp_root, f"vllm-{version}")
    meta = os.path.join(path, f"vllm-{version}.dist-info")
    os.makedirs(meta, exist_ok=True)
    with open(os.path.join(meta, "METADATA"), "w") as fh:
        fh.write(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return path


def env_for(layout: str, vllm_dir: str, bootstrap: bool = False, extra: dict | None = None) -> dict:
    # DOUBLES: nemo_rl_common, shared by the release roots; SCENARIOS: the scripts' own modules, which
    # Ray actor processes import by name
    parts = [REPO, os.path.join(DOUBLES, f"nemo_rl_{layout}"), DOUBLES, os.path.join(DOUBLES, "vllm_engine"), vllm_dir,
             SCENARIOS]
    if bootstrap:
        parts.insert(0, os.path.join(REPO, "colo_shim", "bootstrap"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COLO_SHIM", "RAY_"))}
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env.update(extra or {})
    return env


def run_script(script: str, layout: str, vllm_dir: str, args: dict | None = None, timeout: float = 120,
               bootstrap: bool = False, extra_env: dict | None = None) -> dict:
    """Run SCENARIOS/script with args as its JSON argument; what it printed after `RESULT `."""
    cmd = [PYTHON, os.path.join(SCENARIOS, script)]
    if args is not None:
        cmd.append(json.dumps(args))
    proc = subprocess.run(cmd, env=env_for(layout, vllm_dir, bootstrap, extra_env), capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    why = f"{script} failed (rc={proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0 and lines, why
    return json.loads(lines[-1][len("RESULT "):])
