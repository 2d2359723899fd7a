"""Test double of NeMo-RL v0.4.0 nemo_rl/algorithms/grpo.py (setup's init_vllm, refit_policy_generation,
dynamic_sampling, grpo_train, validate).

v0.4.0 specifics: configs use item access (`master_config["grpo"][...]`); the colocated refit streams
weights through ZMQ; DAPO dynamic sampling. The functions' code (call order included) is
nemo_rl_common/grpo.py's, bound to this module by nemo_rl_common.release.define, so that
`validate`, `refit_policy_generation` and `dynamic_sampling` resolve here at call time and the
loop's frames are this module's, as upstream's.
"""

from __future__ import annotations

# the names imported here are read by the shared bodies (release.define checks them)
import torch  # noqa: F401

from nemo_rl.algorithms.utils import calculate_baseline_and_std_per_prompt, concat_rows, repeat_batch, select_rows  # noqa: F401
from nemo_rl.distributed.worker_groups import get  # noqa: F401
from nemo_rl.experience.rollouts import run_multi_turn_rollout  # noqa: F401
from nemo_rl.models.generation.vllm import VllmGeneration  # noqa: F401
from nemo_rl_common import grpo as _shared
from nemo_rl_common.release import define

_section = _shared.item  # config access of this release
_field = _shared.item  # section values: dict sections
_colocated_weight_update = _shared.update_weights_via_ipc_zmq
_DYNAMIC_SAMPLING = True

define(globals(), _shared.setup, _shared.refit_policy_generation, _shared.dynamic_sampling, _shared.validate,
       _shared.grpo_train)
