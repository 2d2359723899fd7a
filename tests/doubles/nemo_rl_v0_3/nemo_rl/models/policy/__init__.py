"""Test double of NeMo-RL (see tests/doubles/README.md).

`PolicyConfig` is upstream's TypedDict (`nemo_rl/models/policy/__init__.py`) that the Megatron policy
worker's `__init__` is annotated with; cloudpickle ships annotations by reference, so an actor
process unpickling a worker class by value imports `nemo_rl` here, as it does upstream.
"""

from typing import TypedDict


class PolicyConfig(TypedDict, total=False):
    model_name: str
