"""The e2e orchestrator ends each run's session without leaving its queues' semaphores in /dev/shm.

A driver exits with os._exit while what it started may still live (its verifier, the actors, NVRx's
writer) and so does multiprocessing's resource tracker, the one process that unlinks the named
semaphores of queues whose owner died. Killing the whole session took the tracker too: two of five
clean-clone test runs kept 6 sem.mp-* (a driver's two verifier queues) in /dev/shm, whenever a
verifier had not exited yet when its run was ended.
"""

import os

from bench.e2e import run
from colo_shim.cli import groups
from helpers import left_semaphores, semaphore_owner


def test_ending_a_run_spares_the_resource_tracker_so_no_semaphore_stays(tmp_path):
    # a "driver" gone, a child holding a queue and the tracker alive
    with semaphore_owner(tmp_path) as (proc, names):
        assert len(names) == 3 and all(os.path.exists(f"/dev/shm/sem.{n}") for n in names), names
        run.end_run(proc)
        assert left_semaphores(names) == []
        assert groups._group(proc.pid) == []  # and nothing of the run is left running
