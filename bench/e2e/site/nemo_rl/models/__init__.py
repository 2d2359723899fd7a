"""See nemo_rl/__init__.py."""
