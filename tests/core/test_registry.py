"""The registry against real wrapt, in fresh interpreters, over a test-only target package."""

import json

import pytest

from helpers import TARGETS, last_json, run_python
from ordering import ORDERINGS, check_orderings, run_ordering

SETUP = "shimtest_family"
PATH = (TARGETS,)
ALL_TARGETS = {f"shimtarget.sub:{a}" for a in
               ("Engine.step", "Engine.build", "Engine.helper", "Engine.step_async", "free", "free_async")}


def test_every_ordering_wraps_once_and_uninstall_restores_exactly():
    check_orderings(["shimtest"], ["shimtarget.sub"], expected_applied=ALL_TARGETS, setup=SETUP,
                    first=["shimtarget.sub.deep"], pythonpath=PATH)


@pytest.mark.parametrize("ordering", ORDERINGS)
@pytest.mark.parametrize("patch,expected", [
    ("shimtest_old", {"shimtarget.sub:free": "unsupported-version"}),
    ("shimtest_fixed", {"shimtarget.sub:free": "not-needed"}),
    ("shimtest_drift", {"shimtarget.sub:Engine.renamed": "target-missing",
                        "shimtarget.sub:Engine.optional_thing": "target-missing"}),
])
def test_gates_hold_in_every_ordering(ordering, patch, expected):
    result = run_ordering(ordering, [patch], ["shimtarget.sub"], setup=SETUP, first=["shimtarget.sub.deep"],
                          pythonpath=PATH)
    assert result["status"] == expected, result
    assert not any(result["layers"].values()), result


def test_gate_reasons_and_log_lines():
    patches = ["shimtest_old", "shimtest_fixed", "shimtest_drift"]
    # two patches share the target key 'free'; check each through its own record instead
    child = run_python(f"""
        import json, shimtest_family, colo_shim
        shimtest_family.register_all()
        colo_shim.install({patches!r})
        import shimtarget.sub
        print(json.dumps([(r["name"], r["target"], r["status"], r["reason"]) for r in colo_shim.status()
                          if r["name"] in {patches!r}]))
    """, pythonpath=PATH)
    rows = {(n, t): (s, r) for n, t, s, r in last_json(child)}
    assert rows[("shimtest_old", "shimtarget.sub:free")][0] == "unsupported-version"
    assert "shimtarget 1.0 not in '>=2'" in rows[("shimtest_old", "shimtarget.sub:free")][1]
    assert rows[("shimtest_fixed", "shimtarget.sub:free")] == ("not-needed", "shimtarget has the fix")
    assert rows[("shimtest_drift", "shimtarget.sub:Engine.renamed")][0] == "target-missing"
    assert "renamed" in rows[("shimtest_drift", "shimtarget.sub:Engine.renamed")][1]
    assert "Engine.renamed" in child.stderr and "optional_thing" not in child.stderr  # optional: debug only


def test_wrappers_run_count_calls_and_keep_behaviour():
    child = run_python("""
        import asyncio, inspect, json, shimtest_family, colo_shim
        shimtest_family.register_all()
        colo_shim.install(["shimtest"])
        from shimtarget.sub import Engine, free, free_async
        e = Engine()
        out = [e.step(1), Engine.build(2), e.build(2), Engine.helper(3), e.helper(3), asyncio.run(e.step_async(1)),
               free(1), free(1, 1, c=1), asyncio.run(free_async(7))]
        sig = [str(inspect.signature(f)) for f in (free, Engine.step, e.step, Engine.build, Engine.helper)]
        coro = [inspect.iscoroutinefunction(f) for f in (free_async, e.step_async, Engine.step_async, free, e.step)]
        calls = {r["target"].split(":")[1]: r["calls"] for r in colo_shim.status() if r["name"] == "shimtest"}
        print(json.dumps([out, sig, coro, shimtest_family.CALLS, calls]))
    """, pythonpath=PATH)
    out, sig, coro, calls_seen, counts = last_json(child)
    assert out == [2, 4, 4, 2, 2, 11, 6, 3, 7]
    assert sig == ["(a, b=2, *, c=3)", "(self, x)", "(x)", "(x)", "(x)"]
    assert coro == [True, True, True, False, False]
    assert calls_seen == ["step", "build", "build", "helper", "helper", "step_async", "free", "free", "free_async"]
    assert counts == {"Engine.step": 1, "Engine.build": 2, "Engine.helper": 2, "Engine.step_async": 1,
                      "free": 2, "free_async": 1}


