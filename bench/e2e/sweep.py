"""The size sweep of issue 34: colo-shim vs synchronous saves vs no saves at several trainer sizes.

    python bench/e2e/sweep.py plan [--sizes full,1.5b,2.1b] [--budget-s 560]   # runs, seconds, host GiB, calls
    python bench/e2e/sweep.py specs --call N [...]                              # run.py's --runs for call N
    bash bench/e2e/device.sh sweep --call N                                     # on the GPU machine

Per size two runs, in one device call (ratios pair rows of one call): `shim` with its first K
steps saving nothing (`nosave=K`: the no-save row and the save row come from the same processes,
one engine start instead of two) and `sync_save` (NeMo-RL v0.3-v0.7's workaround); at the first
size also `nosave` (no colo-shim, no checkpoints). `--group mode` packs all shim runs, then all
synchronous ones, into fewer calls; their ratios then pair rows of one machine and boot.
Both with `verify=off` (one checkpoint kept on /dev/shm, none read back: a verifier's wait would
hide part of the write in flight, and three read-backs would not fit the host at the larger sizes)
and --val-period 0 (every step after the first saving one has a save in flight).

A device call has at most 600 s, vLLM's start included per run, so the plan packs the pairs into
calls by an estimate of each run (`estimate`, from the H200 rows of calls 17-22 at 1.07 B, scaled by
parameters where the work is proportional to the state) and says which sizes the host holds: the
H200 machine has 125 GiB of RAM and the node's use grows ~47 GiB per billion parameters with
colo-shim and checkpoints on /dev/shm (mirrors 14 B/param, the writer's host copy ~17.5, the
checkpoint 14; `host_gib`). The estimates plan the calls; the tables come from what the runs record.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path[:0] = [p for p in (os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),)
                if p not in sys.path]
from bench.e2e.driver import SIZES, params_of  # noqa: E402

BASE = params_of("full")  # 1.07 B: the size every H200 figure below was measured at
HOST_GIB, HOST_MARGIN_GIB = 125.0, 12.0  # the H200 machine's MemTotal; kept free (page cache, the kernel)
# seconds at 1.07 B (H200, vLLM 0.25.1, NVRx 0.7.0, /dev/shm; bench/e2e/results/e2e_h200.json)
START_S = 45.0  # engine 22-27 s + trainer 12-13 s + driver and teardown (calls 19-20, warm machine)
COLD_S = 40.0  # the first run on a fresh machine: engine start 64-71 s (calls 17, 22)
STEP_S = {  # per step, x (params / 1.07 B)
    "nosave_shim": 3.4,  # call 19 shim steps minus save_checkpoint (step 4: 4.8 s, of which save 1.4 s)
    "shim": 12.4,  # a save in flight: the next save's finalize waits for the 14 GiB write (steps 2-3: 12.4 s)
    "sync_save": 25.6,  # call 19: 25.56 s (offload 9.0, train 2.8, save 10-12)
    "nosave": 14.5,  # sync_save less its save
}
FIRST_S = {"nosave_shim": 6.0, "shim": 6.0, "sync_save": 35.5, "nosave": 15.0}  # step 1 (call 19), x size
FIRST_SAVE_S = (9.0, 5.0)  # a run's first async save: NVRx's worker start + its D2H, x size (call 19: 13.9 s)
# host GiB while training = 3.9 + per-GiB x params / 1.07 B (call 19: shim 37.3, sync 29.7), plus the
# checkpoint on /dev/shm (14 GiB x size) where the run saves
HOST_PER = {"shim": 33.4, "nosave_shim": 14.6, "sync_save": 25.8, "nosave": 6.5}


def scale(size: str) -> float:
    return params_of(size) / BASE


def units(sizes: list, shim_steps: int, nosave: int, sync_steps: int, group: str, plain_nosave: bool) -> list:
    """Runs as (spec, mode, size, no-save steps, steps), in units that must share a call: a size's pair
    (group "size": same-call ratios), or each run alone (group "mode": all shim runs, then all
    synchronous ones; ratios then pair rows of one machine and boot, report.py --pair machine)."""
    at = {z: "" if z == "full" else f":size={z}" for z in sizes}  # run.py's --size is "full": the names runs had
    shim = [(f"shim@0.7.0:{nosave + shim_steps}{at[z]}:nosave={nosave}:verify=off", "shim", z, nosave, shim_steps)
            for z in sizes]
    sync = [(f"sync_save@0.7.0:{sync_steps}{at[z]}:verify=off", "sync_save", z, 0, sync_steps) for z in sizes]
    plain = [(f"nosave@0.7.0:{sync_steps}{at[sizes[0]]}", "nosave", sizes[0], 0, sync_steps)] if plain_nosave else []
    if group == "size":
        return [[a, b] + (plain if i == 0 else []) for i, (a, b) in enumerate(zip(shim, sync))]
    return [[r] for r in shim + sync + plain]


def estimate(mode: str, size: str, nosave: int, steps: int, cold: bool = False) -> float:
    """Seconds a run takes on the H200, by the figures above."""
    x = scale(size)
    total = START_S + (COLD_S if cold else 0.0)
    if mode == "shim" and nosave:
        total += FIRST_S["nosave_shim"] * x + (nosave - 1) * STEP_S["nosave_shim"] * x
        total += STEP_S["nosave_shim"] * x + FIRST_SAVE_S[0] + FIRST_SAVE_S[1] * x  # the first saving step
        return total + (steps - 1) * STEP_S["shim"] * x
    return total + FIRST_S[mode] * x + (steps - 1) * STEP_S[mode] * x


def host_gib(mode: str, size: str) -> float:
    """The node's use while training, by the figures above (checkpoints on /dev/shm, one kept)."""
    ckpt = 14 * params_of(size) / 2**30 if mode in ("shim", "sync_save") else 0.0
    return 3.9 + HOST_PER[mode] * scale(size) + ckpt


