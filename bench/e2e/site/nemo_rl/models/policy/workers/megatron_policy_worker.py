"""nemo_rl/models/policy/workers/megatron_policy_worker.py: `MegatronPolicyWorkerImpl`, the trainer actor.

A real megatron-core GPTModel (Llama shape, local spec) in megatron DDP with the distributed
optimizer (bench/e2e/trainer.py builds it; the refit is bench/e2e/refit.py), NVRx async saves of the live state through
`dist_checkpointing.save(async_sharded_save=True)` with cached structure on a persistent queue
(NeMo-RL main: async_save, ckpt_assume_constant_structure, persistent worker).

Storage moves keep upstream's order: offload_before_refit = grad buffers to CPU (params stay for
the refit), optimizer state to CPU, empty_cache; offload_after_refit = params and grads to CPU,
optimizer to CPU, empty_cache; prepare_for_lp_inference = params back; prepare_for_training =
params, grads, optimizer back.

With E2E_WORKER=main (NeMo-RL main after PR #3322) the class also has main's `finalize_async_save`,
called first in both offloads: a blocking finalize, and when `_requires_nvrx_cuda_cache_release()`
(async nvrx, persistent worker, constant structure, colocated, not async_ckpt_use_cpu_shm) also
close the writer, `FileSystemWriterAsync.cleanup_tensor_caches()`, gc, ipc_collect, empty_cache.
Without it (v0.7 layout) the offloads do not wait: the save stays in flight into the next refit.
"""

from __future__ import annotations

import gc
import os
import time

import torch

from bench.e2e import probes, refit
from bench.e2e import trainer as core
from bench.e2e.timing import Parts, fence_seconds

MAIN = os.environ.get("E2E_WORKER", "v0_7") == "main"


