"""Test double of NeMo-RL main (7ea279abf) nemo_rl/distributed/worker_groups.py (RayWorkerBuilder, RayWorkerGroup).

The code is the same in the v0.3.1, v0.4.0 and v0.7.0 doubles: nemo_rl_common/worker_groups.py.
"""

from __future__ import annotations

from nemo_rl_common.worker_groups import RayWorkerBuilder, RayWorkerGroup, get

__all__ = ["RayWorkerBuilder", "RayWorkerGroup", "get"]
