"""The engine stays discarded until a weight update, whatever finishes follow (issue 8 item 4).

vLLM ignores a sleep while the engine sleeps, so a second finish after a level-2 one changes
nothing in the engine: it must change nothing in colo-shim's view of it either. A sleep request
from a finish that failed must not reach a later sleep. Driven on the engine double (v0.7 layout,
vLLM 0.20: level 2 leaves NaN); tokens are compared with a run that kept at level 1 throughout.
"""

from __future__ import annotations

import pytest

from harness.vllm_runs import dist_info, run_script

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def checks(tmp_path_factory):
    return run_script("vllm_state_checks.py", "v0_7", dist_info(str(tmp_path_factory.mktemp("v")), "0.20.0"))


def test_plain_finish_after_discard_still_guards(checks):
    r = checks["plain_finish_after_discard"]["before_refit"]
    assert r["levels"] == [1, 2]  # the plain finish's sleep did nothing in the engine
    assert r["wake_error"] is not None and r["wake_error"]["type"] == "ColoShimDiscardError"
    assert "check_plain_finish_after_discard" in r["wake_error"]["message"]  # names the discarding finish
    assert r["generate_error"]["type"] == "ColoShimDiscardError"
    assert r["nan_generations"] == 0 and r["discarded_now"] is True
    after = checks["plain_finish_after_discard"]["after_refit"]
    assert after["output"] == checks["reference"]["output"] and after["nan_generations"] == 0
    assert after["discarded_now"] is False


def test_second_discard_while_asleep_keeps_the_first_copy(checks):
    r = checks["second_discard_while_asleep"]
    assert r["output"] == checks["reference"]["output"]  # the layer scales were not re-copied as NaN
    assert r["nan_generations"] == 0
    assert r["engine_sleeps"] == {"level1": 1, "level2": 1}
    assert r["reasons"]["engine already asleep: vLLM ignores this sleep"] == 1


def test_failed_finish_request_does_not_reach_the_next_sleep(checks):
    r = checks["failed_finish_request_does_not_leak"]
    assert r["failed_finish_returned"] is False  # upstream swallowed the worker's error
    assert r["levels"] == [1, 1]  # the keep finish kept
    assert r["wake_error"] is None and r["nan_generations"] == 0
    assert r["output"] == checks["reference"]["output"]


def test_stale_request_expires_at_the_engines_next_call(checks):
    assert checks["stale_request_expires_in_engine"] == {"generate": [1, 1], "wake_weights": [1, 1]}
