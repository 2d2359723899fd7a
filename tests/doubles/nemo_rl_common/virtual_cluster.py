"""Shared body of nemo_rl/distributed/virtual_cluster.py, the same in the v0.3.1, v0.4.0 and v0.7.0 doubles.

`inline=True` (test-only) runs workers in this process; otherwise they are Ray actors on the
local cluster the test started.
"""

from __future__ import annotations

from nemo_rl_common.release import upstream_module


class RayVirtualCluster:
    def __init__(self, bundle_ct_per_node_list: list[int], use_gpus: bool = True,
                 max_colocated_worker_groups: int = 1, num_gpus_per_node: int = 1,
                 name: str = "", inline: bool = True):
        self._bundle_ct_per_node_list = bundle_ct_per_node_list
        self.num_gpus_per_node = num_gpus_per_node
        self.inline = inline

    def world_size(self) -> int:
        return sum(self._bundle_ct_per_node_list)


upstream_module("nemo_rl.distributed.virtual_cluster", RayVirtualCluster)
