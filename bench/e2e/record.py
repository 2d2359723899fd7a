"""Per-step records of the e2e harness (issue 17's schema), the host-memory monitor, and the actor
handles that report each finished call to the recorder. Everything here is measurement: the loop
itself is the site package's grpo_train.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager

from bench.e2e import ranks
from bench.e2e.hostmem import GIB, rss_parts, tree_rss


class Timer:
    """NeMo-RL's Timer in miniature: `with timer.time(name)` sums seconds per name for the step."""

    def __init__(self):
        self.times = {}

    @contextmanager
    def time(self, name):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.times[name] = round(self.times.get(name, 0.0) + time.perf_counter() - t0, 3)


class Recorder:
    """The per-step records (issue 17's schema) and the progress file a crashed run leaves behind.
    `trainer` is the ranks' group (rpc.Group: every report is a list, one entry per rank); step
    fields are the worst rank's, `per_rank` has each rank's (ranks.py)."""

    def __init__(self, run, progress):
        self.run, self.progress, self.step, self.instrument_s = run, progress, None, 0.0
        self.trainer = self.engine = None
        self.n, self.base, self._sent = ranks.of(run), None, {}

    def write(self):
        with open(self.progress + ".tmp", "w") as f:
            json.dump(self.run, f, default=str)
        os.replace(self.progress + ".tmp", self.progress)

    @contextmanager
    def instrument(self):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.instrument_s += time.perf_counter() - t0

    def trainer_probe(self):
        with self.instrument():
            return self.trainer.call("report", "snapshot")

    def begin(self, n, timer):
        self.monitor.take()
        self.timer, self.t0, self.instrument_s = timer, time.perf_counter(), 0.0
        timer.times.clear()
        self.base = self.trainer_probe()
        self.step = {"step": n, "wake_ok": None, "held_gib": None, "offloaded_gib": None, "host_peak_gib": None,
                     "pinned_after_finish_gib": None, "level1_backup_gib": self.run.get("level1_backup_gib"),
                     "discarded": None, "ckpt_equal": None, "refit_equal": None, "step_s": None,
                     "offload_wait_s": None, "wakes": [], "refits": []}
        self.run["steps"].append(self.step)
        self.write()

    # ---- hooks on actor calls (bench-side proxies, see Instrumented)
    def after_call(self, actor, method, result, kwargs):
        if self.step is None:
            return
        if actor == "trainer" and method in ("offload_before_refit", "offload_after_refit", "finalize_async_save",
                                             "save_checkpoint"):
            self.step.setdefault("trainer_calls", []).append(method)  # the order main's two calls met in
        if actor == "trainer" and method == "train":  # the steady footprint while training (issue 23: mirrors stay)
            with self.instrument():  # and in parts (issue 34): the trainer, its NVRx writer, the engine
                self.step["host_rss_train_gib"] = round(tree_rss(os.getpid(), self.monitor.exclude()) / GIB, 3)
                self.step["host_rss_parts_gib"] = rss_parts([r.proc.pid for r in self.trainer.remotes],
                                                            [self.engine.proc.pid])
        if actor == "trainer" and method == "offload_before_refit" and getattr(self, "checkpointer", None):
            self.checkpointer.after_offload()
        if actor == "trainer" and method == "offload_after_refit":
            ps = self.trainer_probe()
            with self.instrument():
                states = self.trainer.call("report", "state_bytes")
                optimizer = self.trainer.call("report", "optimizer_bytes")
            held = round(max(p["reserved"] for p in ps) / GIB, 3)
            self.step.setdefault("held_all_gib", []).append(held)
            if self.step["held_gib"] is None:  # the step's first offload: the one a save may be in flight at
                self.step["held_gib"] = held
                self.step["offloaded_gib"] = round(max(states) / GIB, 3)
                self.step["offloaded_opt_gib"] = round(max(optimizer) / GIB, 3)  # what the optimizer's offload moves
                self.step["free_after_offload_gib"] = round(min(p["free"] for p in ps) / GIB, 3)
                self.step["trainer_pinned_gib"] = round(max(p["pinned"] for p in ps) / GIB, 3)
                self.step["stage_registered_gib"] = round(max(p.get("registered", 0) for p in ps) / GIB, 3)
                self.step["pending_saves_at_offload"] = max(p["pending_saves"] for p in ps)
                for row, p, state in zip(ranks.rows(self.step, self.n), ps, states):
                    row.update(held_gib=round(p["reserved"] / GIB, 3), offloaded_gib=round(state / GIB, 3),
                               held_pct=round(100 * p["reserved"] / state, 2) if state else None)
            self.run.setdefault("free_after_offload_gib", []).append(self.step["free_after_offload_gib"])
        if actor == "engine" and method == "wake_up" and not _control(kwargs.get("tags")):
            with self.instrument():
                w = self.engine.call("report", "wake_record")
            rec = {"tags": w["tags"], "ok": w["ok"], "free_gib": round(w["free_before"] / GIB, 3),
                   "requested_gib": round(w["requested"] / GIB, 3), "s": w["s"]}
            if not w["ok"]:
                rec["error"] = w["error"]
            self.step["wakes"].append(rec)
            if w["tags"] is None or "kv_cache" in w["tags"]:
                self.step["wake_ok"] = w["ok"] if self.step["wake_ok"] is not False else False
                self.step.update(wake_free_gib=rec["free_gib"], wake_requested_gib=rec["requested_gib"])
                if not w["ok"]:
                    self.step["wake_error"] = w["error"]
            if w["ok"] and w["tags"] is None and self._sent:
                self.refit_done("wake")  # no refit this step: the kept (level-1) weights must be the last sent
            self.write()
        if actor == "engine" and method == "update_weights_via_ipc_zmq":
            self.refit_done()

    def stream_result(self, result, rank=0):
        if rank == 0:  # a new stream: the ranks' results arrive in rank order
            self._sent = {}
        self._sent[rank] = result

    def refit_done(self, kind="refit"):
        with self.instrument():
            held = self.engine.call("report", "digests")
        sent = [self._sent[r] for r in sorted(self._sent)]
        equal, worst, uncovered = ranks.refit_check(sent, held)
        rec = {"kind": kind, "equal": all(equal), "max_rel_diff": worst, "uncovered": uncovered[:5],
               "tensors": len(sent[0]["digests"]), "buffers": sent[0]["buffers"],
               "stream_s": max(s["stream_s"] for s in sent)}
        if self.n > 1:
            rec["workers_equal"] = equal
        self.step["refits"].append(rec)
        self.step["refit_equal"] = all(r["equal"] for r in self.step["refits"])
        for r, row in enumerate(ranks.rows(self.step, self.n)):
            row["refit_equal"] = all(x["workers_equal"][r] for x in self.step["refits"])

    def after_finish(self, kind):
        with self.instrument():
            s = self.engine.call("report", "last_sleep")
        key = "" if kind == "rollout" else "val_"
        self.step[key + "pinned_after_finish_gib"] = round(s["pinned"] / GIB, 3)
        self.step[key + "sleep_level"] = s["level"]
        if kind == "rollout":
            self.step["discarded"] = s["level"] >= 2
        if self.n > 1:  # the backups live in the engine's workers (vLLM's TP worker processes)
            with self.instrument():
                pinned = self.engine.call("report", "worker_pinned")
            for row, b in zip(ranks.rows(self.step, self.n), pinned):
                row[key + "pinned_after_finish_gib"] = round(b / GIB, 3)
            self.step[key + "pinned_after_finish_gib"] = round(max(pinned) / GIB, 3)  # the step's: the worst worker's

    def save_scheduled(self, step, saved):
        self.step.update(save_schedule_s=saved["schedule_s"], save_finalize_prev_s=saved["finalize_prev_s"],
                         save_async=saved["async"], save_threads=saved.get("threads"))

    def ckpt_result(self, step, res):
        for rec in self.run["steps"]:
            if rec["step"] == step:
                rec["ckpt_equal"] = bool(res.get("equal"))
                rec["ckpt"] = res
                for row, r in zip(ranks.rows(rec, self.n), res.get("ranks", [])):
                    row["ckpt_equal"] = bool(r.get("equal"))
        self.write()

    def log_metrics(self, metrics, step):
        ps = self.trainer_probe()
        waits = [ranks.offload_wait(p, b) for p, b in zip(ps, self.base)]
        for row, wait in zip(ranks.rows(self.step, self.n), waits):
            row["offload_wait_s"] = wait
        rss, shm, avail = self.monitor.take()
        wall = time.perf_counter() - self.t0
        self.step.update(
            host_peak_gib=round(rss / GIB, 3), shm_peak_gib=round(shm / GIB, 3), mem_available_min_gib=round(avail / GIB, 3),
            step_s=round(wall - self.instrument_s, 3), instrument_s=round(self.instrument_s, 3),
            offload_wait_s=max(waits), offload_parts=ranks.offload_parts(ps, self.base),
            times=dict(self.timer.times), ids_digest=metrics.get("ids_digest"),
            mean_reward=metrics.get("mean_reward"), loss=metrics.get("loss"))
        self.write()
        print(f"[e2e] step {step}: {json.dumps({k: v for k, v in self.step.items() if k not in ('times', 'refits', 'wakes', 'ckpt')}, default=str)}",
              flush=True)


