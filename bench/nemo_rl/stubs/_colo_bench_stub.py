"""Shared body of the stand-in packages for NeMo-RL main's logger backends.

main's logger imports mlflow, swanlab and wandb at module level even when every backend is off (the
bench runs with all of them off: the GPU machine has no network and nothing may phone home). These
packages satisfy those imports and nothing else: any use beyond building the inert data holders raises
and names the stub, so a run that reaches a real backend fails loudly instead of logging nowhere.
"""


class StubUsed(RuntimeError):
    pass


class _Inert:
    """wandb.Table / wandb.Histogram: main builds them in metric dicts; with wandb off they are never sent."""

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs


class _Namespace:
    """wandb.wandb_run: Megatron-LM's rl_utils names wandb_run.Run in a signature, evaluated at import."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (_Inert,), {"__module__": self._name})


def make_getattr(package, inert=(), namespaces=()):
    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        if name in inert:
            return type(name, (_Inert,), {"__module__": package})
        if name in namespaces:
            return _Namespace(f"{package}.{name}")

        def refuse(*args, **kwargs):
            raise StubUsed(f"{package}.{name} called: this {package} is the colo-shim bench stub (no network, "
                           f"logger backend off); enable no {package} logger in this run")

        refuse.__name__ = name
        return refuse

    return __getattr__
