"""Interpreters and venvs the activation tests and benchmarks run in, built once and cached.

Each activation path is about what a *fresh* environment does at start-up, so the tests need
real venvs: one with the built wheel installed (the .pth/.start activator and the vLLM entry
point), plain ones without colo-shim or wrapt (the bundle and Ray paths), and wrapt 1.x/2.x
trees for every supported Python. Creating them costs tens of seconds, so they live under
COLO_SHIM_TEST_CACHE (default .test-cache/ in the repository: kept between runs, and out of the
temp directory, which a test run leaves as it found it) and are reused; the wheel itself is rebuilt
and reinstalled whenever the sources change.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig

from harness.procs import REPO, clean_env, succeeded

PROBE_DIR = os.path.join(REPO, "tests", "targets")  # activation_probe, the tests' own family

VERSIONS = ("3.10", "3.12", "3.13")
WRAPT = {"1": "1.17.3", "2": "2.5.2"}
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
HOST_SITE = sysconfig.get_paths()["purelib"]  # the test runner's site-packages (ray lives there)


def cache_root() -> str:
    root = os.environ.get("COLO_SHIM_TEST_CACHE") or os.path.join(REPO, ".test-cache")
    os.makedirs(root, exist_ok=True)
    return root


def _sh(cmd, timeout=300, **kw):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


@functools.lru_cache(maxsize=None)
def base_python(version: str = "3.12") -> str | None:
    """A non-venv interpreter of that version: COLO_SHIM_TEST_PY310-style override, pyenv, PATH."""
    candidates = [os.environ.get("COLO_SHIM_TEST_PY" + version.replace(".", ""))]
    roots = [os.environ.get("PYENV_ROOT"), os.path.expanduser("~/.pyenv"), "/root/.pyenv"]
    for root in filter(None, roots):
        candidates += sorted(glob.glob(os.path.join(root, "versions", f"{version}.*", "bin", f"python{version}")),
                             reverse=True)
    candidates.append(shutil.which(f"python{version}"))
    for candidate in filter(None, candidates):
        try:
            code = "import sys; print('%d.%d' % sys.version_info[:2]); print(sys._base_executable)"
            out = _sh([candidate, "-c", code], timeout=30).stdout.split()
        except (OSError, RuntimeError, subprocess.TimeoutExpired):
            continue
        if out[0] == version:
            return out[1]  # the base interpreter even when the candidate is a venv's python
    return None


def require_python(version: str) -> str:
    import pytest

    python = base_python(version)
    if python is None:
        pytest.skip(f"no Python {version} found (set COLO_SHIM_TEST_PY{version.replace('.', '')})")
    return python


def venv_python(venv: str) -> str:
    return os.path.join(venv, "bin", "python")


def site_packages(venv: str) -> str:
    out = _sh([venv_python(venv), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], timeout=60)
    return out.stdout.strip()


def _fresh_venv(name: str, build) -> str:
    """Create venv `name` with build(venv) unless a complete one is cached."""
    path = os.path.join(cache_root(), name)
    if os.path.isfile(os.path.join(path, ".complete")):
        return path
    shutil.rmtree(path, ignore_errors=True)
    _sh([require_python("3.12"), "-m", "venv", "--without-pip", path], timeout=120)
    build(path)
    open(os.path.join(path, ".complete"), "w").close()
    return path


def _sources_digest() -> str:
    digest = hashlib.sha256()
    for top in ("colo_shim", "activator"):
        for folder, dirs, files in sorted(os.walk(os.path.join(REPO, top))):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                if name.endswith((".py", ".pth", ".start")):
                    with open(os.path.join(folder, name), "rb") as fh:
                        digest.update(name.encode() + fh.read())
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as fh:
        digest.update(fh.read())
    return digest.hexdigest()[:16]


def build_wheel() -> str:
    """Build the wheel from a copy of the tracked layout (the build must not write into the repo)."""
    out = os.path.join(cache_root(), "wheels", _sources_digest())
    found = [f for f in os.listdir(out) if f.endswith(".whl")] if os.path.isdir(out) else []
    if found:
        return os.path.join(out, found[0])
    src = os.path.join(cache_root(), "wheel-src")
    shutil.rmtree(src, ignore_errors=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for top in ("colo_shim", "activator"):
        shutil.copytree(os.path.join(REPO, top), os.path.join(src, top), ignore=ignore)
    shutil.copy2(os.path.join(REPO, "pyproject.toml"), src)
    readme = os.path.join(REPO, "README.md")
    if os.path.isfile(readme):
        shutil.copy2(readme, src)
    else:  # pyproject names README.md; the lead writes it, the wheel's code does not depend on it
        with open(os.path.join(src, "README.md"), "w") as fh:
            fh.write("colo-shim\n")
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    _sh(PIP + ["wheel", "--no-deps", "-w", tmp, src], timeout=300)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return os.path.join(out, [f for f in os.listdir(out) if f.endswith(".whl")][0])


PROBE_PTH = "00_colo_shim_test_probe.pth"


def wheel_venv(name: str = "venv-wheel-312", probe: bool = True) -> str:
    """A venv with wrapt + packaging from PyPI and the current wheel installed by pip.

    probe: add a .pth (sorted before colo_shim.pth) that, only when COLO_SHIM_TEST_PROBE=1,
    declares the test family before the activator runs; the benchmarks leave it out.
    """
    def build(venv):
        _sh(PIP + ["--python", venv_python(venv), "install", f"wrapt=={WRAPT['2']}", "packaging"], timeout=300)

    venv = _fresh_venv(name, build)
    wheel = build_wheel()
    stamp = os.path.join(venv, ".wheel")
    if not os.path.isfile(stamp) or open(stamp).read() != wheel:
        _sh(PIP + ["--python", venv_python(venv), "install", "--no-deps", "--force-reinstall", wheel], timeout=300)
        with open(stamp, "w") as fh:
            fh.write(wheel)
    pth = os.path.join(site_packages(venv), PROBE_PTH)
    if probe and not os.path.isfile(pth):
        with open(pth, "w") as fh:
            fh.write(f"{PROBE_DIR}\nimport os; os.environ.get('COLO_SHIM_TEST_PROBE') == '1' and "
                     "__import__('activation_probe').install()\n")
    return venv


def plain_venv() -> str:
    """A venv with neither colo-shim nor wrapt: what a NeMo-RL actor venv looks like to us."""
    return _fresh_venv("venv-plain-312", lambda venv: None)


def ray_venv() -> str:
    """A second venv that can run a Ray worker (ray and its deps via a path line) but has no colo_shim."""
    def build(venv):
        with open(os.path.join(site_packages(venv), "host_ray.pth"), "w") as fh:
            fh.write(HOST_SITE + "\n")

    tag = hashlib.sha256(HOST_SITE.encode()).hexdigest()[:8]  # the path line names this runner's env
    return _fresh_venv(f"venv-ray-312-{tag}", build)


def wrapt_tree(python: str, wrapt_major: str) -> str:
    """wrapt (C extension wheel) + packaging for one Python, installed with --target."""
    version = WRAPT[wrapt_major]
    path = os.path.join(cache_root(), f"tree-py{python}-wrapt{version}")
    if os.path.isfile(os.path.join(path, ".complete")):
        return path
    shutil.rmtree(path, ignore_errors=True)
    _sh(PIP + ["install", "--target", path, "--python-version", python, "--only-binary=:all:",
               "--implementation", "cp", f"wrapt=={version}", "packaging"], timeout=300)
    open(os.path.join(path, ".complete"), "w").close()
    return path


def run_in(python: str, script_or_code: str, *, env=None, args=(), timeout: float = 120, check: bool = True,
           cwd: str = "/"):
    """Run in an interpreter WITHOUT the repo on PYTHONPATH: what it imports comes from its own env.

    cwd defaults to / so that the repo never ends up on sys.path through the working directory.
    """
    full_env = clean_env(**(env or {}))
    script = script_or_code.endswith(".py")
    cmd = [python, script_or_code, *args] if script else [python, "-c", script_or_code, *args]
    proc = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    return succeeded(proc) if check else proc
