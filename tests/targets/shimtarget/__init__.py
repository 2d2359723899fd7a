"""Test-only target package for the registry's ordering tests (no upstream counterpart)."""

LOADED = True
