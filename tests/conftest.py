"""What every test shares: the import paths, and one temp directory per run that nothing outlives.

A test run starts hundreds of interpreters (NVRx writers killed mid-write leave multiprocessing's
pymp-* behind, scenarios keep their checkpoint directories, Ray and torch make their own), and a
run that leaves them in the machine's temp directory fills it. So the run points TMPDIR (and
tempfile's cached answer) at one fresh directory, which every child inherits and pytest's own
tmp_path lives in, and removes it at the end; under xdist the controller does this before the
workers start, and they inherit it. The name is short on purpose: AF_UNIX socket paths (a
multiprocessing listener, Ray's sockets) must fit 107 bytes under it.
"""

import os
import shutil
import sys
import tempfile

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
# harness/ (shared with bench/) under the repo root; what several rooms of the tests share in support/
sys.path[:0] = [p for p in (os.path.dirname(TESTS), os.path.join(TESTS, "support")) if p not in sys.path]


@pytest.fixture(autouse=True, scope="session")
def _ledger_dir(tmp_path_factory):
    """Every process a test starts keeps its node ledger (colo_shim/core/ledger.py) in a directory of
    the session's, never in /dev/shm beside other users' jobs; harness/procs.clean_env passes it on."""
    os.environ["COLO_SHIM_LEDGER_DIR"] = str(tmp_path_factory.mktemp("ledgers"))
    yield


def pytest_configure(config):
    if hasattr(config, "workerinput"):  # an xdist worker: TMPDIR is the controller's run directory
        return
    run_dir = tempfile.mkdtemp(prefix="cs-")
    config._colo_shim_tmp = (run_dir, os.environ.get("TMPDIR"), tempfile.tempdir)
    os.environ["TMPDIR"] = tempfile.tempdir = run_dir


def pytest_unconfigure(config):
    saved = getattr(config, "_colo_shim_tmp", None)
    if saved is None:
        return
    run_dir, env, cached = saved
    shutil.rmtree(run_dir, ignore_errors=True)
    if env is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = env
    tempfile.tempdir = cached


@pytest.fixture
def short_tmpdir():
    """A fresh, empty directory to hand a child as TMPDIR and list afterwards. Not under tmp_path:
    that path is so long that a multiprocessing listener under it passes the 107-byte socket limit."""
    path = tempfile.mkdtemp(prefix="t")
    yield path
    shutil.rmtree(path, ignore_errors=True)
