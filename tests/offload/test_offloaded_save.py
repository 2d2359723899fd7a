"""Issue 32 item 5a: a checkpoint saved while the optimizer state is in colo-shim's page-locked mirrors.

Real NVRx 0.4.1-0.7.0 with its persistent spawned worker, real megatron-core's distributed optimizer
offloaded through the mirrors (tests/nvrx_scenarios/offloaded_save.py says how). Every NVRx version
hands its request to the worker through a torch.multiprocessing queue, and pickling a host tensor
there moves its storage into shared memory in place; NVRx < 0.7 sends a host tensor that covers its
whole storage as it is (0.6.0 only as a copy, which the `nvrx` family makes; 0.7.0 copies it itself).
The mirror must keep its own page-locked pages, the checkpoint must equal the state, and the next
offload / restore round must reuse those pages bit for bit.
"""

import pytest

from nvrx_scenarios import runner

SCRIPT = runner.os.path.join(runner.HERE, "offloaded_save.py")


# megatron-core 0.19.2 refuses NVRx < 0.6.0 (0.4.1 has no __version__ for it to read)
@pytest.mark.parametrize("nvrx,mcore", (("0.4.1", "0.16.1"), ("0.5.0", "0.16.1"), ("0.6.0", "0.19.2"),
                                        ("0.7.0", "0.19.2")))
def test_a_save_while_offloaded_leaves_the_mirrors_on_their_page_locked_pages(nvrx, mcore):
    r = runner.run("saved_while_offloaded", {}, nvrx=nvrx, mcore=mcore, doubles="v0_7", script=SCRIPT,
                   timeout=240).result
    assert r["mirrors"] == r["slots"] == r["locked_at_offload"] > 0, r
    assert r["whole_storage"] > 0, r  # tensors NVRx < 0.7 would have sent live: the case is exercised
    assert r["finalized"] == 1 and r["checkpoint_equal"] and r["state_unchanged"], r
    assert r["moved"] == 0 and r["shared_after_save"] == 0, r  # still the mirrors' own pages ...
    assert r["locked_after_save"] == r["slots"], r  # ... and those are still the page-locked ones
    assert r["restored_equal"] and r["round_offload_equal"] and r["round_restore_equal"], r
    assert r["round_same_pages"] and r["round_locked"] == r["slots"], r  # the next offload reused them
    assert r["reused"] == r["slots"] and r["replaced"] == 0 and r["fallbacks"] == 0, r
    assert r["registrations_held"] == r["mirrors"], r  # no registration orphaned
