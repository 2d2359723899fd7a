"""`colo-shim bundle DIR`: a bootstrap directory for interpreters where colo-shim is not installed.

NeMo-RL gives every Ray actor class its own uv venv, built from its own lock file; installing one
more package there means editing the job. A directory on PYTHONPATH reaches them all. wrapt is
copied without its C extension (it falls back to pure Python), so the bundle works for any
CPython ABI the job uses, and it sits under _colo_shim_vendor/ so a host's own wrapt wins.
"""

from __future__ import annotations

import compileall
import os
import shutil

_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "*.pyd", "*.c", "*.h")  # pure Python only


def _package_dir(name: str) -> str:
    module = __import__(name)
    return os.path.dirname(os.path.abspath(module.__file__))


def bundle(dest: str) -> str:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the colo_shim package
    dest = os.path.abspath(dest)
    os.makedirs(dest, exist_ok=True)
    shutil.copy2(os.path.join(here, "bootstrap", "sitecustomize.py"), os.path.join(dest, "sitecustomize.py"))
    for name, target in (("colo_shim", dest), ("wrapt", None), ("packaging", None)):
        parent = target or os.path.join(dest, "_colo_shim_vendor")
        out = os.path.join(parent, name)
        if os.path.exists(out):
            shutil.rmtree(out)
        shutil.copytree(_package_dir(name), out, ignore=_IGNORE)
    # bytecode for this interpreter's version (others ignore it): jobs often run with
    # PYTHONDONTWRITEBYTECODE or a read-only bundle, and would otherwise compile it in every process
    compileall.compile_dir(dest, quiet=1, workers=1)
    return dest
