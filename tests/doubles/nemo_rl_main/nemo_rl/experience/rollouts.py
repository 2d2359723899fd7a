"""Test double of NeMo-RL main (7ea279abf) nemo_rl/experience/rollouts.py (run_multi_turn_rollout, single turn).

The code is the same in the v0.3.1, v0.4.0 and v0.7.0 doubles: nemo_rl_common/rollouts.py.
"""

from __future__ import annotations

from nemo_rl_common.rollouts import run_multi_turn_rollout

__all__ = ["run_multi_turn_rollout"]
