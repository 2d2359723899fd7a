"""`import colo_shim` and install() on every supported Python, with wrapt 1.x and 2.x.

Importing colo_shim happens in every interpreter of a job (the activator sits everywhere), so it
must never pull in torch, vLLM, megatron or NVRx, and when inactive not even wrapt. The heavy
libraries are made importable in the venv312 run so that their absence means something.
"""

import os
import sys

import pytest

from harness.envs import VERSIONS, require_python, run_in, wrapt_tree
from harness.procs import REPO
from helpers import TARGETS, last_json

HEAVY = ("torch", "vllm", "megatron", "nvidia_resiliency_ext")
CHILD = r"""
import json, os, sys
HEAVY = %r
def loaded(*names):
    return sorted(n for n in names if n in sys.modules)
out = {"python": "%%d.%%d" %% sys.version_info[:2]}
import colo_shim
out["inactive_import"] = loaded("wrapt", "colo_shim.core.registry", *HEAVY)
import shimtest_family, wrapt
from colo_shim.core import registry, wrapping
registry.register(shimtest_family.PATCH)
out["wrapt"] = wrapt.__version__
records = colo_shim.install(["shimtest"])
out["pending"] = sorted(r["status"] for r in records if r["name"] == "shimtest") == ["pending"] * 6
import shimtarget.sub as t
out["applied"] = sorted({r["status"] for r in colo_shim.status() if r["name"] == "shimtest"})
out["wrapped"] = isinstance(vars(t.Engine)["build"], wrapping.ShimWrapper)
out["works"] = [t.free(1), t.Engine().step(1), t.Engine.build(2), t.Engine.helper(3)]
out["calls"] = sum(r["calls"] for r in colo_shim.status() if r["name"] == "shimtest")
colo_shim.uninstall()
out["restored"] = type(vars(t.Engine)["build"]).__name__ == "classmethod" and not hasattr(t.free, "__wrapped__")
out["heavy_after_install"] = loaded(*HEAVY)
print(json.dumps(out))
""" % (HEAVY,)
EXPECTED = {"inactive_import": [], "pending": True, "applied": ["applied"], "wrapped": True,
            "works": [6, 2, 4, 2], "calls": 4, "restored": True, "heavy_after_install": []}


@pytest.mark.parametrize("wrapt_major", ["1", "2"])
@pytest.mark.parametrize("python", VERSIONS)
def test_import_and_install_on_bare_interpreters(python, wrapt_major):
    interpreter = require_python(python)
    tree = wrapt_tree(python, wrapt_major)
    out = last_json(run_in(interpreter, CHILD, env={"PYTHONPATH": os.pathsep.join([REPO, TARGETS, tree])}))
    assert out.pop("python") == python and out.pop("wrapt").split(".")[0] == wrapt_major
    assert out == EXPECTED


def test_no_heavy_import_where_all_of_them_are_importable():
    deps = [os.path.join(REPO, ".deps", d) for d in ("nvrx-0.7.0", "mcore-0.19.2")]
    deps = [d for d in deps if os.path.isdir(d)]
    path = os.pathsep.join([REPO, TARGETS, *deps])
    for env in ({}, {"COLO_SHIM": "1"}):
        probe = run_in(sys.executable, "import importlib.util as u; print([u.find_spec(n) is not None for n in %r])"
                       % (HEAVY,), env={"PYTHONPATH": path})
        assert probe.stdout.startswith("[True"), probe.stdout  # torch at least is really there
        out = last_json(run_in(sys.executable, CHILD, env={"PYTHONPATH": path, **env}))
        out.pop("python"), out.pop("wrapt")
        if env:  # active at import: only armed; wrapt and the registry wait for the first target import
            assert out.pop("inactive_import") == []
            assert out == {k: v for k, v in EXPECTED.items() if k != "inactive_import"}
        else:
            assert out == EXPECTED
