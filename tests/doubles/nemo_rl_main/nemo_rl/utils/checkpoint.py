"""Test double of NeMo-RL main (7ea279a, 2026-08) `nemo_rl/utils/checkpoint.py`: `CheckpointManager`.

What colo-shim's main-async patch relies on, with upstream's behaviour: a save goes into
`tmp_step_N` (training_info.json written first); `begin_finalization(path, wait_fn)` first joins a
previous finalization, then a daemon thread calls wait_fn (the policy's finalize_async_save, which
must block until the async write is complete), renames tmp_step_N to step_N and hands the pruning of
old checkpoints to a one-thread executor; `finalize_pending()` joins that thread and re-raises its
error; `shutdown()` (training exit) also waits for the pruning. "Latest" is the highest step_N
directory (`get_latest_checkpoint_path`); main keeps no link. Pruning here is keep_top_k by recency
only (no metric, save_period 1), which is what upstream does with `metric_name=None`.
"""

import json
import os
import re
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


class CheckpointManager:
    def __init__(self, config):
        self.checkpoint_dir = Path(config["checkpoint_dir"])
        self.keep_top_k = config.get("keep_top_k")
        self._finalize_thread = None
        self._pending_checkpoint_path = None
        self._finalize_error = None
        self._delete_executor = ThreadPoolExecutor(max_workers=1)

    def init_tmp_checkpoint(self, step, training_info, run_config=None):
        save_dir = self.checkpoint_dir / f"tmp_step_{step}"
        if save_dir.exists():
            shutil.rmtree(save_dir)
        save_dir.mkdir(parents=True, exist_ok=True)
        with open(save_dir / "training_info.json", "w") as f:
            json.dump(dict(training_info), f)
        return Path(os.path.abspath(save_dir))

    def _rename_checkpoint(self, checkpoint_path):
        checkpoint_path = Path(checkpoint_path)
        target = checkpoint_path.parent / f"step_{checkpoint_path.name.split('_')[2]}"
        if target.exists():
            old = checkpoint_path.parent / f"old_{target.name}"
            os.rename(target, old)
            os.rename(checkpoint_path, target)
            shutil.rmtree(old)
        else:
            os.rename(checkpoint_path, target)

    def begin_finalization(self, checkpoint_path, wait_fn=None):
        self.finalize_pending()
        self._pending_checkpoint_path = Path(checkpoint_path)
        self._finalize_error = None

        def _finalize():
            try:
                if wait_fn is not None:
                    wait_fn()
                self._rename_checkpoint(checkpoint_path)
                self._delete_executor.submit(self.remove_old_checkpoints)
            except Exception as e:
                self._finalize_error = e
            finally:
                self._pending_checkpoint_path = None

        self._finalize_thread = threading.Thread(target=_finalize, daemon=True)
        self._finalize_thread.start()

    def finalize_pending(self):
        if self._finalize_thread is not None:
            self._finalize_thread.join()
            self._finalize_thread = None
        if self._finalize_error is not None:
            err, self._finalize_error = self._finalize_error, None
            raise RuntimeError("Background checkpoint finalization failed") from err

    def shutdown(self):
        self.finalize_pending()
        self._delete_executor.shutdown(wait=True)
        self._delete_executor = ThreadPoolExecutor(max_workers=1)

    @property
    def has_pending_finalization(self):
        return self._pending_checkpoint_path is not None

    def _steps(self):
        return sorted(int(p.name.split("_")[1]) for p in self.checkpoint_dir.glob("step_*")
                      if re.fullmatch(r"step_\d+", p.name) and (p / "training_info.json").exists())

    def remove_old_checkpoints(self, exclude_latest=True):
        steps = self._steps()
        if not steps or self.keep_top_k is None:
            return
        keep = set(steps[-self.keep_top_k:]) | ({steps[-1]} if exclude_latest else set())
        for step in steps:
            if step not in keep:
                shutil.rmtree(self.checkpoint_dir / f"step_{step}")

    def get_latest_checkpoint_path(self):
        steps = self._steps()
        return str(self.checkpoint_dir / f"step_{steps[-1]}") if steps else None
