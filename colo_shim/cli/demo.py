"""`colo-shim demo`: the colocated-RL checkpoint cycle on this machine, without and with the shim.

train -> two cached async NVRx saves -> offload (the storage goes away) -> reload (new storage,
new values) -> save, each run in a fresh process. On a GPU the writer keeps CUDA IPC handles, so
the table shows memory still held after offload (and, on NVRx 0.6.0, a stale checkpoint). On a
CPU-only machine NVRx's shared-memory path pins nothing, so the offload step releases the writer
the upstream way (close the queue, as Megatron's maybe_finalize_async_save(terminate=True) does):
without the shim the next save then blocks forever.

That hang is reported by its cause, not by a clock: a slow machine makes a healthy save slow, not
hung. While the child saves, a watcher thread polls the NVRx writer process it started; if that
process exits while the trainer is still inside the save (blocked in `preload_q.join()`, which
nothing will ever release), the child prints what happened and exits with HANG_EXIT, and the
parent names the cause from the writer's exit code and its "Worker cache miss" traceback. The
`--timeout` is only a last resort for a stall with no detected cause, reported as such.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

MIB = 1 << 20
HANG_EXIT = 3  # the child's exit code when its NVRx writer died while the trainer waited on it


def _watch_writer(queue, what: str) -> threading.Event:
    """Exit with HANG_EXIT when the queue's persistent writer process dies during `what`; set() to stop."""
    stop = threading.Event()

    def watch():
        while not stop.wait(0.1):
            process = getattr(getattr(queue, "persistent_caller", None), "process", None)
            code = process.exitcode if process is not None else None  # a non-blocking poll
            if code is not None and not stop.is_set():
                print(json.dumps({"hang": what, "writer_exitcode": code}), flush=True)
                os._exit(HANG_EXIT)  # the main thread is stuck in preload_q.join(): nothing else can end it

    threading.Thread(target=watch, name="colo-shim-demo-watch", daemon=True).start()
    return stop


def _child(args) -> dict:
    import torch

    if args.shim:
        import colo_shim

        colo_shim.install(["nvrx", "megatron"])
    import nvidia_resiliency_ext

    from colo_shim.checkpoint import fence as shim_fence

    from colo_shim.cli import saver as cs

    cs.init_single_rank()
    gpu = torch.cuda.is_available()
    device, shm = ("cuda", False) if gpu else ("cpu", True)
    width = max(64, int((args.mib * MIB / 4 / 3) ** 0.5))
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Linear(width, width)).to(device)
    opt = torch.optim.Adam(model.parameters())

    def train():
        model(torch.randn(8, width, device=device)).square().mean().backward()
        opt.step()
        opt.zero_grad()

    params = dict(model.named_parameters())

    def state():
        out = {f"param.{n}": p.detach() for n, p in params.items()}
        for n, p in params.items():
            out.update({f"adam.{n}.{k}": opt.state[p][k] for k in ("exp_avg", "exp_avg_sq")})
        return out

    def assign(name, tensor):
        kind, rest = name.split(".", 1)
        if kind == "param":
            params[rest].data = tensor
        else:
            pname, key = rest.rsplit(".", 1)
            opt.state[params[pname]][key] = tensor

    root, q, t0 = tempfile.mkdtemp(), cs.make_queue(shm=shm), time.perf_counter()
    for step in range(2):
        train()
        cs.async_save(q, state(), f"{root}/step{step}", cached=True, shm=shm)
        cs.finalize(q)
    if args.shim:
        shim_fence.fence("demo offload")
    if not gpu:
        q.close()  # the upstream-style release on the shm path
    live = state()
    cached = sum(t.numel() * t.element_size() for t in live.values())
    reserved = torch.cuda.memory_reserved() if gpu else None
    offloaded = cs.offload(live)
    held = torch.cuda.memory_reserved() if gpu else None
    for name, t in offloaded.items():  # reload: fresh storage with the next step's values
        assign(name, (t + 1).to(device))
    if args.shim:
        shim_fence.rewarm("demo reload")
    final = state()
    print("saving after reload", flush=True)
    watching = _watch_writer(q, "save after reload")
    cs.async_save(q, final, f"{root}/after", cached=True, shm=shm)
    cs.finalize(q)
    watching.set()
    got = cs.load(f"{root}/after", final)
    equal = all(torch.equal(got[k], final[k].cpu()) for k in final)
    q.close()
    return {"device": torch.cuda.get_device_name(0) if gpu else "cpu (NVRx shm path)",
            "nvrx": getattr(nvidia_resiliency_ext, "__version__", "?"), "cached": cached, "held": held,
            "reserved_before": reserved, "equal": equal, "seconds": time.perf_counter() - t0}


