"""Test double of NeMo-RL (see tests/doubles/README.md)."""
