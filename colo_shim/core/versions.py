"""Installed versions, read from distribution metadata so gating never imports the target."""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=None)
def installed_version(distribution: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def supported(version: str | None, specifier: str) -> bool:
    """Unknown versions pass: the attribute checks at patch time still guard against drift."""
    if not specifier or version is None:
        return True
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        return SpecifierSet(specifier).contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False
