"""Test double of NeMo-RL v0.7.0 nemo_rl/algorithms/grpo.py (setup's init_vllm, refit_policy_generation,
dynamic_sampling, grpo_train, validate).

In v0.7.0 configs use attribute access (`master_config.grpo[...]`); refit (ZMQ stream) and DAPO
dynamic sampling as in v0.4.0. Function bodies and their call order: nemo_rl_common/grpo.py,
made this module's own functions by nemo_rl_common.release.define (this module's globals, read
at call time - `validate`, `refit_policy_generation`, `dynamic_sampling` - and this module's
frames, which colo-shim's discard policy inspects).
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

_section = _shared.attr  # config access of this release
_field = _shared.item  # section values: dict sections
_colocated_weight_update = _shared.update_weights_via_ipc_zmq
_DYNAMIC_SAMPLING = True

define(globals(), _shared.setup, _shared.refit_policy_generation, _shared.dynamic_sampling, _shared.validate,
       _shared.grpo_train)
