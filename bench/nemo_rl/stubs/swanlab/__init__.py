"""Stand-in for swanlab: main imports it at module level; the bench keeps this logger off (see _colo_bench_stub)."""
from _colo_bench_stub import make_getattr

STUB = True
__getattr__ = make_getattr("swanlab")
