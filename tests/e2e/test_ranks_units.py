"""The pure parts of the e2e harness's ranks (issue 25): run specs with `ranks=N`, how the ranks'
reports become one step record, and the checkpoint check of every rank against one checkpoint."""

import pytest

from bench.e2e import ranks, report, specs


def test_spec_ranks_default_one_and_combines_with_other_options():
    mode, nvrx, steps, opts = specs.parse("main3322_shim@0.7.0:3:order=before:ranks=2")
    assert (mode, nvrx, steps, opts["ranks"], opts["order"]) == ("main3322_shim", "0.7.0", 3, 2, "before")
    assert specs.name(mode, nvrx, opts) == "main3322_shim@0.7.0 order=before ranks=2"
    _, _, _, one = specs.parse("shim@0.7.0:3")
    assert one["ranks"] == 1 and specs.name("shim", "0.7.0", one) == "shim@0.7.0"  # names as before
    assert specs.name("shim", "0.7.0", specs.parse("shim@0.7.0:3:ranks=1")[3]) == "shim@0.7.0"


@pytest.mark.parametrize("bad", ("shim@0.7.0:3:ranks=0", "shim@0.7.0:3:ranks=two", "shim@0.7.0:3:rank=2"))
def test_spec_rejects_bad_ranks(bad):
    with pytest.raises(SystemExit, match="ranks=N"):
        specs.parse(bad)


def test_saves_merge_to_the_slowest_rank_with_each_ranks_fingerprints():
    saved = [{"path": "p", "async": True, "schedule_s": 0.2, "finalize_prev_s": 1.0, "fingerprints": {"a": (1, 1)}},
             {"path": "p", "async": True, "schedule_s": 0.5, "finalize_prev_s": 0.1, "fingerprints": {"a": (2, 4)}}]
    merged = ranks.merge_saves(saved)
    assert (merged["schedule_s"], merged["finalize_prev_s"]) == (0.5, 1.0)
    assert merged["fingerprints"] == [{"a": (1, 1)}, {"a": (2, 4)}]
    assert ranks.merge_saves(saved[0])["fingerprints"] == [{"a": (1, 1)}]  # one rank: a dict


def _snap(fence, fin, nested, parts):
    return {"fence": {"fence_s": fence}, "finalize_in_offload_s": fin, "fence_in_finalize_s": nested,
            "offload_parts": parts}


def test_offload_waits_per_rank_and_the_slowest_part():
    base = [_snap(1.0, 0.0, 0.0, {"before.fence": 1.0}), _snap(0.0, 0.0, 0.0, {})]
    now = [_snap(1.5, 2.0, 0.25, {"before.fence": 1.25}), _snap(0.0, 3.0, 0.0, {"before.fence": 3.0})]
    assert [ranks.offload_wait(p, b) for p, b in zip(now, base)] == [2.25, 3.0]
    assert ranks.offload_parts(now, base) == {"before.fence": 3.0}


def test_refit_check_per_worker_and_tensor_parallel_parts():
    sent = [{"digests": {"w": [3.0, 5.0]}}, {"digests": {"w": [3.0, 5.0]}}]
    ok = {"digests": {"w": [3.0, 5.0]}, "uncovered": []}
    stale = {"digests": {"w": [2.0, 4.0]}, "uncovered": []}
    assert ranks.refit_check(sent, [ok, stale])[0] == [True, False]
    parts = [{"digests": {"w": [1.0, 1.0]}, "uncovered": [], "tp": 2}, {"digests": {"w": [2.0, 4.0]}, "uncovered": [], "tp": 2}]
    equal, worst, uncovered = ranks.refit_check(sent, parts)  # TP shards add up to the full tensor
    assert equal == [True, True] and worst == 0.0 and uncovered == []
    missing = dict(ok, uncovered=["lm_head.weight"])
    assert ranks.refit_check(sent[:1], [missing])[0] == [False]


def test_report_reads_old_records_as_one_rank_and_tables_each_rank():
    old = {"name": "shim@0.7.0", "steps": [{"step": 1, "step_s": 1.0, "held_gib": 0.1, "offloaded_gib": 1.0}]}
    assert report.rows([old])[0]["ranks"] == 1 and ranks.of(old) == 1 and report.per_rank(old) == []
    rows = lambda wait, ck: [{"rank": r, "held_gib": 0.01 * r, "held_pct": 1.0 * r, "ckpt_equal": ck or r == 0,  # noqa: E731
                              "refit_equal": True, "pinned_after_finish_gib": 0.0, "offload_wait_s": wait} for r in (0, 1)]
    two = {"name": "shim@0.7.0 ranks=2", "ranks": 2,
           "steps": [{"step": 1, "per_rank": rows(9.0, True)}, {"step": 2, "per_rank": rows(0.5, False)}]}
    got = report.per_rank(two)
    assert [(r["rank"], r["held_gib"], r["ckpt_equal"], r["offload_wait_s"]) for r in got] == [
        (0, 0.0, "2/2", 0.5), (1, 0.01, "1/2", 0.5)]
    assert "| shim@0.7.0 ranks=2 | 1 | 0.01 | 1.00 | 1/2 | 2/2 | 0.00 | 0.50 |" in report.ranks_markdown([old, two])


def test_compare_ranks_reads_one_checkpoint_for_every_rank(tmp_path):
    import torch
    import torch.distributed.checkpoint as dcp

    from bench.ckpt_compare import compare, compare_ranks

    state = {"model.w": torch.arange(6.0), "optimizer.rank0.m": torch.ones(3), "optimizer.rank1.m": torch.full((3,), 2.0)}
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(tmp_path)), no_dist=True)
    fp = {k: (float(v.sum()), float((v.double() ** 2).sum())) for k, v in state.items()}
    rank0 = {k: fp[k] for k in ("model.w", "optimizer.rank0.m")}
    rank1 = {k: fp[k] for k in ("model.w", "optimizer.rank1.m")}
    res = compare_ranks(str(tmp_path), [rank0, rank1])
    assert res["equal"] and [r["equal"] for r in res["ranks"]] == [True, True] and res["tensors"] == 3
    drifted = dict(rank1, **{"model.w": (14.0, 55.0)})  # rank 1's replica is not what rank 0 wrote
    res = compare_ranks(str(tmp_path), [rank0, drifted])
    assert not res["equal"] and [r["equal"] for r in res["ranks"]] == [True, False]
    assert res["first_mismatch"] == ["model.w"]
    one = compare_ranks(str(tmp_path), [rank0])
    assert "ranks" not in one and {k: v for k, v in one.items() if k != "compare_s"} == {
        k: v for k, v in compare(str(tmp_path), rank0).items() if k != "compare_s"}
