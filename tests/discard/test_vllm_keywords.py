"""colo-shim's wrappers hand every keyword they do not own to upstream (issue 8 item 8, keyword part).

Driven on NeMo-RL main's layout: `finish_generation(release_gpu=...)` (PR #2884), vLLM's
`sleep(level, mode=...)` (0.17+), extra keywords through prepare_for_generation, generate and
collective_rpc. Only `refit_pending`, colo-shim's own keyword, stops at the shim.
"""

from __future__ import annotations

import pytest

from harness.vllm_runs import dist_info, run_script

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def seen(tmp_path_factory):
    return run_script("vllm_keyword_checks.py", "main", dist_info(str(tmp_path_factory.mktemp("v")), "0.25.1"))


def test_recorders_sit_under_the_shim(seen):
    assert seen["wrapped_by_shim"] == ["finish_generation", "prepare_for_generation", "update_weights_via_ipc_zmq"]


def test_finish_generation_passes_release_gpu(seen):
    assert seen["finish_release_gpu"] == [["release_gpu"]]
    assert seen["finish_refit_pending"] == [["release_gpu"]]  # refit_pending is consumed by colo-shim


def test_prepare_for_generation_passes_extra_keywords(seen):
    assert seen["prepare"] == [["colo_test_extra", "tags"], ["colo_test_extra", "tags"]]


def test_engine_methods_pass_keywords(seen):
    assert seen["engine"] == {"sleep": [["level", "mode"]], "wake_up": [["tags"]],
                              "generate": [["sampling_params", "use_tqdm"]],
                              "collective_rpc": [["args", "kwargs", "timeout"]]}
