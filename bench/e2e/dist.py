"""The trainer's ranks (issue 25): how each rank learns its place, joins the process group, and
takes its share of a batch. NeMo-RL starts one Megatron worker per GPU with RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR and MASTER_PORT in its environment; the harness gives its rank processes the
same (`envs`), so the trainer reads them as a NeMo-RL worker would.

Every process group gets a finite timeout (E2E_DIST_TIMEOUT_S; 90 s on CPU, 300 s on GPU): a
collective that one rank enters and another never does (a fence that finalized on one rank only)
must fail the run loudly within the harness's limit, not hang it until the orchestrator kills it.
One rank takes the same path, in a process group of its own.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def world() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def timeout_s(gpu: bool) -> float:
    return float(os.environ.get("E2E_DIST_TIMEOUT_S") or (300 if gpu else 90))


def envs(n: int) -> list:
    """Per-rank environments for n trainer processes on this node (rank i on GPU i)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return [{"RANK": str(i), "WORLD_SIZE": str(n), "LOCAL_RANK": str(i), "LOCAL_WORLD_SIZE": str(n),
             "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)} for i in range(n)]


def init(gpu: bool) -> None:
    """NCCL on GPU i = LOCAL_RANK, gloo on CPU (where NVRx's and megatron's collectives build their
    tensors on torch.cuda.current_device(): it answers "cpu", only the device changes)."""
    import torch.distributed as dist

    if world() == 1:  # a lone trainer process: no launcher gave it a rank environment
        for key, value in envs(1)[0].items():
            os.environ.setdefault(key, value)
    timeout = timedelta(seconds=timeout_s(gpu))
    if gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl", rank=rank(), world_size=world(), timeout=timeout)
        dist.all_reduce(torch.ones(1, device="cuda"))  # NCCL's buffers belong to the baseline
        torch.cuda.synchronize()
    else:
        dist.init_process_group("gloo", rank=rank(), world_size=world(), timeout=timeout)
        torch.cuda.current_device = lambda: torch.device("cpu")


def share(n: int) -> slice:
    """This rank's contiguous rows of a batch of n: every rank gets the whole batch from the driver
    (run_all_workers_single_data), works on its share, and the driver concatenates in rank order."""
    r, w = rank(), world()
    base, extra = divmod(n, w)
    lo = r * base + min(r, extra)
    return slice(lo, lo + base + (1 if r < extra else 0))


def average_grads(buffers) -> None:
    """The CPU path's data-parallel gradient sync: megatron DDP's finish_grad_sync needs CUDA
    streams, so the grad buffers are averaged over the data-parallel group with gloo directly."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    group = parallel_state.get_data_parallel_group()
    for buf in buffers:
        dist.all_reduce(buf.grad_data, group=group)
        buf.grad_data.div_(dist.get_world_size(group))