def test_exception_in_hook_never_breaks_the_import():
    child = run_python("""
        import json, shimtest_family, colo_shim
        shimtest_family.register_all()
        colo_shim.install(["shimtest_broken"])
        import shimtarget.sub
        rec = [r for r in colo_shim.status() if r["name"] == "shimtest_broken"][0]
        print(json.dumps([shimtarget.sub.free(1), rec["status"], rec["reason"]]))
    """, pythonpath=PATH)
    assert last_json(child) == [6, "failed", "RuntimeError: detector bug"]
    assert "patch shimtest_broken shimtarget.sub:free failed: RuntimeError: detector bug" in child.stderr


def test_strict_mode_raises_at_install_for_unsupported_and_broken():
    code = """
        import shimtest_family, colo_shim
        shimtest_family.register_all()
        {pre}
        try:
            colo_shim.install([{name!r}], strict=True)
        except ValueError as exc:
            print("RAISED", exc)
    """
    old = run_python(code.format(pre="", name="shimtest_old"), pythonpath=PATH)
    assert "RAISED shimtest_old: shimtarget 1.0 not in '>=2'" in old.stdout
    broken = run_python(code.format(pre="import shimtarget.sub", name="shimtest_broken"), pythonpath=PATH)
    assert "RAISED shimtest_broken shimtarget.sub:free: failed: RuntimeError: detector bug" in broken.stdout
    lenient = run_python(code.format(pre="import shimtarget.sub", name="shimtest_broken").replace(
        "strict=True", "strict=False"), pythonpath=PATH)
    assert "RAISED" not in lenient.stdout


def test_concurrent_install_and_import_wrap_once():
    child = run_python("""
        import json, threading, shimtest_family, colo_shim
        from colo_shim.core import wrapping
        shimtest_family.register_all()
        barrier = threading.Barrier(8)
        def worker(i):
            barrier.wait()
            if i % 2:
                colo_shim.install(["shimtest"])
            else:
                import shimtarget.sub
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        [t.start() for t in threads]; [t.join() for t in threads]
        import shimtarget.sub
        step = vars(shimtarget.sub.Engine)["step"]
        print(json.dumps([isinstance(step, wrapping.ShimWrapper),
                          isinstance(step.__wrapped__, wrapping.ShimWrapper),
                          sorted({r["status"] for r in colo_shim.status() if r["name"] == "shimtest"})]))
    """, pythonpath=PATH)
    assert last_json(child) == [True, False, ["applied"]]


def test_applied_patch_logs_one_info_line_and_inactive_logs_nothing():
    active = run_python("""
        import shimtest_family, colo_shim
        shimtest_family.register_all()
        colo_shim.install(["shimtest"]); colo_shim.install(["shimtest"])
        import shimtarget.sub
    """, pythonpath=PATH, env={"COLO_SHIM_LOG_LEVEL": "INFO"})
    lines = [line for line in active.stderr.splitlines() if "patched shimtest " in line]
    assert len(lines) == 6, active.stderr
    assert any("shimtarget.sub:free (shimtarget 1.0)" in line for line in lines)
    quiet = run_python("import colo_shim, shimtarget.sub", pythonpath=PATH, env={"COLO_SHIM_LOG_LEVEL": "DEBUG"})
    assert quiet.stderr == "" and quiet.stdout == ""


def test_status_json_shape():
    child = run_python("""
        import json, shimtest_family, colo_shim
        shimtest_family.register_all()
        print(json.dumps(colo_shim.install(["shimtest"])))
    """, pythonpath=PATH)
    records = [r for r in last_json(child) if r["name"] == "shimtest"]
    assert {r["status"] for r in records} == {"pending"}
    assert set(records[0]) >= {"name", "target", "status", "reason", "installed_version", "supported", "calls"}
    json.dumps(records)
