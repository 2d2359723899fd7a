"""Child: NeMo-RL's move_optimizer through real Ray `.remote()` actors of the worker doubles.

As NeMo-RL's IsolatedWorkerInitializer does, a builder actor with one release's doubles on its
PYTHONPATH imports the worker module (running `@ray.remote` there) and starts the worker actor,
COLO_SHIM=offload,megatron in both (NeMo-RL copies the environment into every actor). The worker
holds a torch model and Adam; inside it fake_cuda.FakeCuda stays entered on the actor's thread, so
its state really moves. The builder then calls `worker.move_optimizer.remote("cpu" | "cuda")`
for three rounds, looks inside the worker after each call, and changes the state in place between
rounds as a train step would. argv[1]: JSON list of releases. Prints `RESULT <json>`.
"""

import json
import os
import sys

import ray

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DOUBLES = os.path.join(REPO, "tests", "doubles")
MODULE = "nemo_rl.models.policy.workers.megatron_policy_worker"


def enter_device(worker):
    """On the actor's thread: enter the stand-in for good, then bring the state to the device."""
    from harness.fake_cuda import FakeCuda

    worker._fake_cuda = FakeCuda()
    worker._fake_cuda.__enter__()
    worker.move_optimizer("cuda")
    return look(worker)


def look(worker):
    import torch

    from colo_shim.offload import mirrors
    from harness.fake_cuda import on_device

    tensors = [v for s in worker.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    return {"ids": [id(t.untyped_storage()) for t in tensors], "on_device": [on_device(t) for t in tensors],
            "values": [t.double().flatten().tolist() for t in tensors],
            "mirrors": sum(1 for t in tensors if id(t.untyped_storage()) in mirrors._mirrors)}


def train(worker):
    for s in worker.optimizer.state.values():
        for k, v in s.items():
            if k != "step":
                v.add_(0.5)  # in place, as Adam's step does
    return True


def shim(worker):
    import colo_shim
    from colo_shim.core import wrapping
    from colo_shim.offload import mirrors

    cls = next(c for c in type(worker).__mro__ if isinstance(vars(c).get("move_optimizer"), wrapping.ShimWrapper))
    layers, obj = [], vars(cls)["move_optimizer"]
    while isinstance(obj, wrapping.ShimWrapper):
        layers.append(obj._self_colo_shim_key.split(":")[0])
        obj = obj.__wrapped__
    rows = {f"{r['name']}:{r['target'].split(':', 1)[1]}": [r["status"], r["calls"]]
            for r in colo_shim.status() if r["name"] in ("offload", "megatron") and "move_optimizer" in r["target"]}
    return {"layers": layers, "rows": rows, "report": mirrors.report()}


def env_for(release):
    parts = [os.path.join(REPO, "colo_shim", "bootstrap"), REPO, os.path.join(DOUBLES, f"nemo_rl_{release}"), DOUBLES,
             HERE]
    return {"PYTHONPATH": os.pathsep.join(parts), "COLO_SHIM": "offload,megatron", "COLO_SHIM_OFFLOAD": "on"}


@ray.remote(num_cpus=0)
class Builder:
    def run(self, release):
        import importlib

        import torch

        module = importlib.import_module(MODULE)
        model = torch.nn.Linear(16, 8)
        model(torch.ones(2, 16)).sum().backward()
        adam = torch.optim.Adam(model.parameters())
        adam.step()
        kwargs = {"worker_sharding_annotations": None}
        if release == "v0_5":
            kwargs["pre_init_communication_queue"] = None
        worker = module.MegatronPolicyWorker.options(runtime_env={"env_vars": env_for(release)}).remote(
            {"model": model, "optimizer": adam}, None, **kwargs)
        seen = [ray.get(worker.__ray_call__.remote(enter_device), timeout=120)]
        for _ in range(3):
            for device in ("cpu", "cuda"):
                ray.get(worker.move_optimizer.remote(device), timeout=60)
                seen.append(ray.get(worker.__ray_call__.remote(look), timeout=60))
            ray.get(worker.__ray_call__.remote(train), timeout=60)
            seen.append(ray.get(worker.__ray_call__.remote(look), timeout=60))
        return {"rounds": seen, "shim": ray.get(worker.__ray_call__.remote(shim), timeout=60)}


def main():
    releases = json.loads(sys.argv[1])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        builders = [Builder.options(runtime_env={"env_vars": env_for(r)}).remote() for r in releases]
        refs = [b.run.remote(r) for b, r in zip(builders, releases)]
        out = {}
        for release, ref in zip(releases, refs):
            try:
                out[release] = ray.get(ref, timeout=300)
            except Exception:
                import traceback

                out[release] = {"error": traceback.format_exc()[-3000:]}
        print("RESULT " + json.dumps(out), flush=True)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
