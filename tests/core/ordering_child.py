"""Child side of the ordering harness: import targets and install the shim in one given order.

argv: ordering, comma list of patches, comma list of modules to import, optional setup module
whose register_all() declares extra (test-only) families, optional comma list of modules the
submodule-first ordering imports before installing. Prints one JSON line: per target its
status, how many colo-shim wrapper layers sit on the attribute (must be 1 when applied, 0 after
uninstall), and whether the attribute is the original object after uninstall.
"""

import importlib
import json
import sys

ordering, patches, modules = sys.argv[1], sys.argv[2].split(","), [m for m in sys.argv[3].split(",") if m]
setup = sys.argv[4] if len(sys.argv) > 4 else ""
first = [m for m in (sys.argv[5] if len(sys.argv) > 5 else "").split(",") if m]

if setup:
    importlib.import_module(setup).register_all()

import colo_shim  # noqa: E402
from colo_shim.core import registry
from colo_shim.core import wrapping  # noqa: E402


def install():
    colo_shim.install(patches)


def load():
    for name in modules:
        importlib.import_module(name)


def layers(key):
    module_name, attribute = key.split(":", 1)
    module = sys.modules.get(module_name)
    if module is None:
        return None
    try:
        owner, name = wrapping.resolve_owner(module, attribute)
    except AttributeError:
        return None
    obj, depth = vars(owner).get(name), 0
    while isinstance(obj, wrapping.ShimWrapper):
        depth, obj = depth + 1, obj.__wrapped__
    return depth


def raw(key):
    module_name, attribute = key.split(":", 1)
    module = sys.modules.get(module_name)
    try:
        owner, name = wrapping.resolve_owner(module, attribute)
    except (AttributeError, TypeError):
        return None
    return vars(owner).get(name)


if ordering == "shim-first":
    install(); load()
elif ordering == "target-first":
    load(); install()
elif ordering == "submodule-first":
    for name in first:  # a submodule (or sibling) that pulls the target in before the shim exists
        importlib.import_module(name)
    install(); load()
elif ordering == "install-twice":
    install(); load(); install()
elif ordering == "reinstall":
    load(); install(); colo_shim.uninstall(); install()
elif ordering == "uninstall":
    load()
    keys = [r["target"] for r in registry.status() if r["name"] in patches]
    before = {k: raw(k) for k in keys}
    install(); colo_shim.uninstall()
    print(json.dumps({"restored": {k: raw(k) is before[k] for k in keys},
                      "layers": {k: layers(k) for k in keys}}))
    sys.exit(0)
else:
    raise SystemExit(f"unknown ordering {ordering}")

records = [r for r in colo_shim.status() if r["name"] in patches]
print(json.dumps({"status": {r["target"]: r["status"] for r in records},
                  "reason": {r["target"]: r["reason"] for r in records},
                  "layers": {r["target"]: layers(r["target"]) for r in records}}))
