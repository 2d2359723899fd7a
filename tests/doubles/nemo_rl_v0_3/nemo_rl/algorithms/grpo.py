"""Test double of NeMo-RL v0.3.1 nemo_rl/algorithms/grpo.py (setup's init_vllm, refit_policy_generation,
grpo_train, validate; v0.3.1 has no dynamic sampling).

v0.3.1 specifics: configs use item access (`master_config["grpo"][...]`); the refit goes through
CUDA-IPC handles (prepare_weights_for_ipc / get_weights_ipc_handles / update_weights_from_ipc_handles);
no dynamic sampling. The functions' code, and the generation call order it follows, is
nemo_rl_common/grpo.py's, defined in this module by nemo_rl_common.release.define: it runs with
this module's globals (grpo_train reads `validate` and `refit_policy_generation` here at call
time, as upstream does) and in frames of this module (colo-shim's discard policy reads them).
"""

from __future__ import annotations

# the names imported here are read by the shared bodies (release.define checks them)
import torch  # noqa: F401

from nemo_rl.algorithms.utils import repeat_batch  # noqa: F401
from nemo_rl.distributed.worker_groups import get  # noqa: F401
from nemo_rl.experience.rollouts import run_multi_turn_rollout  # noqa: F401
from nemo_rl.models.generation.vllm import VllmGeneration  # noqa: F401 (v0.3: one module)
from nemo_rl_common import grpo as _shared
from nemo_rl_common.release import define

_section = _shared.item  # config access of this release
_field = _shared.item  # section values: dict sections
_colocated_weight_update = _shared.update_weights_from_ipc_handles
_DYNAMIC_SAMPLING = False

define(globals(), _shared.setup, _shared.refit_policy_generation, _shared.validate, _shared.grpo_train,
       may_lack=("calculate_baseline_and_std_per_prompt", "dynamic_sampling"))
