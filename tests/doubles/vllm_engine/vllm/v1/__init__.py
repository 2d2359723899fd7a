"""Test double of vLLM (see tests/doubles/README.md)."""
