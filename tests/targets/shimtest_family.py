"""Test-only patch families over tests/targets/shimtarget, registered by the child scripts.

They exercise the registry exactly like the real families: every target records its calls in
CALLS so a test can tell the wrapper ran, and the variants declare the failure modes a real
family can hit (unsupported version, upstream fix present, drifted attribute, broken detector).
"""

from colo_shim.core.registry import Patch, Target, register

CALLS = []
MODULE = "shimtarget.sub"
ATTRIBUTES = ("Engine.step", "Engine.build", "Engine.helper", "Engine.step_async", "free", "free_async")


def _record(wrapped, instance, args, kwargs):
    CALLS.append(wrapped.__name__)
    return wrapped(*args, **kwargs)


def _explode(module):
    raise RuntimeError("detector bug")


PATCH = Patch("shimtest", "test family", tuple(
    Target(MODULE, attr, _record, distribution="shimtarget", versions=">=1.0,<2") for attr in ATTRIBUTES))
VARIANTS = {
    "shimtest_old": Patch("shimtest_old", "needs shimtarget>=2", (
        Target(MODULE, "free", _record, distribution="shimtarget", versions=">=2"),)),
    "shimtest_fixed": Patch("shimtest_fixed", "upstream fixed", (
        Target(MODULE, "free", _record, upstream_fixed=lambda m: "shimtarget has the fix"),)),
    "shimtest_drift": Patch("shimtest_drift", "attribute renamed upstream", (
        Target(MODULE, "Engine.renamed", _record),
        Target(MODULE, "Engine.optional_thing", _record, required=False))),
    "shimtest_broken": Patch("shimtest_broken", "detector raises", (
        Target(MODULE, "free", _record, upstream_fixed=_explode),)),
}


def register_all():
    register(PATCH)
    for patch in VARIANTS.values():
        register(patch)
