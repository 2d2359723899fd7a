"""Issue 32 item 5b: the mirrors' async copies are waited for on each device their tensors live on, not only
on the calling thread's current device (devices_child.py: real megatron-core, CPU stand-in for CUDA, the
page-locking recorder listing the device of every synchronize)."""

import json
import os

from helpers import deps_dir, doubles_path, run_python

HERE = os.path.dirname(os.path.abspath(__file__))


def test_each_device_of_the_copied_tensors_is_synchronized_once():
    proc = run_python(os.path.join(HERE, "devices_child.py"), timeout=240,
                      pythonpath=(HERE, deps_dir("mcore", "0.19.2"), *doubles_path("v0_7")))
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    two, other = r["two"], r["other"]
    for seen in (two, other):
        assert seen["offload_equal"] and seen["on_host"] and seen["restore_equal"] and seen["fallbacks"] == 0, seen
        assert seen["restore_synced"] == [0], seen  # megatron's restore brings it all to the current device
    # the copies' waits, by device (None: unlocking the mirrors of the tensors place() replaced, as before)
    assert two["devices"] == [0, 1] and _copies(two) == [0, 1], two  # both devices' copies, once each
    assert other["devices"] == [1] and _copies(other) == [1], other  # theirs, not the current device's


def _copies(seen) -> list:
    return [d for d in seen["offload_synced"] if d is not None]
