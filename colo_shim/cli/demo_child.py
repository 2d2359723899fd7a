"""The process `colo-shim demo` starts twice: one colocated checkpoint cycle on real NVRx.

train -> two cached async saves -> offload (the storage goes away) -> reload (new storage, new
values) -> save, then the last checkpoint is read back and compared with the live state. A fresh
process per run, because the shim's patches and NVRx's writer must not leak from one run into the
other. Each phase is announced on stderr (PHASE prefix) so the parent can show progress while a
slow machine works, and the result is the last stdout line, as JSON.

A hang is reported by its cause, not by a clock: a watcher thread polls the NVRx writer process;
if it exits while the trainer is still inside the save (blocked in `preload_q.join()`, which
nothing will ever release), the child prints what happened and exits with HANG_EXIT.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time

MIB = 1 << 20
HANG_EXIT = 3  # the child's exit code when its NVRx writer died while the trainer waited on it
PHASE = "colo-shim demo phase: "


def nvrx_version() -> str | None:
    """The NVRx that `import nvidia_resiliency_ext` finds, without importing it: 0.4.1 has no
    __version__, and metadata.version() may answer for another copy (site-packages) than the one
    on PYTHONPATH, so the dist-info is read beside the package that would be imported."""
    import importlib.metadata
    import importlib.util

    spec = importlib.util.find_spec("nvidia_resiliency_ext")
    if spec is None or not spec.submodule_search_locations:
        return None
    where = os.path.dirname(list(spec.submodule_search_locations)[0])
    for dist in importlib.metadata.distributions(path=[where]):
        if (dist.metadata["Name"] or "").lower().replace("_", "-") == "nvidia-resiliency-ext":
            return dist.version
    return None


def _phase(text: str) -> None:
    print(PHASE + text, file=sys.stderr, flush=True)


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


def cycle(mib: float, shim: bool) -> dict:
    _phase("importing torch and NVRx")
    import torch

    if shim:
        import colo_shim

        colo_shim.install(["nvrx", "megatron"])
    import nvidia_resiliency_ext

    from colo_shim.checkpoint import fence as shim_fence
    from colo_shim.cli import saver as cs

    cs.init_single_rank()
    gpu = torch.cuda.is_available()
    device, shm = ("cuda", False) if gpu else ("cpu", True)
    width = max(64, int((mib * MIB / 4 / 3) ** 0.5))
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Linear(width, width)).to(device)
    opt = torch.optim.Adam(model.parameters())
    params = dict(model.named_parameters())

    def train():
        model(torch.randn(8, width, device=device)).square().mean().backward()
        opt.step()
        opt.zero_grad()

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
        _phase(f"train step {step + 1} and its cached async save")
        train()
        cs.async_save(q, state(), f"{root}/step{step}", cached=True, shm=shm)
        cs.finalize(q)
    _phase("offload: the training state leaves the " + device)
    if shim:
        shim_fence.fence("demo offload")
    if not gpu:
        q.close()  # the upstream-style release on the shm path
    live = state()
    cached = sum(t.numel() * t.element_size() for t in live.values())
    reserved = torch.cuda.memory_reserved() if gpu else None
    offloaded = cs.offload(live)
    held = torch.cuda.memory_reserved() if gpu else None
    _phase("reload with the next step's values, then save again")
    for name, t in offloaded.items():  # fresh storage with the next step's values
        assign(name, (t + 1).to(device))
    if shim:
        shim_fence.rewarm("demo reload")
    final = state()
    watching = _watch_writer(q, "save after reload")
    cs.async_save(q, final, f"{root}/after", cached=True, shm=shm)
    cs.finalize(q)
    watching.set()
    _phase("reading the checkpoint back and comparing it with the live state")
    got = cs.load(f"{root}/after", final)
    equal = all(torch.equal(got[k], final[k].cpu()) for k in final)
    q.close()
    return {"device": torch.cuda.get_device_name(0) if gpu else "cpu (NVRx shm path)",
            "nvrx": getattr(nvidia_resiliency_ext, "__version__", None) or nvrx_version() or "unknown",
            "cached": cached, "held": held,
            "reserved_before": reserved, "equal": equal, "seconds": time.perf_counter() - t0}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m colo_shim.cli.demo_child", description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=float, required=True, help="size of the parameters + Adam state in MiB")
    p.add_argument("--shim", action="store_true", help="install the nvrx and megatron families first")
    args = p.parse_args(argv)
    print(json.dumps(cycle(args.mib, args.shim)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
