"""Bootstrap for `colo-shim run` and `colo-shim bundle`: activates colo_shim at interpreter start.

Python imports only the first `sitecustomize` on sys.path, so prepending ours would silently
drop the one Debian ships in the stdlib or the user's own; we therefore run the next one too.
PYTHONPATH keeps this directory so that children (spawn, Ray actors, vLLM workers) inherit it.
A bundle keeps wrapt and packaging in `_colo_shim_vendor/`, appended at the END of sys.path so
a host that has its own copies keeps using them.
"""

import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _same_dir(entry):
    try:
        return os.path.samefile(entry or os.getcwd(), _HERE)
    except OSError:
        return False


def _chain_next_sitecustomize():
    ours = sys.modules.get("sitecustomize")
    others = [p for p in sys.path if not _same_dir(p)]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        print(f"colo_shim: error in chained sitecustomize {spec.origin}: {exc!r}", file=sys.stderr)
    finally:
        if ours is not None:
            sys.modules["sitecustomize"] = ours
        sys.modules["_colo_shim_chained_sitecustomize"] = module


def _keep_on_pythonpath():
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if not any(_same_dir(p) for p in parts):
        os.environ["PYTHONPATH"] = os.pathsep.join([_HERE] + parts)


def _bootstrap():
    _keep_on_pythonpath()
    _chain_next_sitecustomize()
    vendor = os.path.join(_HERE, "_colo_shim_vendor")
    if os.path.isdir(vendor) and vendor not in sys.path:
        sys.path.append(vendor)
    try:
        from colo_shim._activate import activate
    except ImportError:
        return  # bootstrap dir reached an interpreter without colo_shim: stay out of the way
    activate()


_bootstrap()
