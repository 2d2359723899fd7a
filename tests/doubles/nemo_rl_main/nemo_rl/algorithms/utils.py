"""Test double of NeMo-RL main (7ea279abf) nemo_rl/algorithms/utils.py (calculate_baseline_and_std_per_prompt, batch helpers).

The code is the same in the v0.3.1, v0.4.0 and v0.7.0 doubles: nemo_rl_common/utils.py.
"""

from __future__ import annotations

from nemo_rl_common.utils import calculate_baseline_and_std_per_prompt, concat_rows, repeat_batch, select_rows

__all__ = ["calculate_baseline_and_std_per_prompt", "concat_rows", "repeat_batch", "select_rows"]
