"""Test double of NeMo-RL main (7ea279abf) nemo_rl/algorithms/grpo.py (configs, setup's init_vllm,
refit_policy_generation, dynamic_sampling, grpo_train, validate).

Since PR #2518 main's configs are pydantic models: `MasterConfig(BaseModel, extra="allow")`, built
by examples/run_grpo.py as `MasterConfig(**config)`, whose `grpo` is a `GRPOConfig(BaseModel,
extra="allow")` - an object read by attribute (`master_config.grpo.use_dynamic_sampling`), not a
dict - while `policy` stays a TypedDict, i.e. a plain dict after validation. The models keep
upstream's field names, types and defaults for what the loop doubles read (upstream's other
sections - loss_fn, env, data, logger, cluster, checkpointing - are left out). Function bodies
and their call order: nemo_rl_common/grpo.py, defined here by nemo_rl_common.release.define.
"""

from __future__ import annotations

from typing import Any

# the names imported here are read by the shared bodies (release.define checks them)
import torch  # noqa: F401
from pydantic import BaseModel

from nemo_rl.algorithms.utils import calculate_baseline_and_std_per_prompt, concat_rows, repeat_batch, select_rows  # noqa: F401
from nemo_rl.distributed.worker_groups import get  # noqa: F401
from nemo_rl.experience.rollouts import run_multi_turn_rollout  # noqa: F401
from nemo_rl.models.generation.vllm import VllmGeneration  # noqa: F401
from nemo_rl_common import grpo as _shared
from nemo_rl_common.release import define


class GRPOConfig(BaseModel, extra="allow"):
    num_prompts_per_step: int = 32
    num_generations_per_prompt: int = 16
    max_num_epochs: int = 1
    max_num_steps: int = 1000000
    max_rollout_turns: int = 1
    val_period: int = 10
    val_at_start: bool = False
    use_dynamic_sampling: bool = False
    dynamic_sampling_max_gen_batches: int = 10


class MasterConfig(BaseModel, extra="allow"):
    policy: dict[str, Any]  # upstream: PolicyConfig, a TypedDict
    grpo: GRPOConfig


_section = _shared.attr  # config access of this release: master_config.grpo
_field = _shared.attr    # section values: pydantic sections, master_config.grpo.use_dynamic_sampling
_colocated_weight_update = _shared.update_weights_via_ipc_zmq
_DYNAMIC_SAMPLING = True

define(globals(), _shared.setup, _shared.refit_policy_generation, _shared.dynamic_sampling, _shared.validate,
       _shared.grpo_train)
