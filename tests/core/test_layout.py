"""The package's shape is a promise: core imports no fix, nothing imports in a circle, and the
public names stay what users call (a subpackage named like a public function would shadow it).

Imports are read from the source with ast, function-level imports included, because a lazy
import inside a function is still a dependency that can close a circle at run time.
"""

import ast
import os
import pkgutil

from harness.procs import REPO
from helpers import deps_dir, last_json, run_python

PKG = os.path.join(REPO, "colo_shim")


def _modules() -> dict[str, str]:
    found = {}
    for root, _, files in os.walk(PKG):
        for name in files:
            if name.endswith(".py"):
                rel = os.path.relpath(os.path.join(root, name), REPO)[:-3].replace(os.sep, ".")
                found[rel[:-len(".__init__")] if rel.endswith(".__init__") else rel] = os.path.join(root, name)
    return found


def _edges(modules: dict[str, str]) -> dict[str, set]:
    edges = {}
    for mod, path in modules.items():
        out = edges.setdefault(mod, set())
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                         for a in node.names]
            else:
                continue
            out.update(n for n in names if n in modules and n != mod)
    return edges


def test_no_import_cycles_and_core_imports_no_fix():
    edges = _edges(_modules())
    for mod in edges:
        if mod.startswith("colo_shim.core"):
            assert all(d.startswith("colo_shim.core") for d in edges[mod]), (mod, edges[mod])
    state, stack = {}, []

    def visit(mod):
        state[mod] = "open"
        stack.append(mod)
        for dep in edges[mod]:
            assert state.get(dep) != "open", "import cycle: " + " -> ".join(stack[stack.index(dep):] + [dep])
            if dep not in state:
                visit(dep)
        stack.pop()
        state[mod] = "done"

    for mod in sorted(edges):
        if mod not in state:
            visit(mod)


def test_at_most_eight_modules_at_the_top():
    top = [m.name for m in pkgutil.iter_modules([PKG]) if not m.ispkg]
    assert len(top) <= 8, top


def test_public_api_survives_every_submodule_import():
    child = run_python("""
        import importlib, json, pkgutil, colo_shim
        for m in pkgutil.walk_packages(colo_shim.__path__, "colo_shim."):
            if not m.name.endswith(("__main__", "sitecustomize")):  # these run a program
                importlib.import_module(m.name)
        print(json.dumps({n: callable(getattr(colo_shim, n)) and not hasattr(getattr(colo_shim, n), "__path__")
                          for n in colo_shim.__all__ if n != "__version__"}))
        """, pythonpath=(deps_dir("nvrx", "0.7.0"),))  # cli/saver.py drives real NVRx
    assert last_json(child) == {"install": True, "uninstall": True, "status": True, "fence": True}


def test_tests_root_holds_only_conftest():
    # helpers live in the room they serve; what several rooms share is tests/support/ (on sys.path via conftest)
    tests = os.path.join(REPO, "tests")
    assert sorted(n for n in os.listdir(tests) if n.endswith(".py")) == ["conftest.py"]


def test_bench_imports_nothing_from_tests():
    # what both use lives in harness/: a benchmark that put a tests/ folder on sys.path broke whenever a
    # test helper moved. The doubles and test targets stand in for upstream modules, so their names are not ours
    tests = os.path.join(REPO, "tests")
    rooms = [tests] + [os.path.join(tests, room) for room in os.listdir(tests) if room not in ("doubles", "targets")]
    ours = {name[:-3] for folder in rooms if os.path.isdir(folder)
            for name in os.listdir(folder) if name.endswith(".py")}
    found = []
    for folder, _, files in os.walk(os.path.join(REPO, "bench")):
        for name in (n for n in files if n.endswith(".py")):
            path = os.path.join(folder, name)
            for node in ast.walk(ast.parse(open(path).read(), path)):
                if isinstance(node, ast.Import):
                    tops = [alias.name.split(".")[0] for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level:
                    tops = [node.module.split(".")[0]]
                else:
                    text = ast.unparse(node) if isinstance(node, (ast.Call, ast.Assign)) else ""
                    tops = ["tests"] if "sys.path" in text and "'tests'" in text else []
                found += [f"{os.path.relpath(path, REPO)}:{node.lineno}: {top}" for top in tops
                          if top in ours | {"tests"}]
    assert not found, found
