"""Patched callables of every kind pickle by reference, copy, and keep signature and coroutine-ness,
under wrapt 1.x and 2.x, with the C extension and in pure-Python mode (the bundle's mode).

The parent is activated the way `colo-shim run` does it, so its multiprocessing spawn child is
activated too and the reference resolves to the child's own patched callable (its counter moves).
"""

import os

import pytest

from harness.envs import require_python, run_in, wrapt_tree
from harness.procs import REPO
from helpers import TARGETS, last_json

CHILD = os.path.join(TARGETS, "pickling_child.py")
BOOTSTRAP = os.path.join(REPO, "colo_shim", "bootstrap")
KINDS = {"function", "async_function", "method", "unbound_method", "classmethod", "staticmethod", "async_method"}


@pytest.fixture(scope="module")
def user_site(tmp_path_factory):
    path = tmp_path_factory.mktemp("usersite")
    (path / "sitecustomize.py").write_text("import activation_probe\nactivation_probe.install()\n")
    return str(path)


@pytest.mark.parametrize("pure", [False, True], ids=["c-ext", "pure-python"])
@pytest.mark.parametrize("wrapt_major", ["1", "2"])
def test_every_kind_pickles_copies_and_introspects(wrapt_major, pure, user_site):
    python = require_python("3.12")
    tree = wrapt_tree("3.12", wrapt_major)
    env = {"PYTHONPATH": os.pathsep.join([BOOTSTRAP, REPO, user_site, TARGETS, tree]), "COLO_SHIM": "shimtest"}
    if pure:
        env["WRAPT_DISABLE_EXTENSIONS"] = "1"
    out = last_json(run_in(python, CHILD, env=env, timeout=120))
    assert out["wrapt"].split(".")[0] == wrapt_major and out["wrapt_c"] is (not pure), out
    assert set(out["kinds"]) == KINDS
    failed = {kind: {c: v for c, v in checks.items() if v is not True} for kind, checks in out["kinds"].items()}
    assert not any(failed.values()), failed
