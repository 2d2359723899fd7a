"""Issue 16 item 1: no checkpoint may hold the next step's weights, whatever closed its writer.

NVRx drains a pending write before its /dev/shm buffers are reused only through the callback that
AsyncCallsQueue.__init__ installs in cpu_shm_mode, and close() (0.6.0 and 0.7.0) removes it; the
shim puts it back (colo_shim/checkpoint/shm_drain.py). Real NVRx, real spawned worker, CPU tensors,
the job's own shm path (megatron --async-ckpt-use-cpu-shm). Per way of closing: a save, the close, a
save on the new worker, then saves 2 and 3 back to back with the write of 2 held open by a gate;
checkpoint 2 must read back step 2's values (before the fix it read step 3's after every close). The
drain is observed, not timed: it opens the gate, then must wait.
"""

from nvrx_scenarios import runner

SCRIPT = runner.os.path.join(runner.HERE, "shm_drain.py")
# inplace_drop first: it keeps the drain even before the fix
CLOSERS = ["inplace_drop", "close", "abort", "nemo_rl_refit", "restart_release", "dead_worker"]


def _rounds(closers, nvrx):
    result = runner.run("reuse_after_close", {"closers": closers}, nvrx=nvrx, script=SCRIPT, timeout=400).result
    return result, {r["closer"]: r for r in result["rounds"]}


def test_shm_queue_never_writes_the_next_step_into_a_pending_checkpoint_after_any_close():
    result, rounds = _rounds(CLOSERS, "0.7.0")
    assert list(rounds) == CLOSERS
    for how, r in rounds.items():
        assert r["a_equal"] and r["b_equal"] and r["s3_equal"], r
        assert r["drain_installed_after_restart"], r
        assert r["drain_called"], r  # save 3 reused save 2's buffers and drained first
        assert r["s2_equal"], f"checkpoint 2 holds step 3's values after {how}: {r}"
    assert rounds["restart_release"]["released"] == ["restart"] and rounds["restart_release"]["rewarmed"] == 1
    assert rounds["inplace_drop"]["released"] == ["inplace"]
    assert result["slot_is_shim_drain"]
    assert result["report"]["drain_installs"] >= 1 and result["report"]["drained"] >= 1, result["report"]


def test_nvrx_060_gets_its_drain_back_after_a_restart():
    """0.6.0 copies only GPU tensors into shm, so on this CPU machine no buffer is reused; what is
    checked is that the drain is installed again on the restarted worker (before the fix it stayed
    removed)."""
    _, rounds = _rounds(["close", "restart_release"], "0.6.0")
    for how, r in rounds.items():
        assert r["drain_installed_after_restart"], (how, r)
        assert r["s2_equal"] and r["s3_equal"], (how, r)
