"""Which parameters a refit rewrites, and keeping the others across a level-2 sleep (issue 5).

Level 2 destroys every tensor vLLM allocated while loading; a refit restores only what it sends.
Parameters outside the refit (a VLM's layer scales, a speculative drafter, tensors derived in
`process_weights_after_loading`) would come back as garbage, which is why upstream reverted
level 2 (NeMo-RL #2658). Instead of refusing to discard such models, colo-shim learns the refit's
coverage from the names `model.load_weights` reports while the refit runs at level 1, and keeps
only the uncovered rest: vLLM >= 0.31 copies it itself (`sleep_preserve_parameter_names`); older
vLLM gets a CPU copy taken here before the sleep and written back once the refit is done.

The `*_rpc` functions run inside vLLM's worker through `collective_rpc(callable)` (vLLM calls it
with the worker as first argument): that is the only process holding the model, and it may not
be the process running the shim's wrappers. They are module-level so they pickle by reference.
"""

from __future__ import annotations

import glob

_RECORD = "_colo_shim_record"
_SAVED = "_colo_shim_preserved"


def _model(worker):
    return worker.model_runner.model


def begin_record_rpc(worker) -> bool:
    """Record the names `load_weights` reports for the duration of one weight update."""
    model = _model(worker)
    end_record_rpc(worker)  # a previous update that raised must not leave its recorder behind
    original = model.load_weights
    record = {"names": set(), "unknown": False}

    def load_weights(*args, **kwargs):
        result = original(*args, **kwargs)
        if isinstance(result, (set, frozenset, list, tuple)):
            record["names"].update(result)
        else:  # this model does not say what it wrote: coverage cannot be trusted
            record["unknown"] = True
        return result

    model.load_weights = load_weights
    setattr(worker, _RECORD, record)
    return True


def end_record_rpc(worker) -> dict:
    """Stop recording; return the written names (None = unknown) and every parameter's size."""
    model = _model(worker)
    record = worker.__dict__.pop(_RECORD, None)
    if "load_weights" in vars(model):
        del model.load_weights
    params = {n: p.numel() * p.element_size() for n, p in model.named_parameters()}
    written = None
    if record is not None and not record["unknown"]:
        written = sorted(record["names"])
    return {"written": written, "params": params}


def snapshot_rpc(worker, names: list[str]) -> int:
    """Copy the named parameters to CPU before a level-2 sleep destroys them; returns bytes."""
    wanted = set(names)
    saved = {n: p.detach().to("cpu", copy=True) for n, p in _model(worker).named_parameters() if n in wanted}
    setattr(worker, _SAVED, saved)
    return sum(t.numel() * t.element_size() for t in saved.values())


def restore_rpc(worker) -> int:
    """Write the CPU copies back into the woken weights (after the refit, before the KV cache)."""
    saved = worker.__dict__.pop(_SAVED, {})
    if not saved:
        return 0
    params = dict(_model(worker).named_parameters())
    import torch

    with torch.no_grad():
        for name, tensor in saved.items():
            params[name].data.copy_(tensor.to(params[name].device))
    return sum(t.numel() * t.element_size() for t in saved.values())


def set_preserve_globs_rpc(worker, names: list[str]) -> int:
    """vLLM >= 0.31: let the engine keep these parameters at level 2 (exact-name globs)."""
    worker.model_config.sleep_preserve_parameter_names = [glob.escape(n) for n in names]
    params = dict(_model(worker).named_parameters())
    return sum(params[n].numel() * params[n].element_size() for n in names if n in params)


def held_bytes_rpc(worker) -> int:
    """CPU bytes the shim itself holds in this worker (for the benchmark and the report)."""
    return sum(t.numel() * t.element_size() for t in worker.__dict__.get(_SAVED, {}).values())


class Coverage:
    """Per-engine coverage: learned from the first complete refit, then checked on every refit."""

    def __init__(self):
        self.state = "unknown"  # unknown | learned | changed | unreported
        self.covered: list[frozenset] | None = None
        self.params: list[dict] = []
        self._pending: list[set] | None = None
        self._pending_unknown = False

    def start_cycle(self) -> None:
        self._pending, self._pending_unknown = None, False

    def add_update(self, records: list[dict]) -> None:
        if self._pending is None:
            self._pending = [set() for _ in records]
        self.params = [r["params"] for r in records]
        for rank, rec in enumerate(records):
            if rec["written"] is None:
                self._pending_unknown = True
            elif rank < len(self._pending):
                self._pending[rank].update(rec["written"])

    def finish_cycle(self) -> tuple[str, list[str]]:
        """Close a refit; returns (event, missing): event is 'learned', 'same', 'changed' or 'none';
        missing lists covered names this refit did not write (garbage after a level-2 sleep)."""
        pending, unknown = self._pending, self._pending_unknown
        self.start_cycle()
        if pending is None:
            return "none", []
        if unknown:
            if self.state == "unknown":
                self.state = "unreported"
            return "none", []
        written = [frozenset(s) for s in pending]
        if self.covered is None:
            self.covered, self.state = written, "learned"
            return "learned", []
        if written != self.covered:
            self.state = "changed"
            missing = set()
            for rank, covered in enumerate(self.covered):
                missing.update(covered - (written[rank] if rank < len(written) else frozenset()))
            return "changed", sorted(missing)
        return "same", []

    def uncovered(self) -> list[str]:
        if self.covered is None:
            return []
        names = set()
        for rank, params in enumerate(self.params):
            covered = self.covered[rank] if rank < len(self.covered) else frozenset()
            names.update(n for n in params if n not in covered)
        return sorted(names)

    def uncovered_bytes(self) -> int:
        names = set(self.uncovered())
        return sum(b for params in self.params for n, b in params.items() if n in names)

    def total_bytes(self) -> int:
        return sum(sum(p.values()) for p in self.params)
