"""Per-call overhead of a patched no-op through the real registry, per wrapt version and mode.

Every patched entry point sits on a hot-ish path (NVRx's queue calls, vLLM's sleep/wake), so the
cost that matters is what one call pays for wrapt's proxy plus the registry's call counter.
Pure-Python mode is what a `colo-shim bundle` runs when the host venv has no wrapt.
Goal: <= 1 us added per call.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess

from _common import BENCH, REPO, save

from harness import envs
from harness.procs import clean_env

CHILD = os.path.join(BENCH, "_overhead_child.py")


def run(python: str, extra_path: list[str], pure: bool, number: int) -> dict:
    env = clean_env(PYTHONPATH=os.pathsep.join([REPO, BENCH, *extra_path]))
    if pure:
        env["WRAPT_DISABLE_EXTENSIONS"] = "1"
    proc = subprocess.run([python, CHILD, str(number)], env=env, capture_output=True, text=True, timeout=300,
                          cwd="/")
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr)
    return json.loads(proc.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--number", type=int, default=200_000)
    args = parser.parse_args()
    python = envs.base_python("3.12")
    rows = []
    print(f"per-call time of a no-op, median of 9 x {args.number} calls, Python 3.12")
    print(f"{'wrapt':8s} {'mode':12s} {'callable':9s} {'plain ns':>9s} {'patched ns':>11s} {'added ns':>9s} "
          f"{'bare wrapt ns':>13s}")
    for major in ("2", "1"):
        tree = envs.wrapt_tree("3.12", major)
        for pure in (False, True):
            out = run(python, [tree], pure, args.number)
            assert out["c_extension"] is (not pure), out
            for kind in ("method", "function"):
                plain, patched = out["before"][kind][0], out["after"][kind][0]
                row = {"wrapt": out["wrapt"], "mode": "pure-python" if pure else "C extension", "callable": kind,
                       "plain_ns": plain, "patched_ns": patched, "added_ns": patched - plain,
                       "min_plain_ns": out["before"][kind][1], "min_patched_ns": out["after"][kind][1],
                       "bare_wrapt_ns": out["raw_wrapt_ns"][kind]}
                rows.append(row)
                print(f"{row['wrapt']:8s} {row['mode']:12s} {kind:9s} {plain:9.1f} {patched:11.1f} "
                      f"{row['added_ns']:+9.1f} {row['bare_wrapt_ns']:13.1f}")
            calibration = out["calibration_ns"]
            assert all(c > 0 for c in out["counted"].values()), out  # the calls went through the registry
    print("bare wrapt: the same no-op behind wrapt.FunctionWrapper alone (no registry, no ShimWrapper)")
    print(f"this machine: a Python-level wrapper call {calibration['python_wrapper_call']:.0f} ns, "
          f"a raised+caught AttributeError {calibration['attribute_error']:.0f} ns")
    print("goal: <= 1000 ns added per call")
    print("wrote", save("overhead", {"number": args.number, "rows": rows, "goal_ns": 1000,
                                     "calibration_ns": calibration}))


if __name__ == "__main__":
    main()