class MegatronPolicyWorkerImpl:
    def __init__(self, config: dict):
        self.cfg = config
        self.state = core.build(config)
        self.model = self.state.ddp
        self.optimizer = self.state.opt
        self.async_calls_queue = None
        self._async_checkpoint_cuda_cache_active = False
        self.timings = {"finalize_in_offload_s": 0.0, "fence_in_finalize_s": 0.0}  # harness timing only
        self.parts = {}  # harness timing only: seconds per part of each offload, summed over the run
        self.probe = probes.TrainerProbe(self)  # harness measurement only

    # ------------------------------------------------------------------ refit
    def prepare_refit_info(self) -> dict:
        return core.refit_info(self.state)

    def get_free_memory_bytes(self) -> int:
        return core.free_bytes()

    def stream_weights_via_ipc_zmq(self, buffer_size_bytes: int) -> dict:
        address = refit.rank_address(os.environ["E2E_ZMQ_ADDR"], core.rank())  # the engine worker on this GPU
        return refit.stream_weights(self.state, address, buffer_size_bytes)

    def offload_before_refit(self):
        """Offload the optimizer and buffers to the CPU."""
        self._offload("before", "grads", move_params=False)

    def offload_after_refit(self):
        """Offload as much as possible on the CPU."""
        self._offload("after", "params_grads", move_params=True)

    def _offload(self, kind: str, buffers: str, move_params: bool):
        """Upstream's body of both offloads, timed in parts (harness timing only)."""
        with Parts(self.parts, kind) as part:
            if MAIN:
                part("fence", self._timed_finalize)
            self.model = part(buffers, self.move_model, self.model, "cpu", move_params=move_params, move_grads=True)
            part("optimizer", self.move_optimizer, "cpu")
            part("empty_cache", lambda: (gc.collect(), core.empty_cache()))

    # ------------------------------------------------------------------ training
    def prepare_for_lp_inference(self):
        self.model = self.move_model(self.model, "cuda", move_grads=False)
        self.model.eval()
        self.move_optimizer("cpu")

    def get_logprobs(self, data: dict) -> dict:
        return core.logprobs(self.state, data)

    def prepare_for_training(self, *args, **kwargs):
        self.model = self.move_model(self.model, "cuda", move_grads=True, move_params=True)
        self.model.train()
        self.move_optimizer("cuda")

    def train(self, data: dict, loss_fn=None) -> dict:
        return core.train_step(self.state, data)

    def finish_training(self, *args, **kwargs):
        pass

    def move_model(self, model, device: str, move_params: bool = True, move_grads: bool = True):
        core.move_buffers(self.state, device, move_params, move_grads)
        return model

    def move_optimizer(self, device: str):
        core.move_optimizer(self.state, device)

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, weights_path: str, optimizer_path=None, **kwargs) -> dict:
        """Megatron-Bridge's save under main: finalize the previous async save (blocking), then save.

        Async: returns once scheduled, the write goes on in NVRx's worker. Returns what the
        harness needs to verify the checkpoint later (fingerprints of the live state now)."""
        ckpt = self.cfg["checkpoint"]
        if ckpt["async_save"] and self.async_calls_queue is None:
            self.async_calls_queue = core.make_queue(self.state)
        if MAIN and ckpt["async_save"] and self._requires_nvrx_cuda_cache_release():
            self._async_checkpoint_cuda_cache_active = True
        t0 = time.perf_counter()
        self._maybe_finalize_async_save(blocking=True)
        finalize_prev_s = time.perf_counter() - t0
        out = core.save(self.state, weights_path, self.async_calls_queue if ckpt["async_save"] else None)
        out["finalize_prev_s"] = round(finalize_prev_s, 3)
        return out

    def _maybe_finalize_async_save(self, blocking: bool, terminate: bool = False):
        """Megatron-Bridge's maybe_finalize_async_save on this worker's queue."""
        queue = self.async_calls_queue
        if queue is None:
            return
        # one CPU rank has no collective to make; several ranks agree through gloo, as on NCCL
        queue.maybe_finalize_async_calls(blocking=blocking, no_dist=not torch.cuda.is_available() and core.world() == 1)
        if terminate:
            queue.close()

    def _requires_nvrx_cuda_cache_release(self) -> bool:
        ckpt = self.cfg["checkpoint"]
        return bool(ckpt["async_save"] and ckpt.get("async_strategy", "nvrx") == "nvrx"
                    and ckpt.get("use_persistent_ckpt_worker", True) and ckpt.get("ckpt_assume_constant_structure")
                    and not ckpt.get("async_ckpt_use_cpu_shm", False) and self.cfg["colocated"])

    def _timed_finalize(self):  # harness timing of main's finalize inside an offload
        t0, fence0 = time.perf_counter(), fence_seconds()
        self.finalize_async_save()
        self.timings["finalize_in_offload_s"] += time.perf_counter() - t0
        self.timings["fence_in_finalize_s"] += fence_seconds() - fence0  # colo-shim's fence ran inside

    # ------------------------------------------------------------------ harness only
    def finish_all_saves(self) -> float:
        t0 = time.perf_counter()
        self._maybe_finalize_async_save(blocking=True)
        return round(time.perf_counter() - t0, 3)

    def report(self, what: str, *args):
        return getattr(self.probe, what)(*args)


if MAIN:
    def finalize_async_save(self):
        """Finalize an async write and release the writer's CUDA IPC cache when it has one (PR #3322)."""
        release = bool(self._async_checkpoint_cuda_cache_active and self._requires_nvrx_cuda_cache_release())
        self._maybe_finalize_async_save(blocking=True, terminate=release)
        if release:
            from nvidia_resiliency_ext.checkpointing.async_ckpt.filesystem_async import FileSystemWriterAsync

            cleanup = getattr(FileSystemWriterAsync, "cleanup_tensor_caches", None)
            if cleanup is not None:
                cleanup()
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.ipc_collect()
                torch.cuda.empty_cache()
            self._async_checkpoint_cuda_cache_active = False

    MegatronPolicyWorkerImpl.finalize_async_save = finalize_async_save
