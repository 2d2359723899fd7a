"""The pure parts of issue 34's harness additions: the new run options, the sweep's plan of device calls,
the KV cache of a size not measured yet, and which rows the ratios pair (no run started)."""

import pytest

from bench.e2e import compare, specs, sweep
from bench.e2e.driver import params_of
from bench.e2e.run import _free_gib


def test_spec_options_of_issue_34_and_the_names_they_give():
    mode, nvrx, steps, opts = specs.parse("shim@0.7.0:7:size=2.1b:nosave=3:verify=off:limit=250")
    got = (mode, steps, opts["size"], opts["nosave"], opts["verify"], opts["limit"])
    assert got == ("shim", 7, "2.1b", 3, "off", 250.0)
    assert specs.name(mode, nvrx, opts) == "shim@0.7.0 size=2.1b nosave=3 verify=off"  # the limit is no part of it
    assert specs.name(*(specs.parse("nosave@0.7.0:4")[:2] + (specs.parse("nosave@0.7.0:4")[3],))) == "nosave@0.7.0"
    mode, nvrx, _, opts = specs.parse("shim@0.7.0:6:nosave=2:verify=off:threads=8")
    assert opts["threads"] == 8 and specs.name(mode, nvrx, opts) == "shim@0.7.0 nosave=2 verify=off threads=8"
    assert specs.parse("shim@0.7.0:6")[3]["threads"] == 1 and "threads" not in specs.name("shim", "0.7.0", opts | {"threads": 1})


@pytest.mark.parametrize("bad", ("nosave@0.7.0:4:nosave=2", "nosave_shim@0.7.0:4:verify=off", "shim@0.7.0:3:nosave=3",
                                 "shim@0.7.0:3:size=9b", "shim@0.7.0:3:verify=on", "nosuch@0.7.0:3",
                                 "shim@0.7.0:3:threads=0", "nosave@0.7.0:3:threads=4"))
def test_specs_that_would_measure_nothing_are_refused_before_any_run(bad):
    with pytest.raises(SystemExit, match="bad run spec"):
        specs.parse(bad)


def test_plan_keeps_each_sizes_pair_in_one_call_within_the_budget_and_leaves_out_what_the_host_cannot_hold():
    calls, skipped = sweep.plan(["full", "1.5b", "2.1b", "2.6b"], 560, shim_steps=4, nosave=3, sync_steps=4)
    assert [size for size, _ in skipped] == ["2.6b"] and "host" in skipped[0][1]
    assert all(call["s"] <= 560 for call in calls) and len(calls) == 3
    parsed = [[specs.parse(spec.rsplit(":limit=", 1)[0] + ":limit=1") for spec, _ in call["runs"]] for call in calls]
    for call in parsed:  # one size per call: its shim run and its synchronous one
        assert len({opts.get("size") or "full" for *_, opts in call}) == 1
        assert {mode for mode, *_ in call} >= {"shim", "sync_save"}
    assert [(m, n, o["nosave"], o.get("verify")) for m, _, n, o in parsed[0]] == [
        ("shim", 7, 3, "off"), ("sync_save", 4, 0, "off"), ("nosave", 4, 0, None)]
    by_mode, _ = sweep.plan(["full", "1.5b", "2.1b"], 560, 4, 3, 3, group="mode")
    assert len(by_mode) <= len(calls) and all(call["s"] <= 560 for call in by_mode)


def test_kv_of_a_size_not_measured_is_the_measured_free_memory_less_the_extra_weights():
    assert _free_gib([], "full", 1) == (None, None)
    assert _free_gib([("full", 133.76)], "full", 1) == (133.76, "measured")
    free, how = _free_gib([("full", 133.76)], "2.1b", 1)
    assert free == pytest.approx(133.76 - 2 * (params_of("2.1b") - params_of("full")) / 2**30) and "full" in how


def _run(name, mode, call, boot, step_s, checkpointing=True, shim=True):
    return {"name": name, "mode": mode, "shim": shim, "checkpointing": checkpointing, "size": "full", "ranks": 1,
            "val_period": 0, "meta": {"call": call, "boot": boot}, "steps": [
                {"step": 1, "step_s": 9.0}, {"step": 2, "step_s": step_s}, {"step": 3, "step_s": step_s}]}


def test_ratios_pair_one_call_or_with_by_machine_one_machine_and_boot():
    from bench.e2e import report

    runs = [_run("shim@0.7.0", "shim", "a", "m1", 6.0), _run("nosave_shim@0.7.0", "nosave_shim", "a", "m1", 4.0, False),
            _run("sync_save@0.7.0", "sync_save", "b", "m1", 24.0, shim=False)]
    rows, _ = report.table(runs)
    assert (rows[0]["vs_nosave"], rows[0]["vs_sync"]) == (1.5, None)  # the sync row is of another call
    rows, _ = report.table(runs, "machine")
    assert (rows[0]["vs_nosave"], rows[0]["vs_sync"]) == (1.5, 0.25) and rows[2]["vs_nosave"] is None
    runs[2]["meta"]["boot"] = "m2"  # another machine: no pair
    assert report.table(runs, "machine")[0][0]["vs_sync"] is None
    assert compare.offloads(runs[0])["first_s"] is None  # no offload parts recorded: nothing made up
