"""colo-shim's `vllm` family on REAL vLLM (issue 9): run on the GPU machine by bench/real_vllm/device.sh.

    python bench/real_vllm/scenarios.py OUT_DIR NAME [NAME ...]     # each NAME in its own subprocess
    python bench/real_vllm/scenarios.py --one NAME OUT_DIR          # one scenario, this process

A scenario drives one engine (vLLM's LLM or AsyncLLM) through NeMo-RL's colocated GRPO order:
setup finish, then per step: refit (if the weights are stale), rollout generation, rollout finish
(a refit follows), and every VAL steps a refit, a validation generation and a validation finish
(no refit follows: the next step generates on the same weights). How a finish sleeps:
  l1   - vLLM alone, always sleep(level=1)    (today's NeMo-RL; the tokens reference)
  l2   - vLLM alone, always sleep(level=2), a refit before every generation (the host-memory reference)
  shim - colo-shim installed; each finish sends the driver's control tags on wake_up, then
         sleep(level=1), exactly as NeMo-RL's worker calls the engine (level 2 for setup/rollout,
         1 for validation); the engine-side wrappers decide what really runs.
After every finish it records the pinned host memory of the engine process (torch's caching host
allocator, through collective_rpc) and the RSS of the whole process tree; after every generation
the greedy token ids (and the drafter's digest). The shim runs end with the guard check: a
discarding finish, then a full wake_up() and a generate() without a refit must both raise.
Prints RESULT <json>; the parent writes OUT_DIR/<name>.json and prints a table (report.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
MODELS = os.environ.get("BENCH_MODELS", "/tmp/models")
DOUBLE = os.environ.get("BENCH_DOUBLE") == "1"  # CPU smoke run on tests/doubles/vllm_engine
STEPS, VAL = int(os.environ.get("BENCH_STEPS", "6")), int(os.environ.get("BENCH_VAL", "3"))

# name -> (engine api, mode, model, extra engine kwargs, refit mode)
SCENARIOS = {
    "main_l1": ("llm", "l1", "main", {}, "nemo"),
    "main_l2": ("llm", "l2", "main", {}, "nemo"),
    "main_shim": ("llm", "shim", "main", {}, "nemo"),
    "async_shim": ("async", "shim", "main", {}, "nemo"),
    "fp8_l1": ("llm", "l1", "small", {"quantization": "fp8"}, "reload"),
    "fp8_shim": ("llm", "shim", "small", {"quantization": "fp8"}, "reload"),
    "draft_l1": ("llm", "l1", "small", {"speculative": "small"}, "nemo"),
    "draft_shim": ("llm", "shim", "small", {"speculative": "small"}, "nemo"),
}


def rss_tree() -> int:
    """RSS of this process and all its descendants (the engine core is a child), bytes."""
    kids: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            kids.setdefault(int(fields[1]), []).append(int(pid))
            rss[int(pid)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    total, todo = 0, [os.getpid()]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo.extend(kids.get(pid, []))
    return total


class Engine:
    """LLM or AsyncLLM behind one synchronous face (AsyncLLM calls run on a private loop)."""

    def __init__(self, api: str, model: str, extra: dict):
        kw = dict(extra)
        spec = kw.pop("speculative", None)
        if DOUBLE:
            kw = {"model": "tiny-plain-0", "seed": 0, "enable_sleep_mode": True,
                  "worker_extension_cls": "refit_ext.RefitExtension"}
            if spec:
                kw["speculative_config"] = {"method": "draft_model", "num_speculative_tokens": 2}
        else:
            kw.update(model=os.path.join(MODELS, model), enable_sleep_mode=True, enforce_eager=True, seed=0,
                      dtype="bfloat16", max_model_len=512, max_num_seqs=8, gpu_memory_utilization=0.25,
                      worker_extension_cls="refit_ext.RefitExtension")
            if spec:
                kw["speculative_config"] = {"method": "draft_model", "model": os.path.join(MODELS, spec),
                                            "num_speculative_tokens": 2}
        self.api = api
        if api == "async":
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM

            self.loop = asyncio.new_event_loop()

            async def make():
                return AsyncLLM.from_engine_args(AsyncEngineArgs(**kw))
            self.llm = self.loop.run_until_complete(make())
        else:
            import vllm

            self.llm = vllm.LLM(**kw)
        self.n = 0

    def call(self, name, *args, **kwargs):
        out = getattr(self.llm, name)(*args, **kwargs)
        return self.loop.run_until_complete(out) if self.api == "async" else out

    def generate(self, prompts, max_tokens=24) -> list[list[int]]:
        import vllm

        sp = vllm.SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        if self.api != "async":
            outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
            return [list(o.outputs[0].token_ids) for o in outs]

        async def one(p):
            self.n += 1
            final = None
            async for out in self.llm.generate({"prompt_token_ids": p}, sp, request_id=f"r{self.n}"):
                final = out
            return list(final.outputs[0].token_ids)

        async def every():
            return await asyncio.gather(*(one(p) for p in prompts))
        return self.loop.run_until_complete(every())

    def close(self):
        try:
            if self.api == "async":
                self.llm.shutdown()
        except Exception:
            pass


def prompts() -> list[list[int]]:
    top = 60 if DOUBLE else 500
    return [[(7 * i + 13 * j + 5) % top + 4 for j in range(6 + i)] for i in range(4)]


def run(name: str) -> dict:
    api, mode, model, extra, refit_mode = SCENARIOS[name]
    guard = hm = None
    if mode == "shim":
        import colo_shim

        colo_shim.install(["vllm"])
        from colo_shim.discard import guard
        try:
            from colo_shim.discard import host_memory as hm
        except ImportError:
            hm = None
    from refit_ext import derived_rpc, drafter_digest_rpc, host_pinned_rpc

    t0 = time.perf_counter()
    eng = Engine(api, model, extra)
    res: dict = {"name": name, "api": api, "mode": mode, "model": model, "extra": {k: str(v) for k, v in extra.items()},
                 "engine_start_s": round(time.perf_counter() - t0, 1), "finishes": [], "generations": []}
    try:
        import vllm

        res["vllm_version"] = getattr(vllm, "__version__", "double")
    except Exception:
        pass
    pin = lambda: eng.call("collective_rpc", host_pinned_rpc)[0]  # noqa: E731
    res["pinned_at_start"] = pin()
    res["rss_at_start"] = rss_tree()
    res["derived"] = eng.call("collective_rpc", derived_rpc)[0]
    res["drafter_at_start"] = eng.call("collective_rpc", drafter_digest_rpc)[0]

    def finish(kind: str):
        want = 1 if kind == "validation" else 2
        t = time.perf_counter()
        if mode == "shim":
            eng.call("wake_up", tags=[f"colo_shim:sleep_level={want}", f"colo_shim:site=bench:{kind}"])
            eng.call("sleep", level=1)
        else:
            eng.call("sleep", level=1 if mode == "l1" else 2)
        row = {"kind": kind, "sleep_s": round(time.perf_counter() - t, 3),
               "level": {"l1": 1, "l2": 2}.get(mode)}
        if guard is not None:
            hist = guard.state_for(eng.llm).history
            row["level"] = hist[-1]["level"] if hist else None
            row["reason"] = hist[-1].get("reason") if hist else None
        if hm is not None and hasattr(hm, "last"):
            row["host_release"] = hm.last(eng.llm)
        p = pin()
        row.update(pinned_host_bytes=p.get("held"), pinned_active_bytes=p.get("active"), rss_tree_bytes=rss_tree())
        res["finishes"].append(row)

    def refit(step: int):
        eng.call("wake_up", tags=["weights"])
        ok = eng.call("collective_rpc", "update_weights_from_path", args=(step, refit_mode))
        eng.call("wake_up", tags=["kv_cache"])
        return ok

    def gen(kind: str, step: int, refitted: bool):
        if not refitted:
            eng.call("wake_up")
        toks = eng.generate(prompts())
        res["generations"].append({"kind": kind, "step": step, "tokens": toks,
                                   "drafter": eng.call("collective_rpc", drafter_digest_rpc)[0]})

    finish("setup")
    stale = True
    for step in range(1, STEPS + 1):
        if stale or mode == "l2":
            refit(step)
        gen("rollout", step, stale or mode == "l2")
        finish("rollout")
        stale = True  # training follows
        if step % VAL == 0:
            refit(step + 1)
            gen("validation", step, True)
            finish("validation")
            stale = False
    if mode == "shim":
        res["guard"] = guard_check(eng, guard, finish)
        res["shim_report"] = guard.state_for(eng.llm).report()
        if hm is not None and hasattr(hm, "report"):
            res["host_memory_report"] = hm.report()
    eng.close()
    return res


def guard_check(eng, guard, finish) -> dict:
    out = {}
    eng.call("wake_up")  # the run ended on a validation finish: the next rollout generates, then discards
    eng.generate(prompts()[:1], 2)
    finish("rollout")
    for what, call in (("full_wake_up", lambda: eng.call("wake_up")),
                       ("generate", lambda: eng.generate(prompts()[:1], 2))):
        try:
            call()
            out[what] = "no error"
        except guard.ColoShimDiscardError as exc:
            out[what] = "ColoShimDiscardError: " + str(exc)[:160]
        except Exception as exc:  # noqa: BLE001 - recorded: anything else is a failure
            out[what] = f"{type(exc).__name__}: {str(exc)[:160]}"
    out["raised"] = all(v.startswith("ColoShimDiscardError") for v in out.values())
    return out


def main() -> None:
    if sys.argv[1] == "--one":
        name, out_dir = sys.argv[2], sys.argv[3]
        try:
            res = run(name)
        except BaseException as exc:  # noqa: BLE001 - one failing scenario must not stop the others
            traceback.print_exc()
            res = {"name": name, "error": f"{type(exc).__name__}: {exc}"[:2000]}
        with open(os.path.join(out_dir, f"{name}.json"), "w") as fh:
            json.dump(res, fh)
        sys.stdout.flush()
        os._exit(0)  # vLLM's engine-core children and atexit hooks must not hang the run
    out_dir, names = sys.argv[1], sys.argv[2:] or list(SCENARIOS)
    os.makedirs(out_dir, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, REPO, os.environ.get("PYTHONPATH", "")]))
    limit = float(os.environ.get("BENCH_SCENARIO_TIMEOUT", "240"))
    for name in names:
        t = time.perf_counter()
        log = os.path.join(out_dir, f"{name}.log")
        with open(log, "w") as fh:
            proc = subprocess.Popen([sys.executable, __file__, "--one", name, out_dir], env=env, stdout=fh,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            try:
                rc = proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                rc = "timeout"
            try:  # the engine core and its helpers live in the scenario's own session: end them all
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        path = os.path.join(out_dir, f"{name}.json")
        if not os.path.exists(path):
            with open(path, "w") as fh:
                json.dump({"name": name, "error": f"no result (rc={rc}); see {name}.log"}, fh)
        print(f"[{name}] rc={rc} {time.perf_counter() - t:.0f}s", flush=True)
        if json.load(open(path)).get("error"):
            print(open(log).read()[-2500:], flush=True)
    import report

    report.main(out_dir)


if __name__ == "__main__":
    main()
