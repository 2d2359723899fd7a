"""NeMo-RL main's background checkpoint wait must not occupy the policy actor (issue 33, seen on an H100).

Main's own GRPO on the GPU showed what the in-process doubles had hidden: main's policy workers are
plain Ray actors (one call at a time), and the checkpointer thread's `Policy.finalize_async_save`
reaches the actor right after the save, so the next refit's offload waited for the whole write
(14.5 s of a 25 s step). Here the same shape runs for real: a local Ray cluster, the main doubles'
`Policy` over a real `MegatronPolicyWorker` actor, real NVRx 0.6.0 (main's pin) with its spawned worker.
Each write is held until the scenario opens its gate after the offloads and the next training step;
a blocking finalize that begins in the actor while the write is still held is counted and lets the
write through (tests/nvrx_scenarios/main_actor.py), so the old behaviour fails an assertion instead
of hanging. All cases share one process and one Ray cluster.
"""

import pytest

from nvrx_scenarios import runner

SCRIPT = runner.os.path.join(runner.HERE, "main_actor.py")
CASES = {
    "shim": ("main_actor", {"shim": True, "steps": 2}),
    "no_shim": ("main_actor", {"shim": False, "steps": 1}),
    "actor_without_shim": ("main_actor", {"shim": True, "actor_shim": False, "steps": 1}),
    "probe_raises": ("main_actor", {"shim": True, "inject": "probe", "steps": 1}),
    "sends": ("sends_atomic", {}),
}


@pytest.fixture(scope="module")
def cases():
    return runner.run_cases(CASES, nvrx="0.6.0", doubles="main", script=SCRIPT, timeout=600)


def _checkpoints_whole(result):
    """Every step's checkpoint, read back after main's own finalize and rename, holds that step's save."""
    assert [r["latest"] for r in result["steps"]] == [f"step_{i + 1}" for i in range(len(result["steps"]))], result
    assert all(r["equal"] for r in result["steps"]), result


def test_offloads_run_while_the_write_is_held(cases):
    """With colo-shim: the actor never waits for a held write, the offloads ran before it finished,
    the driver asked first at every save, and main's own finalize still ran once per save."""
    result = cases.result("shim")
    for row in result["steps"]:
        assert row["waited_gated"] == 0 and not row["gate_open_after_offloads"], result
        assert row["pending_after_offloads"] == 1, result  # the save was still writing after both offloads
    _checkpoints_whole(result)
    driver = result["driver"]
    assert driver["asked"] == 2 and driver["written_first"] == 2 and driver["could_not_tell"] == 0, driver
    assert driver["polls"] >= 4, driver  # at least one "still writing" and one "written" per save
    assert result["actor"]["events"].count("finalize_async_save") == 2, result  # main's waiting call, per save
    assert result["actor"]["writer_alive"], result  # kept warm


def test_main_as_is_waits_in_the_actor(cases):
    """Without colo-shim, main's background finalize occupies the actor until the write is done: the
    fact the fix rests on (the doubles used to call the worker directly, which hid it)."""
    result = cases.result("no_shim")
    assert result["steps"][0]["waited_gated"] == 1 and result["steps"][0]["gate_open_after_offloads"], result
    _checkpoints_whole(result)


def test_actor_without_colo_shim_falls_back_to_main(cases):
    """The driver cannot get an answer it trusts: it stops asking and main's wait runs as it is."""
    result = cases.result("actor_without_shim")
    assert result["driver"]["could_not_tell"] == 1 and result["driver"]["written_first"] == 0, result
    assert result["steps"][0]["waited_gated"] == 1, result
    _checkpoints_whole(result)


def test_a_failing_answer_never_reaches_the_job(cases):
    """The actor's answer raises: contained in the driver (one warning), main's wait runs, the job goes on.

    Main's wait is the checkpointer thread's call, sent after the failed answer's round trip; the main thread's
    offloads go to the same one-call-at-a-time actor meanwhile, so the wait lands before or after them (both seen,
    the second on a loaded CI machine) and may or may not find the write still held. What must hold either way: it
    reached the actor once, as main's own `finalize_async_save` (the actor's offloads, colo-shim on, finalize no
    write themselves), and the checkpoint it finalized is whole."""
    result = cases.result("probe_raises")
    assert result["actor"]["events"].count("finalize_async_save") == 1, result
    assert result["driver"]["written_first"] == 0 and result["driver"]["could_not_tell"] == 0, result
    _checkpoints_whole(result)
    assert "ask the policy workers whether the write is done failed" in cases.stderr("probe_raises")


def test_sends_to_all_workers_do_not_interleave(cases):
    """While one thread sends a call to every worker, another thread's send waits: every worker sees
    the two threads' calls in one order (a deferred finalize's collectives meet on every rank)."""
    result = cases.result("sends")
    assert result["b_waiting"] == 1 and not result["b_finished_early"], result
    assert result["log"] == ["a0", "a1"], result
    assert result["log_after"] == ["a0", "a1", "b0", "b1"], result