def _control(tags) -> bool:
    return bool(tags) and all(str(t).startswith("colo_shim:") for t in tags)


class Instrumented:
    """The actor handle the site's Policy / VllmGeneration hold; reports finished calls to the Recorder."""

    def __init__(self, remote, actor, rec):
        self.remote, self.actor, self.rec = remote, actor, rec

    def call(self, name, *args, **kwargs):
        out = None
        try:
            out = self.remote.call(name, *args, **kwargs)
            return out
        finally:  # a failed call too: a wake-up that ran out of memory is the record that matters
            self.rec.after_call(self.actor, name, out, kwargs)

    def submit(self, name, *args, **kwargs):
        futs = self.remote.submit(name, *args, **kwargs)  # a list from a group of ranks
        inst = self

        class Wrapped:
            def __init__(self_inner, fut, rank):
                self_inner.fut, self_inner.rank = fut, rank

            def get(self_inner):
                out = self_inner.fut.get()
                if name == "stream_weights_via_ipc_zmq":
                    inst.rec.stream_result(out, self_inner.rank)
                elif self_inner.rank == 0:
                    inst.rec.after_call(inst.actor, name, out, kwargs)
                return out
        if isinstance(futs, list):
            return [Wrapped(f, r) for r, f in enumerate(futs)]
        return Wrapped(futs, 0)

    def close(self):
        self.remote.close()
