"""Test double of NeMo-RL main `nemo_rl/utils`."""
