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


def step_block(total, prep, ckpt, reserved, backup, kl):
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
        f"  • prepare_for_generation/total: {prep:.2f}s ({prep / total * 100:.1f}%)",
        f"  • checkpointing: {ckpt:.2f}s ({ckpt / total * 100:.1f}%)",
        "",
        "Performance metrics:",
    ]


LOG = "\n".join(step_block(40.0, 12.5, 3.0, 1.25, 1.54, 0.0012) + step_block(20.0, 0.5, 2.0, 0.75, 0.0, 0.0009)
                + ["Traceback (most recent call last):"])


def test_parse_log_reads_mains_formats():
    got = report.parse_log(LOG)
    assert [s["total_step_time"] for s in got["steps"]] == [40.0, 20.0]
    assert got["steps"][0]["timers"] == {"policy_training": 20.0, "prepare_for_generation/total": 12.5,
                                          "checkpointing": 3.0}
    assert got["steps"][1]["gpu"]["after_refit_complete"] == {"allocated_gb": 0.5, "reserved_gb": 0.75}
    assert got["steps"][0]["sleep_backup_gib"] == [1.54] and got["steps"][1]["sleep_backup_gib"] == [0.0]
    assert got["steps"][1]["gen_kl_error"] == 0.0009
    assert got["saves"] == [1, 1] and got["error_lines"] == 1


def test_table_row_uses_steps_after_the_first(tmp_path):
    rec = {"run": "b", "rc": 0, **report.parse_log(LOG), "samples": {"writer_restarts": 0},
           "actors": {"lm_policy-0-0": {"applied": ["nvrx_fence"]}, "vllm-0": {"applied": []}},
           "checkpoints": {"valid": 2, "steps": {"1": {}, "2": {}}, "as_trained": 1, "checked_against_previous": 1}}
    row = report.row(rec)
    assert row.startswith("| b | 0 | 2 | 20.0 | 0.5 | 2.0 | 0.75 | 1.54 / 0.0 | 0 | 2/2 | 1/1 | 1/2 | 1 |")
    rec["checkpoints"]["anchored_to_start"] = 1
    assert "| 2/2 | 1/1; = decayed start 1/2 | 1/2 |" in report.row(rec)


def test_record_keeps_free_disk_and_survives_its_absence(tmp_path):
    # A full /tmp failed main's first save in one run ("unexpected pos"): the record must say how much was free.
    (tmp_path / "driver.log").write_text(LOG)
    assert report.record("a", 1, 9.0, str(tmp_path))["disk_free_gib"] == {}
    (tmp_path / "disk_free_gib.json").write_text('{"before_run": 51.5, "after_run": 3.2}')
    rec = report.record("a", 1, 9.0, str(tmp_path))
    assert rec["disk_free_gib"] == {"before_run": 51.5, "after_run": 3.2}
    assert [s["total_step_time"] for s in rec["steps"]] == [40.0, 20.0] and rec["checkpoints"] == {}


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
    assert got["steps"][2]["equal_to_previous"] is False and got["steps"][3]["equal_to_previous"] is True
    assert got["stale_steps"] == [3] and got["unfinished"] == ["tmp_step_4"] and got["valid"] == 2


def _save_bf16(path, matrix, norm):
    import torch
    import torch.distributed.checkpoint as dcp

    state = {"decoder.layers.fc1.weight": matrix.to(torch.bfloat16), "decoder.layers.norm.weight": norm}
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(path)), no_dist=True)


def test_ckpt_check_predicts_each_step_from_the_one_before(tmp_path):
    """Weight decay only (runs.py): decayed tensors are 0.99 x the previous step up to bf16 rounding, layer-stacked
    norms keep their value; a stale step (step 3 = step 2) and a step off the prediction (step 5) are told apart."""
    import torch

    torch.manual_seed(0)
    master, norm = torch.randn(64, 32) * 0.02, torch.ones(16, 32, dtype=torch.bfloat16)
    saved = {1: master, 2: master * 0.99, 3: master * 0.99, 4: master * 0.99 ** 2, 5: master * 0.99 ** 2 * 0.97}
    for step, m in saved.items():
        _save_bf16(tmp_path / f"step_{step}" / "policy" / "weights" / "iter", m, norm)
    got = ckpt_check.check(str(tmp_path), decay=0.99)
    steps = got["steps"]
    assert steps[2]["as_trained"] and steps[2]["kept"] == 1 and steps[2]["decayed"] == 1, steps[2]
    assert steps[2]["max_rel_err_vs_decayed_previous"] < ckpt_check.TOL
    assert steps[3]["equal_to_previous"] and not steps[3]["as_trained"], steps[3]
    assert steps[4]["as_trained"], steps[4]  # 0.99 x step 3, which held step 2's values
    assert not steps[5]["as_trained"] and "decoder.layers.fc1.weight" in steps[5]["off_prediction"], steps[5]
    assert got["as_trained"] == 2 and got["checked_against_previous"] == 4 and got["stale_steps"] == [3]


