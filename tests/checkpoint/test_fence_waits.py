"""Issue 8 item 7: a slow, healthy checkpoint write does not crash the job.

Where the fence still waits for a write (issue 22: a writer whose side door is not open, here by
a changed door token), it waits as upstream's blocking finalize does and warns every COLO_SHIM_FENCE_WARN_EVERY
seconds (60) with the rank, the queue and the bytes in flight. Time is a clock the scenario drives
(each poll advances it), so the number and text of the warnings are exact, not timing-dependent.
"""

from nvrx_scenarios import runner

HOST = runner.os.path.join(runner.HERE, "host_only.py")


def test_slow_write_past_old_600s_default_waits_and_warns_each_minute():
    # 11 polls of 61 s: the write is let through at 671 s, past the old 600 s default that raised
    result = runner.run("fake_clock_wait", {"step": 61, "open_after": 11}, nvrx="0.7.0", script=HOST,
                        timeout=150).result
    assert result["raised"] is None, result
    assert result["clock_at_end"] == 671
    assert result["report"]["calls_finalized"] == 0 and result["report"]["released"] == ["queued"]
    warnings = result["warnings"]
    assert len(warnings) == 11, warnings  # one per elapsed minute, none once the write finished
    assert "after 61s" in warnings[0] and "after 671s" in warnings[-1]
    for text in warnings:
        assert "rank 0" in text and "AsyncCallsQueue" in text and "1 pending" in text
        assert "6144 bytes in flight" in text  # the three float32 tensors of the save
    assert result["equal"] is True


def test_warning_interval_is_configurable():
    result = runner.run("fake_clock_wait", {"step": 10, "open_after": 7}, nvrx="0.7.0", script=HOST, timeout=150,
                        env={"COLO_SHIM_FENCE_WARN_EVERY": "20"}).result
    assert [w.split(" still waiting after ")[1].split("s ")[0] for w in result["warnings"]] == ["20", "40", "60"]


def test_timeout_stays_available_as_opt_in():
    result = runner.run("fake_clock_wait", {"step": 61, "open_after": 11}, nvrx="0.7.0", script=HOST, timeout=150,
                        env={"COLO_SHIM_FENCE_TIMEOUT": "200"}).result
    assert result["raised"] == "FenceTimeout"
    assert "rank 0" in result["message"] and "COLO_SHIM_FENCE_TIMEOUT" in result["message"]
    assert result["clock_at_end"] == 244  # raised at the first poll past 200 s
    assert result["equal"] is True  # the job's own finalize still completes the save afterwards
