"""Two real gloo ranks saving one checkpoint together, each with its own NVRx worker, and rank 1's
worker killed while its part of the save is being written: `python ranks.py one_dies '{...}'`.

A job's finalize is collective (NVRx all-reduces whether every rank's write is done, then gathers
the write results to the coordinator, which writes `.metadata`). colo-shim on the rank whose worker
died drops the lost save and raises in the blocking finalize, so that rank never enters the
collective its peer waits in. What must hold: both ranks end (the dead worker's rank with
CheckpointWorkerDied, its peer with the process group's own error once that rank is gone, or at
the group's timeout at the latest), and the checkpoint both were writing is not marked complete.
The parent never waits for a rank that ended without answering.
"""

import datetime
import os

import entry  # tests/nvrx_scenarios, on the runner's PYTHONPATH
import fault_io
import faults
import scenario


def one_dies(opts):
    os.makedirs(opts["root"], exist_ok=True)
    ranks, exitcodes = scenario.spawn_ranks(_rank, opts["root"], opts)
    return {"ranks": ranks, "exitcodes": exitcodes}


def _rank(rank, root, opts, results):
    os.environ.update(RANK=str(rank))
    import torch.distributed as dist

    import colo_shim

    colo_shim.install(["nvrx", "megatron"])
    from colo_shim.cli import saver as cs

    scenario.cpu_collectives()
    dist.init_process_group("gloo", init_method=f"file://{root}/store", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=opts.get("pg_timeout_s", 120)))
    job = faults.Job(cs, os.path.join(root, "ckpt"))
    live = {f"r{rank}.{k}": v for k, v in faults._state(rank).items()}
    before = faults._row()
    job.warm(live)
    if rank == 1:  # its part of s0 waits before writing; the worker is killed there, as the OOM killer would
        job.save("s0", live, fault_io.held_write, started=job.path("started"), gate=job.path("gate"), written=False)
        faults._wait_for(job.path("started"))
        faults._dead(job.kill())
    else:
        job.save("s0", live)
    job.finalize(blocking=True, no_dist=False)  # the job's finalize: collective
    # read without close(): close() would finalize what is left, collectively, on a group short of a rank
    after = faults._row()
    marked = {name: os.path.exists(os.path.join(job.path(name), ".metadata"))
              for name in sorted(os.listdir(job.root)) if os.path.isdir(job.path(name))}
    results.put({"rank": rank, "saw": job.saw[job.warmed:], "warm": job.saw[:job.warmed], "marked_complete": marked,
                 "status": {k: after[k] - before.get(k, 0) for k in ("worker_deaths", "saves_lost")}})
    results.close()
    results.join_thread()
    os._exit(0)  # a rank whose finalize failed ends, as a job's would: no teardown collective


if __name__ == "__main__":
    entry.main({"one_dies": one_dies})