def test_ckpt_check_anchors_every_step_to_the_model_main_started_from(tmp_path):
    """A checkpoint lagging its step by one (step N holding step N-1's weights) still decays by 0.99 from the one
    before, so only the HF start can tell: embedding and output layer of step N must be 0.99**N x the start (the
    Megatron embedding padded beyond the HF vocabulary)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file

    torch.manual_seed(0)
    emb, out = torch.randn(100, 16) * 0.05, torch.randn(100, 16) * 0.05
    model = tmp_path / "model"
    model.mkdir()
    save_file({"model.embed_tokens.weight": emb.to(torch.bfloat16), "lm_head.weight": out.to(torch.bfloat16),
               "model.norm.weight": torch.ones(16, dtype=torch.bfloat16)}, str(model / "model.safetensors"))

    def run(root, lag):
        for n in (1, 2, 3):
            k = n - lag
            state = {"embedding.word_embeddings.weight": torch.cat([emb * 0.99 ** k, torch.zeros(28, 16)]).bfloat16(),
                     "output_layer.weight": (out * 0.99 ** k).bfloat16()}
            dcp.save(state, storage_writer=dcp.FileSystemWriter(str(root / f"step_{n}" / "policy" / "weights" / "i")),
                     no_dist=True)
        return ckpt_check.check(str(root), decay=0.99, initial=str(model))

    good, lagging = run(tmp_path / "good", 0), run(tmp_path / "lag", 1)
    assert [good["steps"][n]["anchored"] for n in (1, 2, 3)] == [1, 2, 3] and good["anchored_to_start"] == 3
    assert good["steps"][3]["anchor_rel_err"] < ckpt_check.TOL
    assert lagging["as_trained"] == 2  # the step-to-step prediction holds for the lagging run too
    assert [lagging["steps"][n]["anchored"] for n in (1, 2, 3)] == [0, 1, 2] and lagging["anchored_to_start"] == 0
    assert "anchored_to_start" not in ckpt_check.check(str(tmp_path / "good"), decay=0.99)
    save_file({"model.embed_tokens.weight": emb.to(torch.bfloat16)}, str(model / "model.safetensors"))  # no lm_head
    partial = ckpt_check.check(str(tmp_path / "good"), decay=0.99, initial=str(model))
    assert partial["steps"][1]["anchored"] is None and partial["steps"][1]["missing"] == ["lm_head.weight"]
    assert partial["anchored_to_start"] == 0


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


def test_runs_give_mains_command_lines(monkeypatch):
    monkeypatch.delenv("GPU_TOTAL_MIB", raising=False)
    from bench.nemo_rl import runs

    env, argv = runs.command("b", 6, "/in", "/out")
    assert env == {"COLO_SHIM": "1"} and argv[:3] == ["examples/run_grpo.py", "--config",
                                                      "examples/configs/grpo_math_1B_megatron.yaml"]
    assert "grpo.max_num_steps=6" in argv and "checkpointing.save_period=1" in argv
    assert "policy.megatron_cfg.checkpoint.async_save=false" in runs.command("c", 6, "/in", "/out")[1]
    lr = next(float(a.split("=")[1]) for a in argv if a.startswith("policy.megatron_cfg.optimizer.lr="))
    wd = next(float(a.split("=")[1]) for a in argv if a.startswith("policy.megatron_cfg.optimizer.weight_decay="))
    assert runs.DECAY == pytest.approx(1 - lr * wd) and "loss_fn.reference_policy_kl_penalty=0.0" in argv
    assert not any("async_save" in a for a in runs.command("a", 6, "/in", "/out")[1])
    json.dumps(argv)
    # (d): main's tree with #3322 reversed, vLLM's pool large enough that the writer's held blocks cannot fit beside it
    d0, d1 = runs.command("d0", 6, "/in", "/out"), runs.command("d1", 6, "/in", "/out")
    assert d0[0] == {"NEMO_RL_TREE": "rl-pre3322"} and d1[0] == {"NEMO_RL_TREE": "rl-pre3322", "COLO_SHIM": "1"}
    util = "policy.generation.vllm_cfg.gpu_memory_utilization="
    assert f"{util}0.5" in argv and sum(a.startswith(util) for a in d0[1]) == 1
    # vLLM leaves 8 GiB of whichever card: 0.9 of the H100 80GB (81559 MiB), 0.94 of the H200 (143771 MiB)
    for mib, share in (("81559", 0.9), ("143771", 0.94)):
        monkeypatch.setenv("GPU_TOTAL_MIB", mib)
        assert f"{util}{share}" in runs.command("d1", 6, "/in", "/out")[1]
    monkeypatch.delenv("GPU_TOTAL_MIB")
    assert f"{util}0.9" in runs.command("d0", 6, "/in", "/out")[1]



def test_record_names_the_reversed_tree_of_runs_d(monkeypatch):
    monkeypatch.delenv("NEMO_RL_TREE", raising=False)
    assert report.versions()["NeMo-RL (git)"] == "7ea279abf"
    monkeypatch.setenv("NEMO_RL_TREE", "rl-pre3322")
    assert report.versions()["NeMo-RL (git)"] == "7ea279abf with PR #3322 (e4b8f3e5e) reversed"


def test_writer_restarts_count_children_beyond_those_alive_together(tmp_path):
    """NVRx's persistent worker and its results-queue manager live side by side (2 children, no restart, as on the
    H100 with colo-shim); a worker replaced at each offload adds new pids; the resource tracker is no writer."""
    pol, spawn = "ray::MegatronPolicyWorker.train", "python -c from multiprocessing.spawn import spawn_main; spawn_main()"
    tracker = "python -c from multiprocessing.resource_tracker import main;main(9)"

    def samples(*children_per_sample):
        path = tmp_path / f"s{len(children_per_sample)}.jsonl"
        with open(path, "w") as fh:
            for kids in children_per_sample:
                procs = [[10, 1, pol, 2**30], [11, 10, tracker, 1]] + [[pid, 10, spawn, 1] for pid in kids]
                fh.write(json.dumps({"t": 0, "procs": procs, "gpu_mib": {}}) + "\n")
        return report.parse_samples(str(path))

    steady = samples([20, 21], [20, 21], [20, 21])
    assert steady["writer_restarts"] == 0 and steady["nvrx_writer_pids"] == [20, 21]
    assert samples([20, 21], [21, 22], [21, 23])["writer_restarts"] == 2


def test_samples_keep_gpu_peaks_and_tell_vllm_from_the_policy(tmp_path):
    """"ray::vllm_policy-0-0" contains "lm_policy": its children and GPU memory are not the policy's."""
    spawn = "python -c from multiprocessing.spawn import spawn_main; spawn_main()"
    rows = [{"procs": [[10, 1, "ray::lm_policy-0-0:MegatronPolicyWorker.train", 1], [20, 10, spawn, 1],
                       [30, 1, "ray::vllm_policy-0-0:VllmGenerationWorker.generate", 1], [31, 30, spawn, 1]],
             "gpu_mib": {"10": mib, "20": 520.0, "30": vllm}} for mib, vllm in ((16000.0, 800.0), (900.0, 40000.0))]
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = report.parse_samples(str(path))
    assert got["nvrx_writer_pids"] == [20] and got["writer_restarts"] == 0
    assert got["gpu_peak_mib"] == {"policy": 16000.0, "writers": 520.0, "total": 41420.0}


