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


def calls(fn, name: str, depth: int = 3) -> bool:
    """Whether `fn` names `name` (an attribute or global it reads, as in `self.name()`), in its own code or in a
    function it wraps. A fix that reached a library between releases has no version to gate on (NeMo-RL main's
    #3322 came 83 commits after the method it calls), so what the code calls is the evidence. Decorators that keep
    no `__wrapped__` (NeMo-RL's `wrap_with_nvtx_name`) still hold the function in their closure. A name behind a
    branch that never runs still counts: read it as "the code has the call", which is how upstream adds a fix."""
    import types

    def names(code):
        yield from code.co_names
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                yield from names(const)

    def inner(f):
        yield getattr(f, "__wrapped__", None)
        for cell in getattr(f, "__closure__", None) or ():
            try:
                yield cell.cell_contents
            except ValueError:  # an empty cell
                continue

    def walk(f, left):
        f = getattr(f, "__func__", f)
        code = getattr(f, "__code__", None)
        if isinstance(code, types.CodeType) and name in set(names(code)):
            return True
        return left > 0 and any(walk(g, left - 1) for g in inner(f) if callable(g) and not isinstance(g, type))

    return fn is not None and walk(fn, depth)
