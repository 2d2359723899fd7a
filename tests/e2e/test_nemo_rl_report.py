"""bench/nemo_rl (issue 33): the parser of main's GRPO output, the checkpoint read-back and the logger stubs.

The log excerpt is built from main's own print formats (NeMo-RL 7ea279abf: grpo.py's Timing block and Training
Results, megatron_policy_worker.py's GPU Memory lines as Ray forwards an actor's prints) and vLLM 0.25.1's
CuMemAllocator sleep line; the checkpoints are real torch.distributed.checkpoint directories.
"""
import json
import os
import subprocess
import sys

import pytest

from bench.nemo_rl import ckpt_check, report

W = "(MegatronPolicyWorker pid=4242)"
V = "(VllmGenerationWorker pid=4343) INFO 12-05 10:00:00 [cumem.py:273]"


def step_block(total, offload, ckpt, reserved, backup, kl):
    return [
        f"{W} GPU Memory before optimizer offload: 20.10GB allocated, 24.00GB reserved",
        f"{W} GPU Memory after optimizer offload: 3.20GB allocated, 4.00GB reserved",
        f"{W} GPU Memory after refit complete: 0.50GB allocated, {reserved:.2f}GB reserved",
        f"{V} CuMemAllocator: sleep freed 9.10 GiB memory in total, of which {backup:.2f} GiB is backed up in CPU "
        "and the rest 7.56 GiB is discarded directly.",
        "Saving checkpoint for step 1...",
        "",
        "📊 Training Results:",
        "  • Loss: 0.0123",
        f"  • Generation KL Error: {kl:.4f}",
        "  • Avg Reward: 0.0000",
        "  • Mean Generation Length: 12.0000",
        "",
        "⏱️  Timing:",
        f"  • Total step time: {total:.2f}s",
        f"  • policy_training: {total / 2:.2f}s (50.0%)",
        f"  • offload_before_refit: {offload:.2f}s ({offload / total * 100:.1f}%)",
        f"  • checkpointing: {ckpt:.2f}s ({ckpt / total * 100:.1f}%)",
        "",
        "Performance metrics:",
    ]


LOG = "\n".join(step_block(40.0, 12.5, 3.0, 1.25, 1.54, 0.0012) + step_block(20.0, 0.5, 2.0, 0.75, 0.0, 0.0009)
                + ["Traceback (most recent call last):"])


def test_parse_log_reads_mains_formats():
    got = report.parse_log(LOG)
    assert [s["total_step_time"] for s in got["steps"]] == [40.0, 20.0]
    assert got["steps"][0]["timers"] == {"policy_training": 20.0, "offload_before_refit": 12.5, "checkpointing": 3.0}
    assert got["steps"][1]["gpu"]["after_refit_complete"] == {"allocated_gb": 0.5, "reserved_gb": 0.75}
    assert got["steps"][0]["sleep_backup_gib"] == [1.54] and got["steps"][1]["sleep_backup_gib"] == [0.0]
    assert got["steps"][1]["gen_kl_error"] == 0.0009
    assert got["saves"] == [1, 1] and got["error_lines"] == 1


def test_table_row_uses_steps_after_the_first(tmp_path):
    rec = {"run": "b", "rc": 0, **report.parse_log(LOG), "samples": {"writer_restarts": 0},
           "actors": {"lm_policy-0-0": {"applied": ["nvrx_fence"]}, "vllm-0": {"applied": []}},
           "checkpoints": {"valid": 2, "steps": {"1": {}, "2": {}}}}
    row = report.row(rec)
    assert row.startswith("| b | 0 | 2 | 20.0 | 0.5 | 2.0 | 0.75 | 1.54 | 0 | 2/2 | 1/2 | 1 |")


def _save(path, scale):
    import torch
    import torch.distributed.checkpoint as dcp

    state = {"decoder.layers.0.weight": torch.full((4, 4), scale), "embedding.weight": torch.arange(8.0) * scale}
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(path)), no_dist=True)


def test_ckpt_check_flags_stale_and_unfinished(tmp_path):
    for step, scale in ((1, 1.0), (2, 2.0), (3, 2.0)):
        _save(tmp_path / f"step_{step}" / "policy" / "weights" / f"iter_000000{step}", scale)
    (tmp_path / "tmp_step_4").mkdir()
    got = ckpt_check.check(str(tmp_path))
    assert sorted(got["steps"]) == [1, 2, 3] and all(s["ok"] for s in got["steps"].values())
    assert got["steps"][2]["sum"] == pytest.approx(2.0 * (16 + 28))
    assert got["stale_steps"] == [3] and got["unfinished"] == ["tmp_step_4"] and got["valid"] == 2


def test_ckpt_check_reports_a_missing_weights_dir(tmp_path):
    (tmp_path / "step_1" / "policy").mkdir(parents=True)
    assert ckpt_check.check(str(tmp_path))["steps"][1] == {"ok": False, "error": "no .metadata"}


def test_logger_stubs_import_and_refuse_use():
    stubs = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                         "bench", "nemo_rl", "stubs")
    code = ("import mlflow, swanlab, wandb\n"
            "from wandb import Table, Histogram, wandb_run\n"
            "h = Histogram([1, 2]); assert h.args == ([1, 2],)\n"
            "assert wandb_run.Run.__module__ == 'wandb.wandb_run'\n"
            "for f in (wandb.init, mlflow.start_run, swanlab.log):\n"
            "    try:\n        f()\n    except RuntimeError as e:\n        print(type(e).__name__, 'stub' in str(e))\n")
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=stubs),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:3] == ["StubUsed True"] * 3


def test_runs_give_mains_command_lines():
    from bench.nemo_rl import runs

    env, argv = runs.command("b", 6, "/in", "/out")
    assert env == {"COLO_SHIM": "1"} and argv[:3] == ["examples/run_grpo.py", "--config",
                                                      "examples/configs/grpo_math_1B_megatron.yaml"]
    assert "grpo.max_num_steps=6" in argv and "checkpointing.save_period=1" in argv
    assert "policy.megatron_cfg.checkpoint.async_save=false" in runs.command("c", 6, "/in", "/out")[1]
    assert not any("async_save" in a for a in runs.command("a", 6, "/in", "/out")[1])
    json.dumps(argv)
