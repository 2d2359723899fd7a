"""`colo-shim bundle DIR`: a bootstrap directory for interpreters where colo-shim is not installed.

NeMo-RL gives every Ray actor class its own uv venv, built from its own lock file; installing one
more package there means editing the job. A directory on PYTHONPATH reaches them all. wrapt is
copied without its C extension (it falls back to pure Python), so the bundle works for any
CPython ABI the job uses, and it sits under _colo_shim_vendor/ so a host's own wrapt wins.
"""

from __future__ import annotations

import compileall
import hashlib
import os
import shutil
import sys
import tempfile

VENDOR = "_colo_shim_vendor"  # the bootstrap sitecustomize names it too (it cannot import this module)
_COPIED = ("colo_shim", "wrapt", "packaging")
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "*.pyd", "*.c", "*.h")  # pure Python only


def _package_dir(name: str) -> str:
    """Found, not imported: importing wrapt costs ~0.1 s, paid by every `colo-shim run` otherwise."""
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"colo-shim bundle needs the package {name}, not found by {sys.executable}")
    return os.path.abspath(list(spec.submodule_search_locations)[0])


def bundle(dest: str) -> str:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the colo_shim package
    dest = os.path.abspath(dest)
    os.makedirs(dest, exist_ok=True)
    shutil.copy2(os.path.join(here, "bootstrap", "sitecustomize.py"), os.path.join(dest, "sitecustomize.py"))
    for name in _COPIED:
        parent = dest if name == "colo_shim" else os.path.join(dest, VENDOR)
        out = os.path.join(parent, name)
        if os.path.exists(out):
            shutil.rmtree(out)
        shutil.copytree(_package_dir(name), out, ignore=_IGNORE)
    # bytecode for this interpreter's version (others ignore it): jobs often run with
    # PYTHONDONTWRITEBYTECODE or a read-only bundle, and would otherwise compile it in every process
    compileall.compile_dir(dest, quiet=1, workers=1)
    return dest


def add_vendor_path() -> None:
    """Make a bundle's wrapt/packaging importable here (the bootstrap adds them only when active)."""
    vendor = os.path.join(os.path.dirname(_package_dir("colo_shim")), VENDOR)
    if os.path.isdir(vendor) and vendor not in sys.path:
        sys.path.append(vendor)


def _digest() -> str:
    """Names, sizes and mtimes of what a bundle copies: a changed install gets a fresh bundle."""
    digest = hashlib.sha256()
    for name in _COPIED:
        root = _package_dir(name)
        for folder, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for file in sorted(f for f in files if f.endswith(".py")):
                st = os.stat(os.path.join(folder, file))
                digest.update(f"{os.path.relpath(folder, root)}/{file}:{st.st_size}:{st.st_mtime_ns};".encode())
    return digest.hexdigest()[:16]


def cache_root() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "colo-shim")


def cached(root: str | None = None) -> str:
    """The bundle `colo-shim run` puts on PYTHONPATH: built once per installed version, reused.

    Built beside its final name and renamed into place, so ranks that start `colo-shim run` at the
    same moment (srun, torchrun per node) never see a half-written one.
    """
    if root is None:
        root = cache_root()
        try:
            os.makedirs(root, exist_ok=True)
        except OSError:  # read-only home: a per-user temporary directory still works
            root = os.path.join(tempfile.gettempdir(), f"colo-shim-{os.getuid()}")
    os.makedirs(root, exist_ok=True)
    final = os.path.join(root, f"bundle-{_digest()}")
    if os.path.isfile(os.path.join(final, "sitecustomize.py")):
        return final
    tmp = tempfile.mkdtemp(prefix=".bundle-", dir=root)
    try:
        bundle(tmp)
        os.rename(tmp, final)
    except OSError:
        if not os.path.isfile(os.path.join(final, "sitecustomize.py")):  # not another rank's win
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
