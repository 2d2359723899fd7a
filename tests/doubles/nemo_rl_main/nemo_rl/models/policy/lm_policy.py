"""Test double of NeMo-RL main (7ea279abf) `nemo_rl/models/policy/lm_policy.py`: `Policy`, the driver's handle.

What colo-shim's driver-side patch (checkpoint/nemo_rl_driver.py) relies on, as upstream: the workers
are `MegatronPolicyWorker` Ray actors in `self.worker_group` (a `RayWorkerGroup`, `.workers` their
handles), plain actors that run one call at a time; each method sends one call to every worker with
`run_all_workers_single_data` and `ray.get`s the futures; `finalize_async_save` is main's `wait_fn`
for `CheckpointManager.begin_finalization`, so it is called from the checkpointer's background thread.
The constructor takes upstream's arguments; the worker config here is the Megatron worker double's dict
(its "checkpoint" keys), and `cluster` the RayVirtualCluster double (real actors unless inline).
"""

import os
from typing import Optional

import ray

from nemo_rl.distributed.worker_groups import RayWorkerBuilder, RayWorkerGroup, get

WORKER_FQN = "nemo_rl.models.policy.workers.megatron_policy_worker.MegatronPolicyWorker"


class Policy:
    def __init__(self, cluster, config, tokenizer, name_prefix: str = "lm_policy", workers_per_node=None,
                 init_optimizer: bool = True, weights_path: Optional[str] = None,
                 optimizer_path: Optional[str] = None, init_reference_model: bool = True, processor=None,
                 worker_extension_cls_fqn: Optional[str] = None, skip_weight_load: bool = False):
        if weights_path:
            weights_path = os.path.abspath(weights_path)
        self.cfg = config
        builder = RayWorkerBuilder(WORKER_FQN, config, tokenizer, weights_path=weights_path,
                                   optimizer_path=optimizer_path, init_optimizer=init_optimizer,
                                   init_reference_model=init_reference_model, worker_sharding_annotations=None)
        self.worker_group = RayWorkerGroup(cluster, builder, workers_per_node=workers_per_node,
                                           name_prefix=name_prefix)

    def offload_before_refit(self) -> None:
        futures = self.worker_group.run_all_workers_single_data("offload_before_refit")
        get(futures)

    def offload_after_refit(self) -> None:
        futures = self.worker_group.run_all_workers_single_data("offload_after_refit")
        get(futures)

    def save_checkpoint(self, weights_path: str, optimizer_path: Optional[str] = None,
                        tokenizer_path: Optional[str] = None, checkpointing_cfg=None) -> None:
        """With async_save, returns once the save is scheduled; finalize_async_save before the rename."""
        futures = self.worker_group.run_all_workers_single_data(
            "save_checkpoint", weights_path=weights_path, optimizer_path=optimizer_path,
            tokenizer_path=tokenizer_path)
        get(futures)

    def finalize_async_save(self) -> None:
        """Block until all workers' in-flight async checkpoint writes complete."""
        futures = self.worker_group.run_all_workers_single_data("finalize_async_save")
        get(futures)

    def shutdown(self) -> bool:
        try:
            return self.worker_group.shutdown()
        except ray.exceptions.RayActorError:
            return True
