"""A test run leaves the machine's temp directory as it found it (issue 35 item 3).

The run's own directory (tests/conftest.py) catches whatever a test or its children write to the
temp directory; run_python and the NVRx scenario runner also give each child a TMPDIR of its own,
removed when it ends. Checked by running, in a fresh pytest under xdist as CI runs it, one test of
each kind that left something behind: a scenario whose NVRx worker is killed (pymp-*) and whose
next writer saves checkpoints (tmp*), and a test with a tmp_path (pytest-of-<user>).
"""

import os
import subprocess

from harness.procs import PYTHON, REPO, clean_env

NODES = (
    "tests/checkpoint/test_fence_errors.py::"
    "test_worker_killed_while_the_fence_waits_raises_and_the_next_save_gets_a_fresh_worker[0.7.0]",
    "tests/cli/test_doctor.py::test_from_a_missing_or_empty_directory_says_what_to_set",
)


def test_a_run_of_representative_tests_leaves_the_temp_directory_as_it_found_it(short_tmpdir):
    proc = subprocess.run([PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "1", *NODES],
                          env=clean_env(TMPDIR=short_tmpdir), cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "2 passed" in proc.stdout, proc.stdout + proc.stderr
    assert sorted(os.listdir(short_tmpdir)) == []
