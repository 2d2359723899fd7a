"""The command line of a scenario script: `python SCRIPT.py NAME '{json}'` runs NAME(options), and
`python SCRIPT.py --cases '[[KEY, NAME, {json}], ...]'` runs several in this one process, in order.

The result is printed as the last stdout line (what runner.Outcome.result reads); then the
children are killed (the results-queue manager, any NVRx worker left) and the process exits
without NVRx's __del__ joins at teardown, which can block on a worker: the result is already out.

Several cases in one process pay once for what every scenario process pays before its first save
(torch, NVRx and gloo in the trainer, NVRx's results-queue manager, which imports torch again):
about half of a scenario's CPU. Each case still has its own queue, hence its own worker, and its
own directory; a case that raises is reported as its own error line and the next one runs. A case
whose checks read this process's first or only warning, or that needs other settings, keeps a
process of its own.
"""

import gc
import json
import os
import sys
import traceback


def main(scenarios: dict) -> None:
    if sys.argv[1] == "--cases":
        run_cases(scenarios, json.loads(sys.argv[2]))
    else:
        name, options = sys.argv[1], json.loads(sys.argv[2] if len(sys.argv) > 2 else "{}")
        print(json.dumps(scenarios[name](options), default=str), flush=True)
    import multiprocessing

    for child in multiprocessing.active_children():
        child.kill()
    os._exit(0)


def run_cases(scenarios: dict, cases: list) -> None:
    """One line {"case": KEY, "result": ...} (or "error": the traceback) per case, as it ends; a
    `[case KEY]` line on stderr before each, so that a test reads what its own case wrote there."""
    for key, name, options in cases:
        print(f"[case {key}]", file=sys.stderr, flush=True)
        try:
            line = {"case": key, "result": scenarios[name](options)}
        except Exception:
            line = {"case": key, "error": traceback.format_exc()[-4000:]}
        print(json.dumps(line, default=str), flush=True)
        gc.collect()  # the case's queues go (NVRx and colo-shim track them weakly) before the next fences
