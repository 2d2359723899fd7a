"""Shared body of nemo_rl/distributed/worker_groups.py, the same in the v0.3.1, v0.4.0 and v0.7.0 doubles.

Same class, method names and signatures; workers are real Ray actors (env vars copied from
os.environ like upstream) or, when the cluster double is inline, the class Ray itself instantiates in
an actor (`__ray_metadata__.modified_class`: @ray.remote's subclass with the method wrappers it
captured at decoration) run in this process, so that most tests need no Ray start-up yet call what
an actor calls. Inline futures are plain values;
coroutines of async workers run on one event loop owned by the group.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import os
import threading

import ray

from nemo_rl_common.release import upstream_module


class RayWorkerBuilder:
    def __init__(self, ray_actor_class_fqn: str, *args, **kwargs):
        self.ray_actor_class_fqn = ray_actor_class_fqn
        self.args, self.kwargs = args, kwargs

    def create_worker(self, inline: bool, env_vars: dict[str, str]):
        module, _, name = self.ray_actor_class_fqn.rpartition(".")
        actor_class = getattr(importlib.import_module(module), name)
        if inline:
            return actor_class.__ray_metadata__.modified_class(*self.args, **self.kwargs)
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("RAY_")}, **env_vars}
        return actor_class.options(runtime_env={"env_vars": env}).remote(*self.args, **self.kwargs)


class RayWorkerGroup:
    def __init__(self, cluster, remote_worker_builder: RayWorkerBuilder, workers_per_node=None,
                 name_prefix: str = "", bundle_indices_list=None, sharding_annotations=None,
                 env_vars: dict[str, str] | None = None):
        self.cluster = cluster
        self.inline = cluster.inline
        self.workers = [remote_worker_builder.create_worker(self.inline, env_vars or {})
                        for _ in range(cluster.world_size())]
        self.dp_size = len(self.workers)
        self._loop = None
        if self.inline:  # a loop of its own, so inline calls also work from inside a running loop
            self._loop = asyncio.new_event_loop()
            threading.Thread(target=self._loop.run_forever, daemon=True).start()

    def _call(self, worker, method_name, *args, **kwargs):
        if not self.inline:
            return getattr(worker, method_name).remote(*args, **kwargs)
        result = getattr(worker, method_name)(*args, **kwargs)
        if inspect.iscoroutine(result):
            return asyncio.run_coroutine_threadsafe(result, self._loop).result()
        if inspect.isasyncgen(result):
            async def drain(gen=result):
                return [item async for item in gen]
            return asyncio.run_coroutine_threadsafe(drain(), self._loop).result()
        return result

    def run_all_workers_single_data(self, method_name: str, *args, run_rank_0_only_axes=None, **kwargs):
        return [self._call(w, method_name, *args, **kwargs) for w in self.workers]

    def run_all_workers_sharded_data(self, method_name: str, *args, data=None, in_sharded_axes=None,
                                     replicate_on_axes=None, output_is_replicated=None,
                                     make_dummy_calls_to_free_axes=False, common_kwargs=None):
        return [self._call(w, method_name, shard, **(common_kwargs or {})) for w, shard in zip(self.workers, data)]

    def run_all_workers_multiple_data(self, method_name: str, *args, run_rank_0_only_axes=None,
                                      common_kwargs=None, **kwargs):
        return [self._call(w, method_name, *[a[i] for a in args],
                           **{k: v[i] for k, v in kwargs.items()}, **(common_kwargs or {}))
                for i, w in enumerate(self.workers)]

    def get_all_worker_results(self, future_bundle):
        return get(future_bundle)

    def shutdown(self, cleanup_method: str | None = None, timeout: float = 30.0, force: bool = False) -> bool:
        if cleanup_method:
            get(self.run_all_workers_single_data(cleanup_method))
        if not self.inline:
            for w in self.workers:
                ray.kill(w)
        return True


def get(futures):
    """ray.get for actor futures; inline results pass through (test double only)."""
    if futures and isinstance(futures[0], ray.ObjectRef):
        return ray.get(futures)
    return list(futures)


upstream_module("nemo_rl.distributed.worker_groups", RayWorkerBuilder, RayWorkerGroup, get)
