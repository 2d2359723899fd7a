"""The drop function travels into the NVRx worker as a pickled reference (module + name).

The worker unpickles it in a process that may not have the shim active, so resolving it must
import nothing heavy. Only a trainer and its own worker, one install, ever exchange the reference
(over NVRx's queue, never on disk), so it names the function's one home and no former one.
"""

import pickle

from helpers import last_json, run_python

from colo_shim.checkpoint import worker


def test_a_trainers_reference_resolves_first_thing_in_a_bare_interpreter():
    ref = pickle.dumps(worker.drop_cached_tensors)  # what the trainer puts on the worker's queue
    child = run_python(f"""
        import json, pickle, sys
        fn = pickle.loads({ref!r})  # the worker's first contact with colo_shim
        heavy = sorted(m for m in ("wrapt", "colo_shim.core.registry", "torch") if m in sys.modules)
        home = sys.modules["colo_shim.checkpoint.worker"]
        print(json.dumps({{"same": fn is home.drop_cached_tensors, "heavy": heavy}}))
        """, env={"COLO_SHIM": ""})
    assert worker.drop_cached_tensors.__module__ == "colo_shim.checkpoint.worker"
    assert last_json(child) == {"same": True, "heavy": []}
