"""`colo-shim demo`: the colocated-RL checkpoint cycle on this machine, without and with the shim.

train -> two cached async NVRx saves -> offload (the storage goes away) -> reload (new storage,
new values) -> save, each run in a fresh process. On a GPU the writer keeps CUDA IPC handles, so
the table shows memory still held after offload (and, on NVRx 0.6.0, a stale checkpoint). On a
CPU-only machine NVRx's shared-memory path pins nothing, so the offload step releases the writer
the upstream way (close the queue, as Megatron's maybe_finalize_async_save(terminate=True) does):
without the shim the next save then blocks forever, shown as a timeout.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

MIB = 1 << 20


def _child(args) -> dict:
    import torch

    if args.shim:
        import colo_shim

        colo_shim.install(["nvrx", "megatron"])
    import nvidia_resiliency_ext

    from colo_shim.fence import fence as shim_fence

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
    cs.async_save(q, final, f"{root}/after", cached=True, shm=shm)
    cs.finalize(q)
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
        out, err = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        note = "hung in the save after reload" if "saving after reload" in out else "timed out"
        if "Worker cache miss" in err:
            note += " (the fresh NVRx worker died on a cache miss)"
        return {"shim": shim, "error": f"{note}; killed after {time.perf_counter() - t0:.0f}s"}
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # any writer left behind
        except ProcessLookupError:
            pass
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        return {"shim": shim, "error": (err.strip().splitlines() or ["failed"])[-1][:120]}
    return dict(json.loads(lines[-1]), shim=shim)


def _fmt_bytes(n) -> str:
    return "-" if n is None else f"{n / MIB:.1f} MiB"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="colo-shim demo", description=__doc__.splitlines()[0])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--shim", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mib", type=float, default=None, help="size of params + Adam state (default 1024 GPU, 16 CPU)")
    p.add_argument("--timeout", type=float, default=120, help="seconds before a run counts as hung")
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