def test_record_names_the_first_oom_and_the_wake_before_it(tmp_path):
    """Run (d0) is meant to fail at vLLM's KV-cache wake-up: the record says where, from main's own log."""
    wake = "(VllmGenerationWorker pid=1) INFO [abstract.py:345] It took 0.05 seconds to wake up tags ['kv_cache']."
    oom = "(VllmGenerationWorker pid=1) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 GiB."
    # vLLM's own start-up line says which share of the card it was given (the Overrides line before it is not read)
    args = ("(VllmGenerationWorker pid=1) INFO [api_utils.py:273] non-default args: {'dtype': 'bfloat16', "
            "'gpu_memory_utilization': 0.94, 'enforce_eager': True}")
    lines = ["Overrides: ['policy.generation.vllm_cfg.gpu_memory_utilization=0.5']", args]
    (tmp_path / "driver.log").write_text("\n".join(lines + step_block(40.0, 12.5, 3.0, 1.25, 1.54, 0.0012) + [wake, oom]))
    rec = report.record("d0", 1, 9.0, str(tmp_path))
    assert rec["first_oom"] == {"line": oom, "after_wake": "'kv_cache'", "in_step": 2}
    assert rec["vllm_gpu_memory_utilization"] == 0.94
    assert report.parse_log(LOG)["first_oom"] is None and report.parse_log(LOG)["vllm_gpu_memory_utilization"] is None


