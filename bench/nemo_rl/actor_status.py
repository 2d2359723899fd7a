#!/usr/bin/env python3
"""Every named Ray actor's colo-shim state, read while main's job runs (issue 33 run b's proof that COLO_SHIM reached
each actor). main kills its actors with ray.kill, so their at-exit status files never get written; instead this
second Ray driver asks each actor, through Ray's own __ray_call__, for its pid, its COLO_SHIM and, where colo-shim is
loaded there, colo_shim.status(). It polls until the job's driver is gone and keeps the latest answer per actor.

    python3 actor_status.py OUT.json DRIVER_PID [--every 10]
"""
import json
import os
import sys
import time


def probe(_actor):
    import os
    import sys

    shim = sys.modules.get("colo_shim")
    out = {"pid": os.getpid(), "COLO_SHIM": os.environ.get("COLO_SHIM"), "colo_shim_loaded": shim is not None}
    if shim is not None:
        try:
            out["status"] = shim.status()
        except Exception as exc:  # the probe must never raise into main's actor
            out["status_error"] = f"{type(exc).__name__}: {exc}"
    return out


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def main() -> None:
    out, driver = sys.argv[1], int(sys.argv[2])
    every = float(sys.argv[4]) if len(sys.argv) > 4 else 10.0
    import ray

    ray.init(address="auto", log_to_driver=False)
    latest = {}
    while alive(driver):
        pending = {}
        for rec in ray.util.list_named_actors(all_namespaces=True):
            try:
                handle = ray.get_actor(rec["name"], namespace=rec["namespace"])
                pending[handle.__ray_call__.remote(probe)] = rec["name"]
            except Exception as exc:
                latest.setdefault(rec["name"], {"error": f"{type(exc).__name__}: {exc}"})
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=5) if pending else ([], [])
        for ref in ready:
            try:
                latest[pending[ref]] = dict(ray.get(ref), seen_at=time.time())
            except Exception as exc:
                latest.setdefault(pending[ref], {"error": f"{type(exc).__name__}: {exc}"})
        with open(out + ".tmp", "w") as fh:
            json.dump(latest, fh, default=str)
        os.replace(out + ".tmp", out)
        time.sleep(every)


if __name__ == "__main__":
    main()
