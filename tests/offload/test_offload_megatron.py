"""Family `offload` on real megatron-core 0.16.1 and 0.19.2: a GPTModel in DDP with the distributed
optimizer on the CPU (gloo), every entry point without and with colo-shim in one child
(mcore_child.py, offload_checks.py; harness/fake_cuda.py says how tensors really move on this machine,
mcore_expect.py what each run must show)."""

import pytest

from helpers import deps_dir
from mcore_expect import check_changes_and_fallbacks, check_entry_points, run_child


@pytest.mark.parametrize("mcore", ("0.16.1", "0.19.2"))
def test_entry_points_changed_tensors_and_fallbacks(mcore):
    result = run_child(deps_dir("mcore", mcore))
    check_entry_points(result)
    check_changes_and_fallbacks(result["checks"])
