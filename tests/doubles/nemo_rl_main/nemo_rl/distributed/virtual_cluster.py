"""Test double of NeMo-RL main (7ea279abf) nemo_rl/distributed/virtual_cluster.py (RayVirtualCluster).

The code is the same in the v0.3.1, v0.4.0 and v0.7.0 doubles: nemo_rl_common/virtual_cluster.py.
"""

from __future__ import annotations

from nemo_rl_common.virtual_cluster import RayVirtualCluster

__all__ = ["RayVirtualCluster"]
