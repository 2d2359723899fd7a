"""Issue 8 item 8: NeMo-RL main's checkpointer finalizes async saves from a background thread
(nemo_rl/utils/checkpoint.py) while an offload may run the shim's fence in the same process.

Real NVRx 0.7.0, real worker. The host thread's finalize of save 0 is held inside its finalize
function while the fence runs; each save must be finalized exactly once, in order, by the thread.
The fence (issue 22) releases the writer through its side door and finalizes nothing, so it can
neither take save 0 from under the thread nor finalize save 1 around it.
"""

from nvrx_scenarios import runner

HOST = runner.os.path.join(runner.HERE, "host_only.py")


def test_fence_and_background_finalizer_never_finalize_twice_or_out_of_order():
    result = runner.run("finalize_race", {}, nvrx="0.7.0", script=HOST, timeout=150).result
    assert result["all"].count("f0 end") == 1 and result["all"].count("f1") == 1, result
    assert result["all"].index("f0 end") < result["all"].index("f1"), result
    assert result["fence_finalized"] == 0 and result["fence_released"] == ["inplace"], result
    assert sum(len(done) for done in result["host_finalized"]) == 2, result
