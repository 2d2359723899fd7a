"""Declares the test family before the start-up install runs, as a real family module would be.

Activation happens during interpreter start-up, before any test code can register anything, so
the test family must already be known when colo_shim arms its install (colo_shim.core.families names
the families and the packages whose import triggers them) and when the install reads the
registry. This finder adds it the moment each of those modules finishes loading, nothing else; it is put
in place by whatever runs before the activator on each path (a chained user sitecustomize, an
earlier .pth line, the test code before loading the vLLM plugin).
"""

import importlib.machinery
import sys


def _declare(module):
    """colo_shim.core.families: make 'shimtest' a known family whose first import is shimtarget."""
    module.FAMILIES = module.FAMILIES + ("shimtest",)
    module.TRIGGERS = dict(module.TRIGGERS, shimtest=("shimtarget",))


def _register(module):
    import shimtest_family

    module.register(shimtest_family.PATCH)


_AFTER_LOAD = {"colo_shim.core.families": _declare, "colo_shim.core.registry": _register}


class _RegistryFinder:
    def find_spec(self, name, path=None, target=None):
        if name not in _AFTER_LOAD:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _AFTER_LOAD[name](module)

        spec.loader.exec_module = exec_module
        return spec


def install():
    if not any(isinstance(f, _RegistryFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegistryFinder())
