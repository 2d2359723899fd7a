"""NeMo-RL main's own finalize_async_save stays async with colo-shim's default release (issue 22),
and COLO_SHIM_NVRX_RELEASE=stage, retired, runs exactly as that default.

Real NVRx 0.7.0, real spawned worker, the main doubles of the Megatron policy worker (main's
finalize_async_save / save_checkpoint / _requires_nvrx_cuda_cache_release) and of the checkpointer
(begin_finalization's background rename and pruning). Each save's write is gated: it cannot finish
until the scenario opens the gate, which it does after both refit offloads returned and training
changed the tensors. Code that waits for the write inside an offload is recorded and lets it
through (so old code fails on an assertion, never by hanging). The cases with the default
settings share one process (tests/nvrx_scenarios/entry.py), each with its own worker and queue;
a case with other settings has its own.
"""

import pytest

from nvrx_scenarios import runner

MAIN = runner.os.path.join(runner.HERE, "main_async.py")
STAGE = {"COLO_SHIM_NVRX_RELEASE": "stage"}
DEFAULT = {  # the cases that inject a fault last
    "impl": {"ray_class": False, "cuda": True},
    "ray_actor_class": {"ray_class": True, "cuda": True},
    "inject-fence": {"cuda": True, "inject": "fence"},
    "inject-bookkeeping": {"cuda": True, "inject": "bookkeeping"},
}


def _outcome(opts, env=None):
    return runner.run("main_refit", {"steps": 3, **opts}, nvrx="0.7.0", doubles="main", script=MAIN,
                      timeout=180, env=env)


def _run(opts, env=None):
    return _outcome(opts, env).result


@pytest.fixture(scope="module")
def default_cases():
    cases = {key: ("main_refit", {"steps": 3, **opts}) for key, opts in DEFAULT.items()}
    return runner.run_cases(cases, nvrx="0.7.0", doubles="main", script=MAIN, timeout=600)


def _bookkeeping(result):
    """Each step's checkpoint, read back after the job's own finalize, holds that step's values;
    main renamed it to the latest step_N and pruned the older ones (keep_top_k=1)."""
    assert [r["latest"] for r in result["steps"]] == ["step_1", "step_2", "step_3"], result
    assert all(r["equal"] for r in result["steps"]), result
    assert result["dirs"] == ["step_3"], result


def _stayed_async(result):
    steps = result["steps"]
    for row in steps:  # the gate was still shut when both offloads returned: nobody waited
        assert row["offload_waited"] is False and row["gate_open_after_offload"] is False, row
        assert row["pending_after_offload"] == 1, row
    assert result["status"] == {"MegatronPolicyWorkerImpl.finalize_async_save": "applied"}
    _bookkeeping(result)
    pids = {r["pid_before"] for r in steps} | {r["pid_after"] for r in steps}
    assert len(pids) == 1 and None not in pids, steps  # one writer for the whole run, never closed
    assert result["cache_flag"] is True  # main's flag kept: without the shim main would still release
    assert result["stats"] == {"offload_skipped": 6, "release_kept": 3, "unchanged": 0}


def _default_result(result):
    _stayed_async(result)
    assert all(row["fence_released"] for row in result["steps"]), result["steps"]


@pytest.mark.parametrize("cls", ("impl", "ray_actor_class"))
def test_default_offload_returns_with_a_cuda_write_held_and_keeps_the_worker(default_cases, cls):
    """ray_actor_class: the class a Ray actor runs, whose methods `@ray.remote` captured, so the
    offload's `self.finalize_async_save()` goes through Ray's method wrapper to the patch."""
    _default_result(default_cases.result(cls))


def test_retired_stage_runs_as_the_default_and_says_so_once():
    """A job config that still names stage: the same result as the default run above, and one
    deprecation line for the whole process; under COLO_SHIM_STRICT=1 too (a valid value, not an error)."""
    outcome = _outcome({"cuda": True}, {**STAGE, "COLO_SHIM_STRICT": "1"})
    _default_result(outcome.result)
    assert outcome.stderr.count("COLO_SHIM_NVRX_RELEASE=stage is deprecated") == 1, outcome.stderr[-3000:]
    line = next(x for x in outcome.stderr.splitlines() if "COLO_SHIM_NVRX_RELEASE=stage is deprecated" in x)
    assert "runs as inplace" in line, line


@pytest.mark.parametrize("release", ("restart", "none"))
def test_main_code_runs_unchanged_without_a_releasing_strategy(release):
    result = _run({"cuda": True}, {"COLO_SHIM_NVRX_RELEASE": release})
    for row in result["steps"]:  # main's blocking finalize waited, closed the writer, dropped the caches
        assert row["offload_waited"] is True and row["pending_after_offload"] == 0, row
        assert row["pid_after"] is None, row
    _bookkeeping(result)
    assert result["stats"]["unchanged"] >= 3, result["stats"]


@pytest.mark.parametrize("where", ("fence", "bookkeeping"))
def test_a_colo_shim_fault_in_mains_offload_runs_mains_own_steps_and_never_escapes(default_cases, where):
    """Issue 32 item 3: colo-shim's part of main's offload raises (the fence, or the live-queue
    bookkeeping read after it). Main's own blocking finalize, close and cache cleanup then run in
    their place, as without colo-shim, the offload itself never sees the error, and status says so.
    Before the fix the fence's error skipped main's steps, and the bookkeeping's escaped the offload."""
    result = default_cases.result(f"inject-{where}")
    for row in result["steps"]:  # main's own finalize waited, closed the writer, dropped the caches
        assert row["offload_waited"] is True and row["pending_after_offload"] == 0, row
        assert row["pid_after"] is None, row
    _bookkeeping(result)
    assert result["stats"]["offload_skipped"] == 0, result["stats"]
    errors = dict(result["shim_errors"])
    assert errors.pop("megatron: NeMo-RL offload fence") == 6, result["shim_errors"]  # 2 offloads x 3 steps
    # the same broken fence before main's move_model / move_optimizer: contained there too
    assert errors and all(what.startswith("megatron: fence before nemo_rl") for what in errors), errors
