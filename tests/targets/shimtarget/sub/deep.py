"""Imported before its parent finishes being patched, for the submodule-first ordering."""

from shimtarget.sub import Engine  # noqa: F401
