"""Test double of NeMo-RL main (7ea279abf) nemo_rl/models/generation/vllm/vllm_worker_async.py: upstream is unchanged from v0.7.0 in every
property colo-shim relies on, so this module runs the v0.7.0 double's code as itself."""

from nemo_rl_common import same_as

same_as(globals(), "v0_7")
