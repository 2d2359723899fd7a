"""Declares the test family before the start-up install runs, as a real family module would be.

Activation happens during interpreter start-up, before any test code can register anything, so
the test family must already be known when colo_shim's install reads the registry. This finder
registers it the moment colo_shim.registry finishes loading and changes nothing else; it is put
in place by whatever runs before the activator on each path (a chained user sitecustomize, an
earlier .pth line, the test code before loading the vLLM plugin).
"""

import importlib.machinery
import sys


class _RegistryFinder:
    def find_spec(self, name, path=None, target=None):
        if name != "colo_shim.registry":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            import shimtest_family

            module.register(shimtest_family.PATCH)

        spec.loader.exec_module = exec_module
        return spec


def install():
    if not any(isinstance(f, _RegistryFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegistryFinder())
