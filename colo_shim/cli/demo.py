"""`colo-shim demo`: the colocated-RL checkpoint cycle on this machine, without and with the shim.

Each run is a fresh process (cli/demo_child.py). On a GPU the NVRx writer keeps CUDA IPC handles,
so the table shows memory still held after offload (and, on NVRx 0.6.0, a stale checkpoint). On a
CPU-only machine NVRx's shared-memory path pins nothing, so the offload step releases the writer
the upstream way (close the queue, as Megatron's maybe_finalize_async_save(terminate=True) does):
without the shim the next save then blocks forever, and the child names that hang by its cause
(the writer's exit and its "Worker cache miss" traceback); `--timeout` is only a last resort for a
stall with no detected cause, reported as such.

A first-time user waits about a minute on a small machine and then has to read a table, so the
demo says what it is doing while it runs (the child's phases, on stderr), ends with one line
saying which row is the good result, and exits 1 when the shim's row does not show the fix:
a demo that reports a failure with status 0 would pass in any script that runs it. Where the
bug cannot show (an NVRx without the cached writer, refused before anything runs; a CPU run whose
two rows are both right) it exits 2 and says so, instead of a verdict that is not true there.

Nothing the runs write may stay behind (checkpoints are gigabytes at GPU size, and a child killed
at the end leaves multiprocessing's pymp-* directories): the children get a TMPDIR of their own,
one directory the demo makes and removes however it ends, SIGINT and SIGTERM included.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from colo_shim.cli import groups
from colo_shim.cli.demo_child import HANG_EXIT, MIB, PHASE, nvrx_version
from colo_shim.core import config

NEEDS = {"torch": "pip install torch (on a machine without a GPU: the CPU build)",
         "nvidia_resiliency_ext": "pip install nvidia-resiliency-ext, or put an unpacked NVRx on PYTHONPATH "
                                  "(.ci/install_deps.sh puts 0.4.1-0.7.0 under .deps/nvrx-<version>)"}
ROWS = ("no shim", "with shim")
EXIT_NOT_HERE = 2  # this machine or this NVRx cannot show the bug: a setup answer, like a missing NVRx
CACHED_SINCE = "0.6.0"  # the cached writer (use_cached_data_structure), the part that keeps GPU memory
SHOWS = f"NVRx >= {CACHED_SINCE} on a GPU, or NVRx 0.7.0 on a CPU (its shared-memory path)"


def _say(text: str) -> None:
    print(f"colo-shim demo: {text}", file=sys.stderr, flush=True)


def _pump(stream, sink: list, label: str | None) -> None:
    """Collect a child's stream; on stderr, pass its phase lines on as they come."""
    for line in stream:
        sink.append(line)
        if label and line.startswith(PHASE):
            _say(f"{label}: {line[len(PHASE):].strip()}")


def _run(shim: bool, args, scratch: str) -> dict:
    label = ROWS[shim]
    cmd = [sys.executable, "-m", "colo_shim.cli.demo_child", "--mib", str(args.mib)] + (["--shim"] if shim else [])
    env = {k: v for k, v in os.environ.items() if k != config.ENABLE}  # the child installs the shim itself
    env["TMPDIR"] = scratch  # its checkpoints, its writers' pymp-* and torch's caches: removed with it
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    _say(f"{label}: starting a fresh process")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    out, err, t0 = [], [], time.perf_counter()
    pumps = [threading.Thread(target=_pump, args=(proc.stdout, out, None), daemon=True),
             threading.Thread(target=_pump, args=(proc.stderr, err, label), daemon=True)]
    for pump in pumps:
        pump.start()
    try:
        proc.wait(timeout=args.timeout)
    except subprocess.TimeoutExpired:  # last resort only: no cause was detected
        return {"shim": shim, "error": f"timed out after {time.perf_counter() - t0:.0f}s with no detected cause "
                                        f"(--timeout is a safety limit, not a hang diagnosis)"}
    finally:
        groups.end(proc.pid)  # NVRx writers of the child keep its pipes open: end them so the pumps see EOF
        for pump in pumps:
            pump.join(timeout=30)
    _say(f"{label}: done in {time.perf_counter() - t0:.0f} s")
    return _result(shim, proc.returncode, "".join(out), "".join(err))


def _result(shim: bool, code: int, out: str, err: str) -> dict:
    if code == HANG_EXIT:
        report = next((json.loads(line) for line in reversed(out.splitlines()) if line.startswith('{"hang"')), {})
        exit_code = report.get("writer_exitcode", "?")
        if "Worker cache miss" in err:
            cause = f"the NVRx writer died on a cache miss (exit code {exit_code})"
        else:
            cause = f"the NVRx writer exited (exit code {exit_code})"
        return {"shim": shim, "error": f"hang: {cause} while the trainer waited for it in preload_q.join() "
                                        f"({report.get('hang', 'save')})", "cause": "writer_died",
                "cache_miss": "Worker cache miss" in err}
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if code or not lines:
        last = [line for line in err.strip().splitlines() if not line.startswith(PHASE)] or ["failed"]
        return {"shim": shim, "error": last[-1][:160]}
    return dict(json.loads(lines[-1]), shim=shim)


