"""The discard policy reads the DAPO switch from every config type, and keeps when it cannot (issue 8 item 2).

In-process, on real pydantic models shaped as NeMo-RL main's (`BaseModel, extra="allow"`, PR #2518)
and on the dicts of v0.3-v0.7, from real frames of functions named as NeMo-RL's loops (the
policy recognises a loop by its frame's module and function name and reads its locals).
"""

from __future__ import annotations

import sys
import types

import pytest
from pydantic import BaseModel

from colo_shim.discard import policy

DAPO = "DAPO dynamic sampling"


class GRPOConfig(BaseModel, extra="allow"):  # main's field and default
    use_dynamic_sampling: bool = False


class PPOConfig(BaseModel, extra="allow"):
    use_dynamic_sampling: bool = False
    policy_training_start_step: int = 0


class OtherConfig(BaseModel, extra="forbid"):  # a section without the field
    max_num_steps: int = 1


class MasterConfig(BaseModel, extra="allow"):
    policy: dict
    grpo: GRPOConfig


def loop_frame(module: str, function: str, master_config, has_dynamic_sampling: bool = True, **more):
    """A real frame of `module.function(master_config, ...)`, as the policy finds it on the stack."""
    namespace = {"__name__": module, "sys": sys}
    if has_dynamic_sampling:
        namespace["dynamic_sampling"] = lambda *a, **k: None
    params = ", ".join(["master_config", *more])
    exec(f"def {function}({params}):\n    return sys._getframe()", namespace)
    return namespace[function](master_config, **more)


GRPO = ("nemo_rl.algorithms.grpo", "grpo_train")


@pytest.mark.parametrize("config,level", [
    ({"grpo": {"use_dynamic_sampling": True}}, 1),                               # v0.4-v0.6 dicts
    ({"grpo": {"use_dynamic_sampling": False}}, 2),
    (MasterConfig(policy={}, grpo={"use_dynamic_sampling": True}), 1),          # main: pydantic section
    (MasterConfig(policy={}, grpo={}), 2),                                      # main's default: False
    (types.SimpleNamespace(grpo={"use_dynamic_sampling": True}), 1),            # v0.7: object over dict sections
    (types.SimpleNamespace(grpo=types.SimpleNamespace(use_dynamic_sampling=True)), 1),
])
def test_grpo_dapo_switch_from_every_config_type(config, level):
    got, reason = policy._auto("grpo", loop_frame(*GRPO, config))
    assert got == level, reason
    assert (DAPO in reason) == (level == 1)


@pytest.mark.parametrize("config", [
    {"grpo": {}},                                                  # a release with DAPO, key absent
    {"policy": {}},                                                # no grpo section at all
    types.SimpleNamespace(grpo=OtherConfig()),                      # a model without the field
    {"grpo": {"use_dynamic_sampling": None}},                      # not a bool
    types.SimpleNamespace(grpo=42),                                # not a section
])
def test_unreadable_switch_keeps(config):
    level, reason = policy._auto("grpo", loop_frame(*GRPO, config))
    assert (level, reason) == (1, "grpo: grpo.use_dynamic_sampling not readable")


def test_release_without_dapo_does_not_need_the_switch():
    """v0.3.1: no dynamic_sampling in grpo.py, no use_dynamic_sampling in its config."""
    level, _ = policy._auto("grpo", loop_frame(*GRPO, {"grpo": {}}, has_dynamic_sampling=False))
    assert level == 2
    config = {"grpo": {"use_dynamic_sampling": True}}  # a value that is there is still obeyed
    assert policy._auto("grpo", loop_frame(*GRPO, config, has_dynamic_sampling=False))[0] == 1


def test_ppo_and_grpo_sync_read_pydantic_sections():
    mc = types.SimpleNamespace(ppo=PPOConfig(use_dynamic_sampling=True))
    level, reason = policy._auto("ppo", loop_frame("nemo_rl.algorithms.ppo", "ppo_train", mc,
                                                    total_steps=5, policy_training_start_step=0))
    assert level == 1 and DAPO in reason
    mc = types.SimpleNamespace(ppo=PPOConfig())
    level, reason = policy._auto("ppo", loop_frame("nemo_rl.algorithms.ppo", "ppo_train", mc,
                                                    total_steps=5, policy_training_start_step=0))
    assert level == 2, reason
    for dapo, want in ((True, 1), (False, 2)):
        mc = MasterConfig(policy={}, grpo={"use_dynamic_sampling": dapo})
        frame = loop_frame("nemo_rl.algorithms.grpo_sync", "grpo_train_sync", mc, has_dynamic_sampling=False)
        assert policy._auto("grpo_sync", frame)[0] == want


def test_distillation_has_no_dapo_section():
    mc = types.SimpleNamespace(distillation=OtherConfig(), policy={})
    level, reason = policy._auto("distillation", loop_frame("nemo_rl.algorithms.distillation",
                                                            "distillation_train", mc))
    assert level == 2, reason


def test_read_walks_mappings_models_and_attributes():
    mc = MasterConfig(policy={"generation": {"colocated": {"enabled": True}}}, grpo={"extra_key": 3})
    assert policy.read(mc, "policy", "generation", "colocated", "enabled") is True
    assert policy.read(mc, "grpo", "extra_key") == 3                       # extra="allow" fields
    assert policy.read(mc, "grpo", "nope") is policy.MISSING
    assert policy.read(None, "grpo") is policy.MISSING
    assert policy.read({"a": None}, "a", "b") is policy.MISSING

    class Raises:
        @property
        def grpo(self):
            raise RuntimeError("boom")

    assert policy.read(Raises(), "grpo") is policy.MISSING
