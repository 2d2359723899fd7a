"""Child script: NeMo-RL worker doubles as real Ray actors in a real local cluster.

Like NeMo-RL's RayWorkerBuilder.IsolatedWorkerInitializer (v0.4+), a builder actor with one
release's doubles on its PYTHONPATH imports the worker module by name and calls `.remote()`; the
worker actor gets COLO_SHIM through its runtime_env as NeMo-RL copies the environment. The builder
is the process that runs `@ray.remote`; per case it is armed before the import (order a) or gets
`colo_shim.install()` after the import (order b); with c_first it first sends a worker while it has
no colo-shim at all (order c); with no_shim_worker it also starts a worker without colo-shim
(order d). The builder calls its workers through Ray (`actor.method.remote()`, as RayWorkerGroup
does) and reads `colo_shim.status()` inside each worker; it also calls the class Ray instantiates
in its own process.

argv[1]: JSON {"cases": [{"layout", "order", "families", "c_first", "no_shim_worker", "async_vllm"}],
"vllm_dir": path}.
Prints one line `RESULT <json>`: per case, the builder's and the worker's status rows and any error.
"""

import json
import os
import sys

import ray

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOUBLES = os.path.join(REPO, "tests", "doubles")
MEGATRON = {"v0_3": "nemo_rl.models.policy.megatron_policy_worker"}
MEGATRON_NEW = "nemo_rl.models.policy.workers.megatron_policy_worker"
VLLM = {"VllmGenerationWorker": "nemo_rl.models.generation.vllm.vllm_worker",
        "VllmAsyncGenerationWorker": "nemo_rl.models.generation.vllm.vllm_worker_async"}


def rows(family):
    import colo_shim

    return [{k: r[k] for k in ("target", "status", "calls", "reason")} | {"fences": r["details"].get("fences")}
            for r in colo_shim.status() if r["name"] == family and "nemo_rl" in r["target"]]


def megatron_args():
    import torch

    model = torch.nn.Linear(4, 4)
    model(torch.ones(1, 4)).sum().backward()
    adam = torch.optim.Adam(model.parameters())
    adam.step()
    return ({"model": model, "optimizer": adam}, None), {"worker_sharding_annotations": None}


def vllm_args(async_engine):
    cfg = {"backend": "vllm", "model_name": "tiny-0", "temperature": 1.0, "max_new_tokens": 4,
           "colocated": {"enabled": True}, "vllm_kwargs": {},
           "vllm_cfg": {"async_engine": async_engine, "expert_parallel_size": 1, "tensor_parallel_size": 1,
                        "pipeline_parallel_size": 1}}
    return (cfg,), {}


def megatron_calls(worker, has_move_optimizer, remote=True):
    def call(name, *a):
        return getattr(worker, name).remote(*a) if remote else getattr(worker, name)(*a)

    out = [call("offload_before_refit"), call("offload_after_refit"), call("prepare_for_lp_inference"),
           call("prepare_for_training")]
    if has_move_optimizer:
        out.append(call("move_optimizer", "cpu"))
    return out


