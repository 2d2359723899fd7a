"""Shared plumbing for tests/test_vllm_*.py: run a helper script in a fresh interpreter.

Layout roots share module names (nemo_rl...), so each layout runs in its own interpreter;
the vLLM version comes from a `vllm-<ver>.dist-info` metadata directory on PYTHONPATH
(metadata only: the behaviour is the engine double's, see tests/doubles/vllm_engine).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(REPO, "tests")
DOUBLES = os.path.join(TESTS, "doubles")
PYTHON = sys.executable


def dist_info(tmp_root: str, version: str) -> str:
    path = os.path.join(tmp_root, f"vllm-{version}")
    meta = os.path.join(path, f"vllm-{version}.dist-info")
    os.makedirs(meta, exist_ok=True)
    with open(os.path.join(meta, "METADATA"), "w") as fh:
        fh.write(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return path


def env_for(layout: str, vllm_dir: str, bootstrap: bool = False, extra: dict | None = None) -> dict:
    parts = [REPO, os.path.join(DOUBLES, f"nemo_rl_{layout}"), DOUBLES, os.path.join(DOUBLES, "vllm_engine"), vllm_dir,
             TESTS]  # DOUBLES: nemo_rl_common, shared by the release roots
    if bootstrap:
        parts.insert(0, os.path.join(REPO, "colo_shim", "bootstrap"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COLO_SHIM", "RAY_"))}
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env.update(extra or {})
    return env


def run_script(script: str, layout: str, vllm_dir: str, args: dict | None = None, timeout: float = 120,
               bootstrap: bool = False, extra_env: dict | None = None) -> dict:
    cmd = [PYTHON, os.path.join(TESTS, script)]
    if args is not None:
        cmd.append(json.dumps(args))
    proc = subprocess.run(cmd, env=env_for(layout, vllm_dir, bootstrap, extra_env), capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"{script} failed (rc={proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def sleeps(events: list[dict]) -> list[tuple[int, str]]:
    """(level, what came next) for every sleep: 'refit' (wake weights only), 'wake' (full) or 'end'."""
    out = []
    for i, ev in enumerate(events):
        if ev["event"] != "sleep":
            continue
        nxt = next((e for e in events[i + 1:] if e["event"] == "wake_up"), None)
        kind = "end" if nxt is None else ("refit" if nxt["tags"] == ["weights"] else "wake")
        out.append((ev["level"], kind))
    return out
