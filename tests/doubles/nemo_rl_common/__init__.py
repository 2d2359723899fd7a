"""Code shared by the NeMo-RL release doubles (tests/doubles/nemo_rl_v0_3, nemo_rl_v0_4, nemo_rl_v0_7).

Not a double of any upstream file. Each release root keeps upstream's module, class and function
names (colo-shim patches them by module + attribute); where a release's code is the same as another
release's, its module re-exports or delegates to a module here. Importable as `nemo_rl_common`
once tests/doubles is on sys.path, next to the release root.
"""

import os

_DOUBLES = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def same_as(namespace: dict, release: str) -> None:
    """Make the calling module the double of `release`'s same file, for files upstream did not change.

    The code runs in the caller's own namespace, so module names stay this release's: Ray's class
    export, the frames colo-shim reads and its targets all see e.g. `nemo_rl.experience...` of the
    release on the path, exactly as a copy of the file would, without keeping a copy.
    """
    path = os.path.join(_DOUBLES, f"nemo_rl_{release}", *namespace["__name__"].split(".")) + ".py"
    with open(path) as fh:
        exec(compile(fh.read(), path, "exec"), namespace)
