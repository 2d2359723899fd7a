"""What the harness measures inside its two actors, at the moments it needs (never by the loop).

Engine: free device memory before each wake-up and what it asks for, wake-up failures (CUDA out of
memory) and, after each sleep, the pinned host memory of this process (torch's caching host
allocator: the level-1 backup) and the level colo-shim really used. Trainer: device memory after an
offload (blocks an NVRx writer maps through CUDA IPC stay reserved there), the bytes an offload
moves, colo-shim's fence totals. Any process: colo-shim's status(), compact.

Kept apart from the work (engine.py, trainer.py, refit.py) so that what the job does and what the
harness reads about it are never confused: a probe only reads. The engine worker passes its
wake-ups and sleeps through EngineProbe; everything else is reached through the actors' `report`.
"""

from __future__ import annotations

import contextlib
import sys
import time

import torch


def pinned_bytes() -> int:
    """Pinned host memory torch's caching host allocator holds in this process (a level-1 backup)."""
    try:
        stats = torch.cuda.host_memory_stats()
        return int(stats.get("allocated_bytes.current", stats.get("reserved_bytes.current", 0)))
    except Exception:
        return 0


def shim_status(details: bool = False):
    """colo-shim's status() in this process, compact: the rows that were called (and, with details,
    the rows that report details: the driver's vllm-family decisions); None without colo-shim."""
    if "colo_shim" not in sys.modules:
        return None
    import colo_shim

    keep = ("status", "calls", "details") if details else ("status", "calls")
    return {r["target"].split(":")[-1]: {k: r.get(k) for k in keep}
            for r in colo_shim.status() if r.get("calls") or (details and r.get("details"))}


def _shim_totals() -> dict:
    """colo-shim's fence totals in this process ({} where they cannot be read)."""
    try:
        from colo_shim.checkpoint import state

        return dict(state.totals())
    except Exception:
        return {}


def _registered_bytes() -> int:
    """Host bytes colo-shim page-locked with cudaHostRegister (the retired stage release's /dev/shm
    buffers; not in host_memory_stats, which sees only torch's pinned allocator). That module is gone
    since stage was retired, so this is 0 now; the column stays so older results read the same."""
    mod = sys.modules.get("colo_shim.checkpoint.pinning")
    return int(mod.report()["pinned_bytes"]) if mod is not None else 0


class EngineProbe:
    """The engine actor's probe: it watches each wake-up from outside (free memory before it, what it
    asks for, whether it failed) and each sleep from after, so the loop's calls stay upstream's."""

    def __init__(self, worker):
        self.worker, self.awake, self.last_wake, self.sleeps = worker, True, None, []

    @contextlib.contextmanager
    def wake(self, tags):
        control = bool(tags) and all(str(t).startswith("colo_shim:") for t in tags)
        free = torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else 0
        t0 = time.perf_counter()
        rec = {"tags": tags, "free_before": free, "ok": True}
        try:
            yield
        except BaseException as exc:
            rec.update(ok=False, error=f"{type(exc).__name__}: {str(exc)[:400]}")
            if not control:
                self.awake = False
            raise
        finally:
            rec["s"] = round(time.perf_counter() - t0, 3)
            if not control:
                rec["requested"] = self._requested(tags)
                self.last_wake = rec
                if rec["ok"] and (tags is None or "kv_cache" in tags):
                    self.awake = True

    def _requested(self, tags) -> int:
        cfg = self.worker.cfg
        kv = int(cfg.get("kv_cache_memory_bytes") or 0)
        weights = int(cfg.get("weights_bytes") or 0) // int(cfg.get("ranks", 1))  # per GPU: a TP worker's part
        if tags is None:
            return kv + weights
        return (kv if "kv_cache" in tags else 0) + (weights if "weights" in tags else 0)

    def check_awake(self):
        if not self.awake:
            raise RuntimeError(f"engine not awake: the last wake_up failed ({self.last_wake})")

    def after_sleep(self):
        self.awake = False
        level = 1
        try:
            from colo_shim.discard import guard

            hist = guard.state_for(self.worker.llm).history
            if hist:
                level = hist[-1]["level"]
        except Exception:
            pass
        self.sleeps.append({"level": level, "pinned": pinned_bytes()})

    def last_sleep(self):
        return self.sleeps[-1] if self.sleeps else None

    def version(self):
        from bench.e2e.engine import fake

        if fake():
            return "fake (CPU smoke)"
        import vllm

        return vllm.__version__

    def wake_record(self):
        return self.last_wake

    def digest(self):
        return self.worker.llm.collective_rpc("e2e_weights_digest")[0]

    def digests(self):
        """Every worker's digests, in worker (= GPU, = trainer rank) order."""
        return self.worker.llm.collective_rpc("e2e_weights_digest")

    def worker_pinned(self):
        """Each worker's pinned host memory (with tensor parallelism the backups live in the workers)."""
        return self.worker.llm.collective_rpc("e2e_pinned_bytes")

    def memory(self):
        out = {"pinned": pinned_bytes()}
        if torch.cuda.is_available():
            free, total = torch.cuda.mem_get_info()
            out.update(free=free, total=total)
        return out

    def shim_report(self):
        try:
            from colo_shim.discard import guard

            return guard.state_for(self.worker.llm).report()
        except Exception as exc:
            return {"unavailable": f"{type(exc).__name__}: {exc}"}


