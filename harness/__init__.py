"""What the tests and the benchmarks both run on: fresh interpreters, the venvs the activation paths
are measured in, the vLLM scenario runner and the CPU stand-in for CUDA.

A home of its own because both sides use it and neither may reach into the other: a benchmark that
put tests/ on sys.path broke whenever a test helper moved, and none of this may ship (colo_shim/ is
the wheel's only package). Nothing here is a test or a benchmark; importing it needs the repo root
on sys.path, which tests/conftest.py and bench/_common.py put there.
"""
