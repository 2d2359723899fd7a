"""Permissive stand-in modules for third-party packages that cannot be installed on this machine.

The compat run executes REAL NeMo-RL source files. Those import, at module level, packages that do
not install on a CPU-only CI box (vLLM, Megatron-Bridge, NeMo-Automodel, transformers, ...). For
ONLY the names listed in STANDIN_ROOTS, and only when no real distribution provides them (this
finder sits at the END of sys.meta_path, so anything installed - torch, ray, pydantic, numpy,
wrapt, megatron-core, the vLLM engine double - always wins), an import yields a stand-in module
whose every attribute is a permissive stand-in class: subclassable, callable, usable as a
decorator, subscriptable. Nothing NeMo-RL-specific is faked: the nemo_rl files run as shipped.
Which roots were stood in is recorded (`created()`) and listed per release in docs/compat.md.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types

# Third-party roots the NeMo-RL target modules import and that have no usable wheel here.
STANDIN_ROOTS = frozenset({
    "vllm", "megatron", "nemo_automodel", "transformers", "accelerate", "datasets", "hydra", "omegaconf",
    "wandb", "mlflow", "swanlab", "tensorboard", "torchdata", "torchaudio", "torchvision", "torchcodec",
    "nemo", "nemo_gym", "modelopt", "mooncake", "sglang", "sglang_router", "transfer_queue", "tensordict",
    "flashinfer", "torch_memory_saver", "nccl", "pynvml", "nvtx", "zmq", "pybase64", "fastokens", "awscrt",
    "soundfile", "PIL", "matplotlib", "prometheus_client", "safetensors", "huggingface_hub", "tokenizers",
    "fastapi", "uvicorn", "httpx", "aiohttp", "prettytable", "pandas", "scipy", "absl", "rich", "tqdm",
    "math_verify", "latex2sympy2_extended", "sympy", "deep_ep", "cupy", "triton", "decord", "qwen_vl_utils",
    "nvidia_resiliency_ext", "zstandard", "pyarrow", "tiktoken", "jinja2", "einops", "liger_kernel",
})

# Roots provided in part by a real package here: vLLM by the engine double (tests/doubles/vllm_engine:
# LLM, AsyncLLM, SamplingParams), megatron by megatron-core when it is on the path (Bridge never is).
# Their missing submodules are stood in; every other installed root is left entirely alone.
PARTIAL_ROOTS = frozenset({"vllm", "megatron"})

_created: set[str] = set()

# The version a stand-in reports: the release's pin (COLO_SHIM_COMPAT_STANDIN_VERSIONS="transformers=5.5.0,...",
# set by the test from NeMo-RL's pyproject.toml), because NeMo-RL asserts on some of them at import
# time (v0.7 checks transformers < 5.12, torch.utils.tensorboard wants tensorboard >= 1.15).
DEFAULT_VERSIONS = {"tensorboard": "2.20.0"}


def _version(root: str) -> str:
    pins = dict(DEFAULT_VERSIONS)
    for item in os.environ.get("COLO_SHIM_COMPAT_STANDIN_VERSIONS", "").split(","):
        name, _, version = item.partition("=")
        if name.strip() and version.strip():
            pins[name.strip()] = version.strip()
    return pins.get(root, "0.0.0")


def created() -> list[str]:
    """Top-level names that were stood in in this process (real packages are never listed)."""
    return sorted(_created)


class _StandInMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _make(name, cls.__module__)

    def __getitem__(cls, item):
        return cls

    def __or__(cls, other):
        return cls

    def __ror__(cls, other):
        return cls

    def __iter__(cls):
        return iter(())

    def __len__(cls):
        return 0

    def __bool__(cls):
        return True


class StandIn(metaclass=_StandInMeta):
    """Base of every stand-in class; instances accept any use and return more stand-ins."""

    __colo_shim_compat_standin__ = True

    def __new__(cls, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]) and cls.__dict__.get("__colo_shim_leaf__"):
            return args[0]  # used as a bare decorator: keep the decorated object
        return super().__new__(cls)

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]  # decorator factory result applied to a function
        return StandIn()

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return StandIn()

    def __getitem__(self, item):
        return StandIn()

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def attribute(module: str, name: str):
    """Module-level __getattr__ of placeholder files in a partially real package."""
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    return _make(name, module)


def _make(name: str, module: str) -> type:
    return _StandInMeta(name, (StandIn,), {"__module__": module, "__qualname__": name, "__colo_shim_leaf__": True})


class _StandInModule(types.ModuleType):
    __colo_shim_compat_standin__ = True

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = _make(name, self.__name__)
        setattr(self, name, value)
        return value


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        module = _StandInModule(spec.name)
        module.__path__ = []
        module.__version__ = _version(spec.name.partition(".")[0])
        return module

    def exec_module(self, module):
        _created.add(module.__name__.partition(".")[0])
        if os.environ.get("COLO_SHIM_COMPAT_DEBUG"):
            print("compat stand-in:", module.__name__, file=sys.stderr)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        root = fullname.partition(".")[0]
        if root not in STANDIN_ROOTS:
            return None
        loaded = sys.modules.get(root)
        if root != fullname and root not in PARTIAL_ROOTS and loaded is not None \
                and not getattr(loaded, "__colo_shim_compat_standin__", False):
            return None  # an installed package probing its own optional submodule (tensorboard.compat.notf)
        return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=True)


class _Hiding(_Finder):
    """First on sys.meta_path: roots named in COLO_SHIM_COMPAT_HIDE are stood in even where installed
    (the test venv's transformers is newer than every release pins; main asserts < 5.12)."""

    def __init__(self, roots):
        self.roots = roots

    def find_spec(self, fullname, path=None, target=None):
        return super().find_spec(fullname, path, target) if fullname.partition(".")[0] in self.roots else None


def install() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
    hide = frozenset(r for r in os.environ.get("COLO_SHIM_COMPAT_HIDE", "").split(",") if r in STANDIN_ROOTS)
    if hide and not any(isinstance(f, _Hiding) for f in sys.meta_path):
        sys.meta_path.insert(0, _Hiding(hide))
