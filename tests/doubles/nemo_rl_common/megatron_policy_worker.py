"""Storage moves shared by the Megatron policy worker doubles of every NeMo-RL release.

Upstream moved these bodies unchanged between layouts (v0.5 `@ray.remote class
MegatronPolicyWorker`, v0.6+ `MegatronPolicyWorkerImpl`), so they are written once here; each
release file keeps its own module path, class layout and the signatures colo-shim wraps, and
inherits or calls these. In miniature: `config["model"]` is a real megatron-core
DistributedDataParallel or any torch module, `config["optimizer"]` a real optimizer.
"""

import torch


def device_or_cpu(device: str) -> str:
    return device if device == "cpu" or torch.cuda.is_available() else "cpu"


@torch.no_grad()
def move_model_storage(model, device: str, move_params: bool = True, move_grads: bool = True):
    buffers = getattr(model, "buffers", None)
    if isinstance(buffers, list):  # megatron-core DDP: upstream walks its buffers
        for buffer in buffers + list(getattr(model, "expert_parallel_buffers", [])):
            if device == "cpu":
                buffer.offload_to_cpu(move_params=move_params, move_grads=move_grads)
            else:
                buffer.reload_from_cpu(move_params=move_params, move_grads=move_grads)
    elif move_params:
        model.to(device_or_cpu(device))
    return model


def move_optimizer_state(optimizer, device: str) -> None:
    """Upstream's move_optimizer (v0.5 .. main): a ChainedOptimizer's `state`, else megatron's
    `_get_state()` (a torch optimizer's `state` here), and only tensors not already there."""
    if optimizer is None:
        return
    if hasattr(optimizer, "chained_optimizers") or not hasattr(optimizer, "_get_state"):
        optimizer_state = optimizer.state
    else:
        optimizer_state = optimizer._get_state()
    for _, state in optimizer_state.items():
        for k, v in state.items():
            if torch.is_tensor(v):
                if device == "cpu" and v.is_cuda:
                    state[k] = v.to("cpu")
                elif device == "cuda" and not v.is_cuda:
                    state[k] = v.to(device_or_cpu("cuda"))


def init_storage(worker, config) -> None:
    worker.cfg = config
    worker.model = config["model"]
    worker.optimizer = config.get("optimizer")
    worker.events = []


class MegatronPolicyWorkerV05:
    """The v0.5 method bodies, which v0.6 moved as they were into MegatronPolicyWorkerImpl."""

    def prepare_for_lp_inference(self):
        self.model = self.move_model(self.model, "cuda", move_grads=False)
        self.model.eval()
        self.move_optimizer("cpu")

    def prepare_for_training(self, *args, **kwargs):
        self.model = self.move_model(self.model, "cuda", move_grads=True, move_params=True)
        self.model.train()
        self.move_optimizer("cuda")
        self.events.append("prepare_for_training")

    def offload_before_refit(self):
        """Offload the optimizer and buffers to the CPU."""
        self.model = self.move_model(self.model, "cpu", move_params=False, move_grads=True)
        self.move_optimizer("cpu")
        self.events.append("offload_before_refit")

    def offload_after_refit(self):
        """Offload as much as possible on the CPU."""
        self.model = self.move_model(self.model, "cpu")
        self.model.eval()
        self.events.append("offload_after_refit")

    def move_model(self, model: torch.nn.Module, device: str, move_params: bool = True,
                   move_grads: bool = True) -> torch.nn.Module:
        return move_model_storage(model, device, move_params, move_grads)

    def move_optimizer(self, device: str):
        move_optimizer_state(self.optimizer, device)
        self.events.append(f"move_optimizer({device})")
