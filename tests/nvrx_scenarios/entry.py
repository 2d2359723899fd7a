"""The command line of a scenario script: `python SCRIPT.py NAME '{json}'` runs NAME(options).

The result is printed as the last stdout line (what runner.Outcome.result reads); then the
children are killed (the results-queue manager, any NVRx worker left) and the process exits
without NVRx's __del__ joins at teardown, which can block on a worker: the result is already out.
"""

import json
import os
import sys


def main(scenarios: dict) -> None:
    name, options = sys.argv[1], json.loads(sys.argv[2] if len(sys.argv) > 2 else "{}")
    print(json.dumps(scenarios[name](options), default=str), flush=True)
    import multiprocessing

    for child in multiprocessing.active_children():
        child.kill()
    os._exit(0)