def _fmt_bytes(n) -> str:
    return "n/a on CPU" if n is None else f"{n / MIB:.1f} MiB"


def verdict(rows: list[dict]) -> tuple[int, str]:
    """(exit status, the closing line): what the two rows mean, and whether the shim's shows the fix."""
    without, with_shim = rows
    good = "the good result is 'checkpoint == live: yes'"
    held, cached = with_shim.get("held"), with_shim.get("cached") or 0
    if "error" in with_shim or not with_shim["equal"]:
        why = with_shim.get("error") or "its checkpoint differs from the live state"
        return 1, f"FAILED: the 'with shim' row does not show the fix ({why}); {good}"
    if held is not None and held >= cached / 2:  # on a GPU the fix is also the memory the offload returns
        return 1, (f"FAILED: the 'with shim' row still holds {_fmt_bytes(held)} of {_fmt_bytes(cached)} after "
                   f"offload; {good} with little 'held after offload'")
    if "error" in without or not without["equal"]:
        bug = "a stale checkpoint" if "error" not in without else without["error"].split(" while ")[0]
        return 0, (f"{good}: the 'with shim' row shows the fix, the 'no shim' row shows the bug ({bug}) that "
                   f"colo-shim removes")
    if held is None:  # no GPU: 'held after offload' says nothing, and both rows are right
        return EXIT_NOT_HERE, (f"NOT SHOWN HERE: both rows are right on this machine ({with_shim['device']}, "
                               f"NVRx {with_shim['nvrx']}), so it cannot show what colo-shim fixes; that shows "
                               f"with {SHOWS}")
    return 0, (f"{good}: the 'with shim' row has it; the 'no shim' row has it too on this machine "
               f"(NVRx {without['nvrx']}): compare 'held after offload', the GPU memory the writer keeps")


def _table(rows: list[dict]) -> str:
    lines = ["run       | device | NVRx | cached | held after offload | checkpoint == live | seconds",
             "---       | ---    | ---  | ---    | ---                | ---                | ---"]
    for r in rows:
        name = ROWS[r["shim"]].ljust(9)
        if "error" in r:
            lines.append(f"{name} | - | - | - | - | no: {r['error']} | -")
        else:
            lines.append(f"{name} | {r['device']} | {r['nvrx']} | {_fmt_bytes(r['cached'])} | "
                         f"{_fmt_bytes(r['held'])} | {'yes' if r['equal'] else 'NO (stale)'} | {r['seconds']:.2f}")
    return "\n".join(lines)


def main(args) -> int:
    """args: --mib, --timeout, --json as parsed by the `colo-shim demo` parser (colo_shim/cli/__init__.py)."""
    missing = [name for name in NEEDS if importlib.util.find_spec(name) is None]
    if missing:
        for name in missing:
            print(f"colo-shim demo: error: {name} is not importable by {sys.executable}; {NEEDS[name]}",
                  file=sys.stderr)
        return 2
    version = nvrx_version()
    if version is not None and _older(version, CACHED_SINCE):
        print(f"colo-shim demo: not supported here: NVRx {version} has no cached checkpoint writer (NVRx >= "
              f"{CACHED_SINCE}), the part that keeps offloaded GPU memory, so there is no bug to show; it shows "
              f"with {SHOWS} (.ci/install_deps.sh puts them under .deps/nvrx-<version>)", file=sys.stderr)
        return EXIT_NOT_HERE
    if args.mib is None:
        args.mib = 1024.0 if _has_gpu() else 16.0
    _say(f"the same checkpoint cycle twice ({args.mib:g} MiB of state), each in a fresh process; about a minute")
    scratch = tempfile.mkdtemp(prefix="colo-shim-demo-")
    here = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminated) if here else None
    try:  # _run kills each child's process group on the way out, before this removes what they wrote
        rows = [_run(False, args, scratch), _run(True, args, scratch)]
    finally:
        if here:
            signal.signal(signal.SIGTERM, previous)
        shutil.rmtree(scratch, ignore_errors=True)
    code, closing = verdict(rows)
    if args.json:
        print(json.dumps(rows))
        _say(closing)
    else:
        print(_table(rows))
        print(closing)
    return code


def _terminated(signum, frame):
    """SIGTERM unwinds like Ctrl-C, so the children are ended and the scratch directory removed."""
    raise SystemExit(128 + signum)


def _older(version: str, than: str) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version) < Version(than)
    except InvalidVersion:  # a build we cannot read: let the run say what it shows
        return False


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False
