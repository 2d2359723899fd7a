"""One rank of test_node_budget.py: a spawned process started as NeMo-RL's and Ray's workers are.

Only RANK / WORLD_SIZE / LOCAL_RANK name the rank (no LOCAL_WORLD_SIZE, no launcher's count), and
the family `offload` is installed around the v0.7 worker double's `move_optimizer`, whose body is
NeMo-RL's (tests/doubles/nemo_rl_common). Its Adam state (two 1.5 MiB tensors and a step) sits on
the device of harness/fake_cuda.py, so an offload really moves it, through colo-shim's mirrors or,
refused, through the original body; the page-locking recorder stands in for the CUDA runtime.
The machine's MemAvailable is the one thing set per rank (`mem`): the tests give ranks readings
taken "at different moments" and a node small enough for the budget to matter.
The parent sends commands on `commands` and reads one answer per command on `answers`.
"""

import logging
import logging.handlers
import os
import sys

LAUNCHER = ("LOCAL_WORLD_SIZE", "AVAILABLE_ADDR_LIST", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
            "SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_JOB_ID",
            "TORCHELASTIC_RUN_ID", "RAY_JOB_ID", "CUDA_VISIBLE_DEVICES")
NUMEL = 384 << 10  # float32: 1.5 MiB per Adam moment, 3 MiB (plus a page for `step`) per rank


def rank(rank, world, mem, env, paths, commands, answers):
    for key in [k for k in os.environ if k.startswith("COLO_SHIM") or k in LAUNCHER]:
        del os.environ[key]
    os.environ.update(env, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    sys.path[:0] = paths
    import torch

    import colo_shim
    from colo_shim.core import node
    from colo_shim.offload import mirrors, pages
    from harness.fake_cuda import FakeCuda, PageLocks, on_device

    node.mem_available = lambda: mem  # this rank's reading of /proc/meminfo
    colo_shim.install(["offload"])
    pages.host = PageLocks()
    warnings = logging.handlers.BufferingHandler(1000)
    logging.getLogger("colo_shim").addHandler(warnings)
    from nemo_rl.models.policy.workers.megatron_policy_worker import MegatronPolicyWorkerImpl

    param = torch.nn.Parameter(torch.zeros(NUMEL))
    adam = torch.optim.Adam([param])
    param.grad = torch.full_like(param, 0.5 + rank)
    adam.step()
    worker = MegatronPolicyWorkerImpl({"model": torch.nn.Identity(), "optimizer": adam}, None,
                                      worker_sharding_annotations=None)
    with FakeCuda():  # on a GPU the state lives on the device from the start
        worker.move_optimizer("cuda")
        while True:
            command = commands.get()
            if command == "leave":
                break
            tensors = list(adam.state[param].values())
            before = [t.clone() for t in tensors]
            worker.move_optimizer("cpu" if command == "offload" else "cuda")
            after = list(adam.state[param].values())
            report = mirrors.report()
            answers.put({"rank": rank, "pid": os.getpid(), "held": mirrors.held(), "report": report,
                         "mirrored": sum(id(t.untyped_storage()) in mirrors._mirrors for t in after),
                         "equal": all(torch.equal(a, b) for a, b in zip(before, after)),
                         "on_device": [on_device(t) for t in after], "locked": sum(pages.host.locked.values()),
                         "warnings": [r.getMessage() for r in warnings.buffer if r.levelno >= logging.WARNING]})
    answers.put({"rank": rank, "left": True})
