"""Former home of the function colo-shim sends into the NVRx checkpoint worker.

The drop request travels to the worker as a pickled reference; a reference written by an earlier
colo-shim names this module, so the name keeps resolving to the same function.
"""

from colo_shim.checkpoint.worker import MARKER, drop_cached_tensors  # noqa: F401
