"""Compat run only: puts the stand-in finder (compat_standins.py) into every interpreter of a run.

It is reached as the "next" sitecustomize that colo-shim's own bootstrap chains (the bootstrap
directory comes first on PYTHONPATH), so Ray actors and spawned children get it too.
"""

import compat_standins

compat_standins.install()
