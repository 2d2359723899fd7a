"""The drop function travels into the NVRx worker as a pickled reference (module + name).

The worker unpickles it in a process that may not have the shim active, so resolving it must
import nothing heavy; a reference written under the module's old name (colo_shim.nvrx_worker,
before the fence moved into its own folder) must still resolve to the same function.
"""

from helpers import last_json, run_python


def test_old_and_new_references_resolve_in_a_bare_interpreter():
    child = run_python("""
        import json, pickle, sys
        old = pickle.loads(b"ccolo_shim.nvrx_worker\\ndrop_cached_tensors\\n.")
        from colo_shim.checkpoint import worker
        new = pickle.loads(pickle.dumps(worker.drop_cached_tensors))
        heavy = sorted(m for m in ("wrapt", "colo_shim.core.registry", "torch") if m in sys.modules)
        print(json.dumps({"same": old is worker.drop_cached_tensors and new is old,
                          "module": new.__module__, "heavy": heavy}))
        """, env={"COLO_SHIM": ""})
    assert last_json(child) == {"same": True, "module": "colo_shim.checkpoint.worker", "heavy": []}
