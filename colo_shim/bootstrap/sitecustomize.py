"""Bootstrap for `colo-shim run` and `colo-shim bundle`: activates colo_shim at interpreter start.

Python imports only the first `sitecustomize` on sys.path, so prepending ours would silently
drop the one Debian ships in the stdlib or the user's own; we therefore run the next one too.
PYTHONPATH keeps this directory so that children (spawn, Ray actors, vLLM workers) inherit it.
A bundle keeps wrapt and packaging in `_colo_shim_vendor/`, appended at the END of sys.path so
a host that has its own copies keeps using them.

An interpreter that COLO_SHIM asks to patch but that cannot import colo_shim (the in-package
bootstrap dir reaching another venv, an interpreter too old for the shim) would otherwise be a
silent no-op while the driver's status() says `applied`: it says so in one stderr line naming the
interpreter and the fix, and leaves a record in COLO_SHIM_STATUS_DIR for `colo-shim doctor --from`.

Every interpreter of a job runs this file, so it uses the import machinery already loaded at
start-up (importlib.util and importlib.machinery would cost more than the rest of this file).
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_OFF = ("", "0", "off", "false", "no")  # same test as the .pth line and colo_shim.core.config


def _is_here(entry):
    return os.path.abspath(entry or os.curdir) == _HERE


def _machinery():
    boot, external = sys.modules.get("_frozen_importlib"), sys.modules.get("_frozen_importlib_external")
    if boot is None or external is None:  # not CPython's frozen importlib: take the public names
        import importlib.machinery
        import importlib.util

        return importlib.machinery.PathFinder, importlib.util.module_from_spec
    return external.PathFinder, boot.module_from_spec


def _chain_next_sitecustomize():
    path_finder, module_from_spec = _machinery()
    ours = os.path.realpath(__file__)
    others = [p for p in sys.path if not _is_here(p)]
    spec = path_finder.find_spec("sitecustomize", others)
    if spec is not None and spec.origin and os.path.realpath(spec.origin) == ours:
        # this directory is also on sys.path through a symlink: drop what resolves here, look again
        here = os.path.realpath(_HERE)
        others = [p for p in others if os.path.realpath(p or os.curdir) != here]
        spec = path_finder.find_spec("sitecustomize", others)
    if spec is None or spec.loader is None or (spec.origin and os.path.realpath(spec.origin) == ours):
        return
    module = module_from_spec(spec)
    current = sys.modules.get("sitecustomize")
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        print(f"colo_shim: error in chained sitecustomize {spec.origin}: {exc!r}", file=sys.stderr)
    finally:
        if current is not None:
            sys.modules["sitecustomize"] = current
        sys.modules["_colo_shim_chained_sitecustomize"] = module


def _keep_on_pythonpath():
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if not any(_is_here(p) for p in parts):
        os.environ["PYTHONPATH"] = os.pathsep.join([_HERE] + parts)


def _bootstrap():
    _keep_on_pythonpath()
    _chain_next_sitecustomize()
    if os.environ.get("COLO_SHIM", "").strip().lower() in _OFF:
        return  # inactive: not even colo_shim is imported
    vendor = os.path.join(_HERE, "_colo_shim_vendor")
    if vendor not in sys.path and os.path.isdir(vendor):
        sys.path.append(vendor)
    try:
        from colo_shim._activate import activate
    except Exception as exc:  # never stop the job: say so instead
        _not_reached(exc)
        return
    activate()


def _fix():
    if sys.version_info[:2] < (3, 10):
        return "colo-shim needs Python 3.10-3.13: run this part of the job with one of those"
    if not os.path.isdir(os.path.join(_HERE, "colo_shim")):  # the in-package bootstrap dir, no copy beside it
        return ("start the job with `colo-shim run` (it puts colo_shim and a pure-Python wrapt on PYTHONPATH), or "
                "put a `colo-shim bundle DIR` directory on PYTHONPATH, or pip install colo-shim into this environment")
    return "the copy in %s does not import: delete it (`colo-shim run` rebuilds it) or rerun `colo-shim bundle`" % _HERE


def _not_reached(exc):
    version = "%d.%d.%d" % sys.version_info[:3]
    why = "%s: %s" % (type(exc).__name__, exc)
    sys.stderr.write("colo_shim: warning: COLO_SHIM=%r, but %s (Python %s) cannot import colo_shim (%s): the shim is "
                     "NOT active in this process. Fix: %s\n" % (os.environ.get("COLO_SHIM"), sys.executable, version,
                                                                why, _fix()))
    directory = os.environ.get("COLO_SHIM_STATUS_DIR", "").strip()
    if not directory:
        return
    try:  # same file name and keys as colo_shim.core.deferred._dump, plus why nothing was patched
        import json
        import socket

        host, pid = socket.gethostname(), os.getpid()
        path = os.path.join(directory, "%s-%d.json" % (host, pid))
        os.makedirs(directory, exist_ok=True)
        with open(path + ".tmp", "w") as fh:
            json.dump({"host": host, "pid": pid, "argv": list(getattr(sys, "argv", []) or []), "records": [],
                       "python": sys.executable, "python_version": version, "not_active": why}, fh)
        os.replace(path + ".tmp", path)
    except Exception:  # the warning above already said it
        pass


_bootstrap()
