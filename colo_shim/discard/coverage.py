"""Which parameters a refit rewrites, and keeping the others across a level-2 sleep (issues 5, 8).

Level 2 destroys every tensor vLLM allocated while loading; a refit restores only what it sends.
Parameters outside the refit (a VLM's layer scales, a speculative drafter, tensors derived in
`process_weights_after_loading`) would come back as garbage, which is why upstream reverted
level 2 (NeMo-RL #2658). Instead of refusing to discard such models, colo-shim learns the refit's
coverage from the names `model.load_weights` reports while the refit runs at level 1, and keeps
only the uncovered rest: vLLM >= 0.31 copies it itself (`sleep_preserve_parameter_names`); older
vLLM gets a CPU copy taken here before the sleep.

The copy is written back as soon as the weights are mapped again (`wake_up(["weights"])`), before
the refit, not after it: NeMo-RL v0.5+ ends every refit with `process_weights_after_loading`,
which recomputes derived tensors (FP8 weight and KV scales) that `load_weights` does not report;
restored after the refit, the old copies overwrote those fresh values (stale scales, wrong
tokens). Restored before, the refit's own post-processing wins and untouched tensors keep theirs.

vLLM keeps a speculative drafter in `model_runner.drafter.model`, outside `model_runner.model`,
in the same sleep-mode pool, and its level-2 buffer saving skips the drafter's buffers. Its
parameters and buffers are tracked under the prefix `drafter:`; a refit that feeds the drafter
(Eagle3 `draft.` weights, a co-trained MTP layer) covers them through the drafter's own
`load_weights`; a drafter loaded once from disk stays uncovered and is copied like the rest.

The `*_rpc` functions run inside vLLM's worker through `collective_rpc(callable)` (vLLM calls it
with the worker as first argument): that is the only process holding the model, and it may not
be the process running the shim's wrappers. They are module-level so they pickle by reference.
"""

from __future__ import annotations

import glob

_RECORD = "_colo_shim_record"
_SAVED = "_colo_shim_preserved"
DRAFTER = "drafter:"


def _model(worker):
    return worker.model_runner.model


def _drafter(worker):
    owner = getattr(worker.model_runner, "drafter", None)
    model = getattr(owner, "model", None) if owner is not None else None
    return model if hasattr(model, "named_parameters") else None


def _modules(worker) -> list:
    """(name prefix, module) of every model the refit may write: the model, then the drafter."""
    out = [("", _model(worker))]
    drafter = _drafter(worker)
    if drafter is not None:
        out.append((DRAFTER, drafter))
    return out


def _tensors(worker) -> dict:
    """Every tensor level 2 loses that the shim may have to keep, by tracked name."""
    out = dict(_model(worker).named_parameters())
    drafter = _drafter(worker)
    if drafter is not None:  # vLLM saves model.named_buffers() at level 2, not the drafter's
        out.update({DRAFTER + n: t for n, t in drafter.named_parameters()})
        out.update({DRAFTER + n: t for n, t in drafter.named_buffers()})
    return out


def outside_model(names) -> bool:
    """True if some names are the drafter's, which vLLM's preserve globs do not reach."""
    return any(n.startswith(DRAFTER) for n in names)


def begin_record_rpc(worker) -> bool:
    """Record the names each model's `load_weights` reports for the duration of one weight update."""
    end_record_rpc(worker)  # a previous update that raised must not leave its recorders behind
    record = {"names": set(), "unknown": False}
    for prefix, model in _modules(worker):
        original = getattr(model, "load_weights", None)
        if original is None:
            continue

        def load_weights(*args, _original=original, _prefix=prefix, **kwargs):
            result = _original(*args, **kwargs)
            if isinstance(result, (set, frozenset, list, tuple)):
                record["names"].update(_prefix + n for n in result)
            else:  # this model does not say what it wrote: coverage cannot be trusted
                record["unknown"] = True
            return result

        model.load_weights = load_weights
    setattr(worker, _RECORD, record)
    return True


def end_record_rpc(worker) -> dict:
    """Stop recording; return the written names (None = unknown) and every tracked tensor's size."""
    record = worker.__dict__.pop(_RECORD, None)
    for _, model in _modules(worker):
        if "load_weights" in vars(model):
            del model.load_weights
    params = {n: t.numel() * t.element_size() for n, t in _tensors(worker).items()}
    written = None
    if record is not None and not record["unknown"]:
        written = sorted(record["names"])
    return {"written": written, "params": params}


def snapshot_rpc(worker, names: list[str]) -> int:
    """Copy the named tensors to CPU before a level-2 sleep destroys them; returns bytes."""
    wanted = set(names)
    saved = {n: t.detach().to("cpu", copy=True) for n, t in _tensors(worker).items() if n in wanted}
    setattr(worker, _SAVED, saved)
    return sum(t.numel() * t.element_size() for t in saved.values())


def restore_rpc(worker) -> int:
    """Write the CPU copies back into the woken weights (right after wake_up(["weights"]))."""
    saved = worker.__dict__.pop(_SAVED, {})
    if not saved:
        return 0
    tensors = _tensors(worker)
    import torch

    with torch.no_grad():
        for name, tensor in saved.items():
            tensors[name].data.copy_(tensor.to(tensors[name].device))
    return sum(t.numel() * t.element_size() for t in saved.values())


def set_preserve_globs_rpc(worker, names: list[str]) -> int:
    """vLLM >= 0.31: let the engine keep these parameters at level 2 (exact-name globs)."""
    worker.model_config.sleep_preserve_parameter_names = [glob.escape(n) for n in names]
    params = dict(_model(worker).named_parameters())
    return sum(params[n].numel() * params[n].element_size() for n in names if n in params)


def wake_steps(st, tags) -> list:
    """Steps to run right after a wake-up: the CPU copies go back once the weights are mapped."""
    if (tags is None or "weights" in tags) and st.discarded and st.preserve_mode == "shim-cpu-copy":
        return [(restore_rpc, ())]
    return []


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

    def total_bytes(self) -> int:
        return sum(sum(p.values()) for p in self.params)