def _run(shim: bool, args) -> dict:
    cmd = [sys.executable, "-m", "colo_shim.cli.demo", "--child", "--mib", str(args.mib)] + (["--shim"] if shim else [])
    env = {k: v for k, v in os.environ.items() if k != "COLO_SHIM"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                                      env.get("PYTHONPATH")]))
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    t0 = time.perf_counter()
    try:
        while True:  # NVRx writers of a child that exited keep the pipes open: end them, then read the rest
            try:
                out, err = proc.communicate(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                if proc.poll() is not None:
                    _kill_group(proc)
                elif time.perf_counter() - t0 > args.timeout:  # last resort only: no cause was detected
                    _kill_group(proc)
                    proc.communicate()
                    return {"shim": shim, "error": f"timed out after {time.perf_counter() - t0:.0f}s with no detected "
                                                    f"cause (--timeout is a safety limit, not a hang diagnosis)"}
    finally:
        _kill_group(proc)  # any writer left behind
    if proc.returncode == HANG_EXIT:
        report = next((json.loads(line) for line in reversed(out.splitlines()) if line.startswith('{"hang"')), {})
        code = report.get("writer_exitcode", "?")
        if "Worker cache miss" in err:
            cause = f"the NVRx writer died on a cache miss (exit code {code})"
        else:
            cause = f"the NVRx writer exited (exit code {code})"
        return {"shim": shim, "error": f"hang: {cause} while the trainer waited for it in preload_q.join() "
                                        f"({report.get('hang', 'save')})", "cause": "writer_died",
                "cache_miss": "Worker cache miss" in err}
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        return {"shim": shim, "error": (err.strip().splitlines() or ["failed"])[-1][:120]}
    return dict(json.loads(lines[-1]), shim=shim)


def _kill_group(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _fmt_bytes(n) -> str:
    return "-" if n is None else f"{n / MIB:.1f} MiB"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="colo-shim demo", description=__doc__.splitlines()[0])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--shim", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mib", type=float, default=None, help="size of params + Adam state (default 1024 GPU, 16 CPU)")
    p.add_argument("--timeout", type=float, default=900,
                   help="safety limit per run in seconds (a hang is detected by its cause, not by this)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    args = p.parse_args(argv)
    if args.mib is None:
        args.mib = 1024.0 if _has_gpu() else 16.0
    if args.child:
        print(json.dumps(_child(args)), flush=True)
        return 0
    rows = [_run(False, args), _run(True, args)]
    if args.json:
        print(json.dumps(rows))
        return 0
    print("run       | device | NVRx | cached | held after offload | checkpoint == live | seconds")
    print("---       | ---    | ---  | ---    | ---                | ---                | ---")
    for r in rows:
        name = "with shim" if r["shim"] else "no shim  "
        if "error" in r:
            print(f"{name} | - | - | - | - | no: {r['error']} | -")
        else:
            print(f"{name} | {r['device']} | {r['nvrx']} | {_fmt_bytes(r['cached'])} | {_fmt_bytes(r['held'])} | "
                  f"{'yes' if r['equal'] else 'NO (stale)'} | {r['seconds']:.2f}")
    return 0


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


if __name__ == "__main__":
    sys.exit(main())