@ray.remote(num_cpus=0)
class Builder:
    """Plays NeMo-RL's IsolatedWorkerInitializer: import by name, then .remote()."""

    def build(self, case, envs):
        import importlib

        shim_loaded_before = "colo_shim.core.registry" in sys.modules
        families = case["families"]
        names = []
        if "megatron" in families:
            names.append(("MegatronPolicyWorker", MEGATRON.get(case["layout"], MEGATRON_NEW)))
        if "vllm" in families:
            names += list(VLLM.items())
        modules = {cls: importlib.import_module(mod) for cls, mod in names}
        self.workers, self.kinds, local = [], [], None
        if case.get("c_first"):  # order c: this process has no colo-shim when it decorates and sends the class
            args, kwargs = self._megatron_args(case)
            actor_class = modules["MegatronPolicyWorker"].MegatronPolicyWorker
            self.kinds.append("megatron-c")
            self.workers.append(actor_class.options(runtime_env={"env_vars": envs["shim"]}).remote(*args, **kwargs))
        if case["order"] == "b":
            import colo_shim

            colo_shim.install(families)
        for cls_name, module in modules.items():
            actor_class = getattr(module, cls_name)
            if cls_name == "MegatronPolicyWorker":
                args, kwargs = self._megatron_args(case)
                # in this process too: the class Ray instantiates (ActorClass.__ray_metadata__.modified_class)
                inline = actor_class.__ray_metadata__.modified_class(*args, **kwargs)
                megatron_calls(inline, case["layout"] != "v0_3", remote=False)
                local = rows("megatron")
                kinds = [("megatron", envs["shim"])]
                if case.get("no_shim_worker"):  # order d: the worker process has no colo-shim
                    kinds.append(("megatron-no-shim", envs["no_shim"]))
            else:
                is_async = cls_name == "VllmAsyncGenerationWorker"
                if is_async and not case.get("async_vllm", True):
                    continue
                args, kwargs = vllm_args(is_async)
                kinds = [("vllm-async" if is_async else "vllm-sync", envs["shim"])]
            for kind, env in kinds:
                self.kinds.append(kind)
                self.workers.append(actor_class.options(runtime_env={"env_vars": env}).remote(*args, **kwargs))
        return {"workers": self.workers, "kinds": self.kinds, "local": local,
                "shim_loaded_before_import": shim_loaded_before}

    @staticmethod
    def _megatron_args(case):
        args, kwargs = megatron_args()
        if case["layout"] in ("v0_3", "v0_5"):
            kwargs["pre_init_communication_queue"] = None
        return args, kwargs

    def drive(self, layout):
        """Call every worker through Ray, as NeMo-RL's RayWorkerGroup does (actor.method.remote())."""
        refs = [calls_for(kind, worker, layout) for kind, worker in zip(self.kinds, self.workers)]
        return ray.get([ref for group in refs for ref in group], timeout=240) and True

    def inside(self, index, fn):
        """Run fn(actor) in worker `index` (here: a handle passed to a process that cannot import the worker's
        module loses its method signatures)."""
        return ray.get(self.workers[index].__ray_call__.remote(fn), timeout=120)


def env_for(layout, shim, vllm_dir):
    parts = [os.path.join(REPO, "colo_shim", "bootstrap"), REPO, os.path.join(DOUBLES, f"nemo_rl_{layout}"), DOUBLES,
             os.path.join(DOUBLES, "vllm_engine"), vllm_dir]
    return {"PYTHONPATH": os.pathsep.join(parts), "COLO_SHIM": shim or "0"}


def in_worker_rows(family):
    """For actor.__ray_call__ (it passes only the actor), read colo_shim.status() inside the actor."""
    return lambda actor: rows(family)


def sleep_with_level(self):  # what a direct caller does inside the worker: the Impl's sleep(level=)
    self.sleep(level=1)
    self.wake_up()
    return True


def calls_for(kind, worker, layout):
    if kind.startswith("megatron"):
        return megatron_calls(worker, layout != "v0_3")
    if kind == "vllm-sync":
        return [worker.sleep.remote(), worker.wake_up.remote()]
    return [worker.sleep_async.remote(), worker.wake_up_async.remote()]


def main():
    spec = json.loads(sys.argv[1])
    cases, vllm_dir = spec["cases"], spec["vllm_dir"]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        builders, built = [], []
        for case in cases:  # all at once: the cases share the two cores instead of queueing
            shim = ",".join(case["families"])
            builder = Builder.options(runtime_env={"env_vars": env_for(
                case["layout"], shim if case["order"] == "a" else None, vllm_dir)}).remote()
            envs = {"shim": env_for(case["layout"], shim, vllm_dir), "no_shim": env_for(case["layout"], None, vllm_dir)}
            builders.append(builder)
            built.append(builder.build.remote(case, envs))
        results = []
        for case, builder, ref in zip(cases, builders, built):
            try:
                results.append({"case": case, "builder": builder, **ray.get(ref, timeout=300)})
            except Exception:
                import traceback

                results.append({"case": case, "error": traceback.format_exc()[-3000:]})
        pending = [(r, r["builder"].drive.remote(r["case"]["layout"])) for r in results if "error" not in r]
        for r, ref in pending:
            try:
                ray.get(ref, timeout=300)
                builder = r["builder"]
                r["worker"] = {}
                for i, kind in enumerate(r["kinds"]):
                    family = kind.split("-")[0]
                    r["worker"][kind] = ray.get(builder.inside.remote(i, in_worker_rows(family)), timeout=300)
                    if kind == "vllm-sync":
                        try:
                            inside = builder.inside.remote(i, sleep_with_level)
                            r["sleep_level_in_worker"] = ray.get(inside, timeout=300)
                        except Exception as exc:
                            r["sleep_level_in_worker"] = f"{type(exc).__name__}: {str(exc).splitlines()[-1][:300]}"
            except Exception:
                import traceback

                r["error"] = traceback.format_exc()[-3000:]
        for r in results:
            for key in ("builder", "workers"):
                r.pop(key, None)
        print("RESULT " + json.dumps(results), flush=True)  # Ray may print after it at shutdown
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
