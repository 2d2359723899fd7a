"""vLLM `general_plugins` entry point: vLLM loads it in the engine and in every worker process,
including workers whose environment never saw our sitecustomize (Ray placement groups, spawn)."""


def register() -> None:
    from colo_shim._activate import activate

    activate()