class TrainerProbe:
    """The trainer actor's probe, read by the recorder around the calls it times."""

    def __init__(self, worker):
        self.worker = worker

    def snapshot(self) -> dict:
        """Memory of the trainer now: reserved (blocks a writer maps through CUDA IPC stay here),
        allocated, free on the device, pinned host memory, fence totals, main's finalize time."""
        worker = self.worker
        st = worker.state
        out = {"fence": _shim_totals(), "finalize_in_offload_s": worker.timings["finalize_in_offload_s"],
               "fence_in_finalize_s": worker.timings["fence_in_finalize_s"], "offload_parts": dict(worker.parts),
               "pinned": pinned_bytes(), "params": st.params, "registered": _registered_bytes()}
        if st.gpu:
            free, total = torch.cuda.mem_get_info()
            out.update(reserved=torch.cuda.memory_reserved(), allocated=torch.cuda.memory_allocated(), free=free,
                       total=total, alloc0=st.alloc0)
        else:
            out.update(reserved=0, allocated=0, free=0, total=0, alloc0=0)
        q = worker.async_calls_queue
        out["pending_saves"] = q.get_num_unfinalized_calls() if q is not None else 0
        return out

    def state_bytes(self) -> int:
        """Bytes of the state an offload moves: param + grad buffers and the optimizer's tensors on the device."""
        st = self.worker.state
        total = sum(b.param_data.numel() * b.param_data.element_size() for b in st.buffers if b.param_data is not None)
        total += sum(b.grad_data.numel() * b.grad_data.element_size() for b in st.buffers if b.grad_data is not None)
        inners = [o.optimizer for o in getattr(st.opt, "chained_optimizers", [st.opt])] if st.gpu else [st.opt]
        for inner in inners:
            for group in inner.param_groups:
                for p in group["params"]:
                    total += p.numel() * p.element_size() if st.gpu else 0
                    total += sum(v.numel() * v.element_size() for v in inner.state.get(p, {}).values()
                                 if torch.is_tensor(v) and v.dim() > 0)
        return total

    def optimizer_bytes(self) -> int:
        """Bytes of the optimizer's own tensors (fp32 main params, Adam moments), wherever they are now:
        what its offload moves. The CPU smoke's Adam never moves: 0 there."""
        st = self.worker.state
        if not st.gpu:
            return 0
        tensors = [t for o in getattr(st.opt, "chained_optimizers", [st.opt]) for group in o.optimizer.param_groups
                   for p in group["params"] for t in [p] + [v for v in o.optimizer.state.get(p, {}).values()
                                                          if torch.is_tensor(v) and v.dim() > 0]]
        return sum(t.numel() * t.element_size() for t in tensors)

    def hf_config(self) -> dict:
        return self.worker.state.hf_config

    def offload_report(self):
        """colo-shim's offload family in the trainer: mirrors, fallbacks, the mirrors made ahead (issue 34)."""
        if "colo_shim" not in sys.modules:
            return None
        import colo_shim

        return next((r.get("details") for r in colo_shim.status() if r["name"] == "offload" and r.get("details")), None)

    def shim_status(self):
        """colo-shim's status() in the trainer (fence totals, main-async decisions), compact."""
        status = shim_status()
        return None if status is None else status | {"fence": _shim_totals()}
