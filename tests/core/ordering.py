"""Import/patch ordering harness shared by every patch family (dd-trace-py's PatchTestCase idea).

Each ordering starts in a fresh interpreter, because the point is what happens when the target is
or is not yet in sys.modules; a family test calls check_orderings() with its own modules. An
ordering whose steps begin with all of another's steps continues that one's interpreter (CHAINS:
install-twice is shim-first plus one install; uninstall and reinstall go on from target-first),
so each result is what its own fresh interpreter would have shown, for a third of the start-ups
(a real megatron-core import is seconds of CPU). ordering_child.py refuses a chain that is not one.
"""

from __future__ import annotations

import json
import os

from helpers import run_python

ORDERINGS = ("shim-first", "target-first", "submodule-first", "install-twice", "reinstall")
CHAINS = (("shim-first", "install-twice"), ("target-first", "uninstall", "reinstall"), ("submodule-first",))
CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ordering_child.py")


def run_orderings(orderings, patches, modules, *, setup: str = "", first=(), pythonpath=(), env=None,
                  timeout=180) -> dict:
    """{ordering: the child's result}; a chain runs up to the last ordering asked of it."""
    out = {}
    for chain in CHAINS:
        asked = [o for o in chain if o in orderings]
        if not asked:
            continue
        upto = chain[:chain.index(asked[-1]) + 1]
        args = [",".join(upto), ",".join(patches), ",".join(modules), setup, ",".join(first)]
        proc = run_python(CHILD, args=args, pythonpath=pythonpath, env=env, timeout=timeout)
        lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"ordering"')]
        got = {line.pop("ordering"): line for line in lines}
        assert list(got) == list(upto), (upto, proc.stdout[-3000:], proc.stderr[-3000:])
        out.update(got)
    return {o: out[o] for o in orderings}


def run_ordering(ordering: str, patches, modules, **kwargs) -> dict:
    return run_orderings((ordering,), patches, modules, **kwargs)[ordering]


def check_orderings(patches, modules, *, expected_applied, setup="", first=(), pythonpath=(), env=None,
                    orderings=ORDERINGS, results=None):
    """Every ordering must apply exactly the expected targets, each wrapped exactly once, and uninstall
    must restore every original object. results: run_orderings() output to check instead of running."""
    if results is None:
        results = run_orderings((*orderings, "uninstall"), patches, modules, setup=setup, first=first,
                                pythonpath=pythonpath, env=env)
    for ordering in orderings:
        result = results[ordering]
        applied = {t for t, s in result["status"].items() if s == "applied"}
        assert applied == set(expected_applied), (ordering, result)
        for target in applied:
            assert result["layers"][target] == 1, (ordering, target, result)
    result = results["uninstall"]
    assert all(result["restored"].values()), result
    assert not any(result["layers"].values()), result
