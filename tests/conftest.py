import os
import sys

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
