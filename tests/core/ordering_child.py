"""Child side of the ordering harness: import targets and install the shim in one given order.

argv: ordering, or a chain of orderings (comma list) each of whose steps begin with all of the
previous one's; comma list of patches; comma list of modules to import; optional setup module
whose register_all() declares extra (test-only) families; optional comma list of modules the
submodule-first ordering imports before installing. Prints one JSON line per ordering, when its
last step is done: per target its status and how many colo-shim wrapper layers sit on the
attribute (must be 1 when applied); after uninstall, whether each attribute is the original
object again and its layers (0).
"""

import importlib
import json
import sys

chain, patches, modules = sys.argv[1].split(","), sys.argv[2].split(","), [m for m in sys.argv[3].split(",") if m]
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


STEPS = {  # each ordering from a fresh interpreter
    "shim-first": ("install", "load"),
    "target-first": ("load", "install"),
    "submodule-first": ("first", "install", "load"),
    "install-twice": ("install", "load", "install"),
    "reinstall": ("load", "install", "uninstall", "install"),
    "uninstall": ("load", "install", "uninstall"),
}
for before, after in zip(chain, chain[1:]):
    if STEPS[after][:len(STEPS[before])] != STEPS[before]:
        raise SystemExit(f"{after} does not go on from {before}: {STEPS[after]} vs {STEPS[before]}")


def first_modules():
    for name in first:  # a submodule (or sibling) that pulls the target in before the shim exists
        importlib.import_module(name)


ACTIONS = {"install": install, "load": load, "first": first_modules, "uninstall": lambda: colo_shim.uninstall()}
originals, done = None, 0
for ordering in chain:
    for step in STEPS[ordering][done:]:
        if step == "install" and originals is None and "uninstall" in chain:
            # what each attribute is before any install (after the targets' import), for the check
            registry.families()  # the declarations, so that a real family's targets are known here
            keys = [r["target"] for r in registry.status() if r["name"] in patches]
            originals = {k: raw(k) for k in keys}
        ACTIONS[step]()
    done = len(STEPS[ordering])
    if ordering == "uninstall":
        print(json.dumps({"ordering": ordering, "restored": {k: raw(k) is originals[k] for k in originals},
                          "layers": {k: layers(k) for k in originals}}), flush=True)
        continue
    records = [r for r in colo_shim.status() if r["name"] in patches]
    print(json.dumps({"ordering": ordering, "status": {r["target"]: r["status"] for r in records},
                      "reason": {r["target"]: r["reason"] for r in records},
                      "layers": {r["target"]: layers(r["target"]) for r in records}}), flush=True)
