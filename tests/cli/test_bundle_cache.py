"""`bundle.cached(root)` raced by real processes, the way ranks that start `colo-shim run` at the
same moment on one node (srun, torchrun) race for the one cached bundle.

Each process is a fresh spawned interpreter; a Barrier releases them together, so no sleeps decide
who overlaps whom. In the lockstep variant each process also waits, after building its own copy
and before renaming it, until every process has built one: all but one rename onto a name that
already exists, so the losers' path is exercised every run, not only when timing happens to allow.
"""

import multiprocessing
import os
import subprocess
import sys
import traceback

import pytest

N = 4
TIMEOUT = 120


def _race(index, root, start, built, results):
    """One rank: wait for the others, call cached(root), report (index, path, builds) or a traceback."""
    try:
        from colo_shim.cli import bundle

        builds = []
        real = bundle.bundle

        def counted(dest):
            out = real(dest)
            builds.append(dest)
            if built is not None:  # lockstep: nobody renames before everybody has built
                built.wait(TIMEOUT)
            return out

        bundle.bundle = counted  # cached() looks bundle() up in its module at call time
        if start is not None:
            start.wait(TIMEOUT)
        path = bundle.cached(root)
        results.put((index, "ok", path, len(builds)))
    except BaseException:
        results.put((index, "error", traceback.format_exc(), None))


def _run_ranks(root, n, *, lockstep):
    """Start n spawned ranks on root, released together; their reports by index."""
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(n) if n > 1 else None
    built = ctx.Barrier(n) if lockstep else None
    results = ctx.Queue()
    procs = [ctx.Process(target=_race, args=(i, root, start, built, results)) for i in range(n)]
    for p in procs:
        p.start()
    try:
        reports = {}
        for _ in range(n):
            index, status, value, builds = results.get(timeout=TIMEOUT)
            reports[index] = (status, value, builds)
    finally:
        for p in procs:
            p.join(TIMEOUT)
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in procs] == [0] * n
    return reports


def _fingerprint(path):
    """Identity of a built bundle: a rebuild renames a new directory in, changing inode and mtime."""
    def stat(p):
        st = os.stat(p)
        return st.st_ino, st.st_mtime_ns

    return stat(path), stat(os.path.join(path, "sitecustomize.py")), stat(os.path.join(path, "colo_shim"))


@pytest.mark.parametrize("lockstep", [True, False], ids=["lockstep", "released-together"])
def test_ranks_racing_for_the_cached_bundle_share_one_complete_copy(tmp_path, lockstep):
    root = str(tmp_path / "cache")  # not there yet: the ranks also race to create it
    reports = _run_ranks(root, N, lockstep=lockstep)

    errors = {i: v for i, (s, v, _) in reports.items() if s != "ok"}
    assert not errors, "\n".join(f"--- rank {i}\n{tb}" for i, tb in errors.items())
    paths = {v for _, v, _ in reports.values()}
    assert len(paths) == 1, paths
    (path,) = paths
    assert os.path.dirname(path) == root and os.path.basename(path).startswith("bundle-"), path
    if lockstep:  # every rank built its own copy, so N-1 of them lost the rename
        assert [b for _, _, b in reports.values()] == [1] * N

    # nothing but the bundle itself: each loser's copy (and the winner's temp name) is gone
    assert os.listdir(root) == [os.path.basename(path)], os.listdir(root)
    assert not [f for _, _, files in os.walk(path) for f in files if f.endswith((".so", ".pyd"))]

    # complete: an interpreter without site-packages or PYTHONPATH, given only the bundle
    # (and its vendor folder, which the bundle's sitecustomize appends when active), imports all three
    check = ("import sys; sys.path[:0] = sys.argv[1:]\n"
             "import colo_shim, colo_shim.cli.bundle, wrapt, packaging.version\n"
             "print(colo_shim.__file__, wrapt.__file__, packaging.__file__, sep='\\n')")
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", check, path, os.path.join(path, "_colo_shim_vendor")],
                          capture_output=True, text=True, timeout=60, cwd="/")
    assert proc.returncode == 0, proc.stderr
    files = proc.stdout.split()
    assert len(files) == 3 and all(f.startswith(path + os.sep) for f in files), files

    # a later start reuses it: same path, nothing rebuilt, nothing added under root
    before = _fingerprint(path)
    again = _run_ranks(root, 1, lockstep=False)
    assert again == {0: ("ok", path, 0)}, again
    assert _fingerprint(path) == before
    assert os.listdir(root) == [os.path.basename(path)]
