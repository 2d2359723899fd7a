"""Subprocess driver: the engine (vLLM's LLM or AsyncLLM, the double) driven as NeMo-RL's worker drives it.

The CPU twin of bench/real_vllm/scenarios.py (which runs the same order on real vLLM): setup
finish, then per step a refit through `collective_rpc("update_weights_via_ipc_zmq")` of the
v0.7 worker extension (load_weights, then process_weights_after_loading), a rollout generation
and a rollout finish; every VAL steps a refit, a validation generation and a validation finish
(the next step generates on the same weights). A finish is `wake_up(tags=<control tags>)` then
`sleep(level=1)` with the shim, `sleep(level=N)` without. The trainer double changes the weights
on every step, so stale derived tensors change the tokens.
Usage: python tests/discard/vllm_engine_order.py '{"mode": "shim", "api": "llm", "model": "tiny-0", ...}'
Prints RESULT <json>.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

ARGS = json.loads(sys.argv[1])
os.environ.setdefault("NRL_DOUBLE_REFIT_PATH", tempfile.mktemp(prefix="refit-"))
if ARGS["mode"] == "shim":
    import colo_shim

    colo_shim.install(["vllm"])

import logging  # noqa: E402

import torch  # noqa: E402

import _vllm_support as sup  # noqa: E402

WARNINGS: list[str] = []
if ARGS.get("break_release"):  # the worker's torch call fails (e.g. a CUDA error): the sleep must still run
    def _broken():
        raise RuntimeError("host allocator unavailable")
    torch._C._host_emptyCache = _broken
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: WARNINGS.append(record.getMessage())
    logging.getLogger("colo_shim").addHandler(handler)

EXT = "nemo_rl.models.generation.vllm.vllm_backend.VllmInternalWorkerExtension"
PROMPTS = [[3, 5, 7, 11, 13], [2, 4, 8, 16, 32], [9, 1, 40, 2, 33]]


class Engine:
    def __init__(self, api: str, model: str, speculative: bool):
        kw = {"model": model, "seed": 0, "enable_sleep_mode": True, "worker_extension_cls": EXT}
        if speculative:
            kw["speculative_config"] = {"method": "draft_model", "num_speculative_tokens": 2}
        self.api = api
        if api == "async":
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM

            self.loop = asyncio.new_event_loop()
            self.llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**kw))
        else:
            import vllm

            self.llm = vllm.LLM(**kw)

    def call(self, name, *args, **kwargs):
        out = getattr(self.llm, name)(*args, **kwargs)
        return self.loop.run_until_complete(out) if self.api == "async" else out

    def generate(self) -> list[list[int]]:
        import vllm

        sp = vllm.SamplingParams(temperature=0.0, max_tokens=6)
        if self.api != "async":
            return [o.outputs[0].token_ids for o in self.llm.generate([{"prompt_token_ids": p} for p in PROMPTS], sp)]

        async def every():
            outs = []
            for i, p in enumerate(PROMPTS):
                async for out in self.llm.generate({"prompt_token_ids": p}, sp, request_id=str(i)):
                    outs.append(out.outputs[0].token_ids)
            return outs
        return self.loop.run_until_complete(every())


def pinned() -> int:
    return int(torch.cuda.host_memory_stats().get("allocated_bytes.current", 0))


def main() -> None:
    mode, steps, val = ARGS["mode"], ARGS.get("steps", 6), ARGS.get("val", 3)
    eng = Engine(ARGS.get("api", "llm"), ARGS.get("model", "tiny-0"), ARGS.get("speculative", False))
    policy = sup.PolicyDouble(os.environ["NRL_DOUBLE_REFIT_PATH"], plain="plain" in ARGS.get("model", ""))
    core = eng.llm.core
    res = {"finishes": [], "outputs": [], "guard": None}

    def finish(kind):
        if mode == "shim":
            want = 1 if kind == "validation" else 2
            eng.call("wake_up", tags=[f"colo_shim:sleep_level={want}", f"colo_shim:site=test:{kind}"])
            eng.call("sleep", level=1)
        else:
            eng.call("sleep", level=1 if mode == "l1" else 2)
        res["finishes"].append({"kind": kind, "level": core.events[-1]["level"], "pinned": pinned()})

    def refit():
        policy.stream_weights_via_ipc_zmq()
        eng.call("wake_up", tags=["weights"])
        eng.call("collective_rpc", "update_weights_via_ipc_zmq")
        eng.call("wake_up", tags=["kv_cache"])

    finish("setup")
    stale = True
    for step in range(1, steps + 1):
        if stale or mode == "l2":
            refit()
        else:
            eng.call("wake_up")
        res["outputs"].append(eng.generate())
        finish("rollout")
        policy.train(None, None)
        stale = True
        if step % val == 0:
            refit()
            res["outputs"].append(eng.generate())
            finish("validation")
            stale = False
    res["nan_generations"] = core.nan_generations
    res["warnings"] = WARNINGS
    if mode == "shim":
        from colo_shim.discard import guard

        shim = [s for s in colo_shim.status() if s["name"] == "vllm"][0]["details"]
        res["host_memory"] = shim.get("host_memory")
        res["engine"] = guard.state_for(eng.llm).report()
    print("RESULT " + json.dumps(res, default=str))


if __name__ == "__main__":
    main()
