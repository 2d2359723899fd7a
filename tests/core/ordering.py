"""Import/patch ordering harness shared by every patch family (dd-trace-py's PatchTestCase idea).

Each ordering runs in a fresh interpreter, because the point is what happens when the target is
or is not yet in sys.modules; a family test calls check_orderings() with its own modules.
"""

from __future__ import annotations

import os

from helpers import last_json, run_python

ORDERINGS = ("shim-first", "target-first", "submodule-first", "install-twice", "reinstall")
CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ordering_child.py")


def run_ordering(ordering: str, patches, modules, *, setup: str = "", first=(), pythonpath=(), env=None,
                 timeout=180) -> dict:
    args = [ordering, ",".join(patches), ",".join(modules), setup, ",".join(first)]
    return last_json(run_python(CHILD, args=args, pythonpath=pythonpath, env=env, timeout=timeout))


def check_orderings(patches, modules, *, expected_applied, setup="", first=(), pythonpath=(), env=None,
                    orderings=ORDERINGS):
    """Every ordering must apply exactly the expected targets, each wrapped exactly once."""
    for ordering in orderings:
        result = run_ordering(ordering, patches, modules, setup=setup, first=first, pythonpath=pythonpath, env=env)
        applied = {t for t, s in result["status"].items() if s == "applied"}
        assert applied == set(expected_applied), (ordering, result)
        for target in applied:
            assert result["layers"][target] == 1, (ordering, target, result)
    result = run_ordering("uninstall", patches, modules, setup=setup, pythonpath=pythonpath, env=env)
    assert all(result["restored"].values()), result
    assert not any(result["layers"].values()), result