def _device_run(tmp_path, runs: str, ckpt_gib: float, path: str = ""):
    """device.sh run RUNS 6 against a stage of main's tree only (an empty env.sh) and a run directory under tmp_path:
    what it does before Ray or the job starts."""
    stage, runs_dir = tmp_path / "stage", tmp_path / "runs"
    (stage / "src" / "rl").mkdir(parents=True)
    (stage / "env.sh").write_text("")
    env = {**os.environ, "NEMO_STAGE": str(stage), "NEMO_RUNS": str(runs_dir), "OUT": str(tmp_path),
           "CKPT_GIB": str(ckpt_gib), "PATH": path + os.environ["PATH"]}
    script = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "nemo_rl", "device.sh")
    out = subprocess.run(["bash", script, "run", runs, "6"], env=env, capture_output=True, text=True, timeout=60)
    return out, stage, runs_dir


def test_device_run_refuses_when_the_checkpoints_cannot_fit(tmp_path):
    """Six checkpoints of the 1B run took 55.3 of /tmp's 59.5 GiB on the H100: a run whose checkpoints cannot fit
    must stop before it starts the job, not fail a save half way (run (a) once did, after run (b)'s were kept)."""
    out, _stage, _runs = _device_run(tmp_path, "a,b", ckpt_gib=1000000)
    assert out.returncode == 1, out.stdout + out.stderr
    assert out.stdout.count("refused:") == 2 and "6 checkpoints need" in out.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stage"]  # no run directory, no record, no job


def test_actor_rows_keep_the_policy_workers_own_targets(tmp_path):
    """Which of main's worker methods colo-shim wrapped, per actor: the offloads are not-needed on main (#3322
    finalizes in them) and applied, with calls, on main with #3322 reversed (runs d0/d1)."""
    t = report.WORKER_TARGETS
    rows = [{"name": "megatron", "target": t + "offload_before_refit", "status": "applied", "calls": 6},
            {"name": "megatron", "target": t + "finalize_async_save", "status": "pending", "calls": 0},
            {"name": "nvrx", "target": "nvidia_resiliency_ext.x:Q.f", "status": "applied", "calls": 2}]
    (tmp_path / "a.json").write_text(json.dumps({"lm_policy-0-0": {"COLO_SHIM": "1", "colo_shim_loaded": True,
                                                                   "status": rows}}))
    got = report.actor_shim(str(tmp_path / "a.json"))["lm_policy-0-0"]
    assert got["applied"] == ["megatron", "nvrx"]
    assert got["worker_targets"] == {"MegatronPolicyWorkerImpl.offload_before_refit": ["applied", 6]}


def test_device_run_d_needs_the_reversed_tree_staged(tmp_path):
    """Runs d0/d1 swap main's tree for rl-pre3322 in PYTHONPATH before Ray starts; staged without it (part 2 made
    without extra/pre3322) they must stop there, before Ray or the job, and say what to carry."""
    out, stage, runs_dir = _device_run(tmp_path, "d0", ckpt_gib=0)
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"no {stage}/src/rl-pre3322: stage with extra/pre3322 carried" in out.stdout
    assert not (runs_dir / "d0" / "ray_start.log").exists() and not (runs_dir / "d0" / "driver.log").exists()


def test_device_run_d_keeps_its_tree_when_nvidia_smi_prints_an_error(tmp_path):
    """device.sh sizes (d) by the card nvidia-smi reports; an nvidia-smi that answers with an error text (no driver
    yet) must leave the default share, not break runs.py, whose failure would drop NEMO_RL_TREE and run main's tree."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate'\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    out, stage, runs_dir = _device_run(tmp_path, "d1", ckpt_gib=0, path=f"{bin_dir}:")
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"no {stage}/src/rl-pre3322: stage with extra/pre3322 carried" in out.stdout, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and not (runs_dir / "d1" / "ray_start.log").exists()


def test_device_run_stops_when_runs_py_gives_no_command_line(tmp_path):
    """A run runs.py does not know (or any runs.py failure) ends before Ray starts: with no argv device.sh would start
    Ray and run a bare python3 under that run's name, and its record would look like a run."""
    out, stage, runs_dir = _device_run(tmp_path, "e", ckpt_gib=0)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "runs.py gave no command line for run e" in out.stdout, out.stdout + out.stderr
    assert "KeyError: 'e'" in out.stderr
    assert not (runs_dir / "e" / "ray_start.log").exists() and not (runs_dir / "e" / "driver.log").exists()
