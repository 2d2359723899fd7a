"""What this node offers every fix: how many ranks share it, and how much host memory is free.

The offload family's host budget is node-wide and kept in the node's ledger (ledger.py); where no
ledger can be made, each process divides the node's budget by the ranks on the node. Launchers name
that count in different variables, and NeMo-RL's Ray workers in none of the usual ones, so each
launcher is read the way it sets it; without one, the node's GPUs bound it (a rank per GPU).
"""

from __future__ import annotations

import ast
import os


def mem_available() -> int | None:
    """Bytes the kernel says can be allocated without swapping (/proc/meminfo), None off Linux."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _slurm_list(value: str, node: str | None) -> int | None:
    """SLURM_TASKS_PER_NODE syntax, '2(x3),1': this node's count (by SLURM_NODEID), or the common one."""
    counts: list[int] = []
    for part in value.split(","):
        num, _, rep = part.partition("(x")
        counts += [int(num)] * (int(rep.rstrip(")")) if rep else 1)
    if node is not None and node.isdigit() and int(node) < len(counts):
        return counts[int(node)]
    return counts[0] if counts and len(set(counts)) == 1 else None


def _nemo_rl(env) -> int | None:
    """NeMo-RL's Ray workers: RANK plus AVAILABLE_ADDR_LIST, the node address of every rank."""
    addrs = ast.literal_eval(env["AVAILABLE_ADDR_LIST"])
    rank = int(env["RANK"])
    if not isinstance(addrs, (list, tuple)) or not 0 <= rank < len(addrs):
        return None
    return sum(1 for a in addrs if a == addrs[rank])


# In precedence order: a launcher started inside another one (torchrun under srun, Ray workers
# on a Slurm allocation) knows its own ranks better than the outer one does.
_LAUNCHERS = (
    ("torchrun", ("LOCAL_WORLD_SIZE",), lambda env: int(env["LOCAL_WORLD_SIZE"])),
    ("NeMo-RL (Ray)", ("AVAILABLE_ADDR_LIST", "RANK"), _nemo_rl),
    ("OpenMPI", ("OMPI_COMM_WORLD_LOCAL_SIZE",), lambda env: int(env["OMPI_COMM_WORLD_LOCAL_SIZE"])),
    ("MPICH", ("MPI_LOCALNRANKS",), lambda env: int(env["MPI_LOCALNRANKS"])),
    ("Slurm", ("SLURM_STEP_TASKS_PER_NODE",), lambda env: _slurm_list(env["SLURM_STEP_TASKS_PER_NODE"],
                                                                        env.get("SLURM_NODEID"))),
    ("Slurm", ("SLURM_NTASKS_PER_NODE",), lambda env: int(env["SLURM_NTASKS_PER_NODE"])),
    ("Slurm", ("SLURM_TASKS_PER_NODE",), lambda env: _slurm_list(env["SLURM_TASKS_PER_NODE"],
                                                                   env.get("SLURM_NODEID"))),
)


def local_ranks(env=None) -> dict:
    """{"count": ranks on this node or None, "source": which launcher variable said so}."""
    env = os.environ if env is None else env
    for launcher, names, read in _LAUNCHERS:
        if all(env.get(n) for n in names):
            try:
                count = read(env)
            except (ValueError, SyntaxError, TypeError, KeyError):
                count = None
            if count and count > 0:
                return {"count": int(count), "source": f"{launcher}: {names[0]}"}
    if env.get("RANK") and env.get("WORLD_SIZE"):
        return {"count": None, "source": "RANK/WORLD_SIZE only: ranks per node unknown"}
    return {"count": None, "source": "no launcher variable names the ranks per node"}


def devices(env=None) -> dict:
    """{"count", "source"}: the node's GPUs, which /proc/driver/nvidia/gpus lists whatever
    CUDA_VISIBLE_DEVICES hides (a Ray worker is shown one); else the devices this process is shown."""
    env = os.environ if env is None else env
    try:
        count = len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        count = 0
    if count:
        return {"count": count, "source": "GPUs on this node (/proc/driver/nvidia/gpus)"}
    shown = []
    for item in env.get("CUDA_VISIBLE_DEVICES", "").split(","):
        if not item.strip() or item.strip().startswith("-"):  # CUDA stops at the first invalid entry
            break
        shown.append(item)
    if shown:
        return {"count": len(shown), "source": "CUDA_VISIBLE_DEVICES"}
    return {"count": None, "source": "no GPU count on this node"}