def plan(sizes: list, budget_s: float, shim_steps: int, nosave: int, sync_steps: int, group: str = "size",
         plain_nosave: bool = True) -> tuple:
    """Calls of at most budget_s seconds (each call's first run starts vLLM cold), in the order given;
    sizes the host cannot hold are left out, with the reason."""
    skipped = [(z, f"host: ~{host_gib('shim', z):.0f} GiB of {HOST_GIB:.0f} GiB while training (margin "
                   f"{HOST_MARGIN_GIB:.0f} GiB)") for z in sizes if host_gib("shim", z) > HOST_GIB - HOST_MARGIN_GIB]
    sizes = [z for z in sizes if z not in {z for z, _ in skipped}]
    calls = []
    for unit in units(sizes, shim_steps, nosave, sync_steps, group, plain_nosave):
        for fresh in (False, True):
            cold = fresh or not calls
            cost = [estimate(m, z, k, n, cold=cold and i == 0) for i, (_, m, z, k, n) in enumerate(unit)]
            if cold or sum(c for _, c in calls[-1]) + sum(cost) <= budget_s:
                break
        if cold:
            calls.append([])
        calls[-1] += [(f"{spec}:limit={int(c * 1.4)}", c) for (spec, *_), c in zip(unit, cost)]
    return [{"runs": call, "s": round(sum(c for _, c in call))} for call in calls], skipped


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("plan", "specs"))
    ap.add_argument("--sizes", default="full,1.5b,2.1b")
    ap.add_argument("--budget-s", type=float, default=560)
    ap.add_argument("--shim-steps", type=int, default=4, help="saving steps of the shim run (the first schedules)")
    ap.add_argument("--nosave", type=int, default=3, help="no-save steps before them, same processes")
    ap.add_argument("--sync-steps", type=int, default=4)
    ap.add_argument("--call", type=int, default=1)
    ap.add_argument("--group", default="size", choices=("size", "mode"),
                    help="size: each size's pair in one call (same-call ratios); mode: fewer calls, ratios by machine")
    ap.add_argument("--plain-nosave", type=int, default=1, help="1: also nosave@0.7.0 (no colo-shim) at the first size")
    args = ap.parse_args(argv)
    sizes = args.sizes.split(",")
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        raise SystemExit(f"unknown sizes {unknown}: bench/e2e/driver.py SIZES has {sorted(SIZES)}")
    calls, skipped = plan(sizes, args.budget_s, args.shim_steps, args.nosave, args.sync_steps, args.group,
                          bool(args.plain_nosave))
    if args.what == "specs":
        print(",".join(spec for spec, _ in calls[args.call - 1]["runs"]))
        return 0
    for size in sizes:
        print(f"{size}: {params_of(size) / 1e9:.2f} B params, offloaded ~{18 * params_of(size) / 2**30:.1f} GiB, "
              + ", ".join(f"{m} host ~{host_gib(m, size):.0f} GiB" for m in ("shim", "sync_save", "nosave_shim")))
    for size, why in skipped:
        print(f"left out: {size}: {why}")
    for i, call in enumerate(calls, 1):
        print(f"call {i}: ~{call['s']} s of {args.budget_s:.0f}")
        for spec, s in call["runs"]:
            print(f"  {s:6.0f} s  {spec}")
        print(f"  VLLM_BUNDLE=.vllm-bundle-0251 bash bench/e2e/device.sh sweep --call {i} --sizes {args.sizes} "
              f"--shim-steps {args.shim_steps} --nosave {args.nosave} --sync-steps {args.sync_steps} "
              f"--group {args.group} --plain-nosave {args.plain_nosave}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
