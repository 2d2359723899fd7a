"""Which families COLO_SHIM and COLO_SHIM_DISABLE select, read in fresh interpreters the way a job sets them.

Bad values of every knob, strict or not, and misspelt names: tests/core/test_knobs.py.
"""

import json

import pytest

from helpers import TARGETS, last_json, run_python

PROBE = """
    import json, colo_shim
    from colo_shim.core import registry
    colo_shim.status()  # fires the armed install
    print(json.dumps(sorted(registry._enabled)))
"""


@pytest.mark.parametrize("value,expected", [
    ("1", ["megatron", "nvrx", "offload", "vllm"]), ("all", ["megatron", "nvrx", "offload", "vllm"]),
    (" ALL ", ["megatron", "nvrx", "offload", "vllm"]), ("true", ["megatron", "nvrx", "offload", "vllm"]),
    ("Yes", ["megatron", "nvrx", "offload", "vllm"]), ("ON", ["megatron", "nvrx", "offload", "vllm"]),
    ("nvrx", ["nvrx"]), ("vllm, megatron", ["megatron", "vllm"]), ("0", []), ("", []),
])
def test_colo_shim_selects_patches(value, expected):
    child = run_python(PROBE, env={"COLO_SHIM": value})
    assert last_json(child) == expected
    assert "unknown" not in child.stderr


def test_unset_means_off_and_imports_nothing_heavy():
    child = run_python("""
        import json, sys, colo_shim
        print(json.dumps([m for m in ("wrapt", "torch", "vllm", "megatron", "nvidia_resiliency_ext",
                                      "colo_shim.core.registry") if m in sys.modules]))
    """)
    assert last_json(child) == []
    assert child.stderr == ""


STRICT_ARGUMENT = """
    import json, sys, colo_shim
    from colo_shim.core import config, registry
    try:
        colo_shim.install(patches=json.loads(sys.argv[1]), strict=json.loads(sys.argv[2]))
        print(json.dumps(["installed", sorted(registry._enabled)]))
    except config.ConfigError as exc:
        print(json.dumps(["refused", str(exc)]))
"""


@pytest.mark.parametrize("patches,env,says", [
    (["nope"], {}, "install(patches=['nope']) names unknown patch(es) nope"),
    (["nope"], {"COLO_SHIM_STRICT": "0"}, "install(patches=['nope']) names unknown patch(es) nope"),
    (None, {"COLO_SHIM": "nvrx,nope"}, "COLO_SHIM='nvrx,nope' names unknown patch(es) nope"),
    (["nvrx"], {"COLO_SHIM_DISCARD": "maybe"}, "COLO_SHIM_DISCARD='maybe' is not valid"),
    (["nvrx"], {"COLO_SHIM_DISABLE": "nope"}, "COLO_SHIM_DISABLE='nope' names unknown patch(es) nope"),
])
def test_install_strict_argument_counts_as_much_as_the_environment(patches, env, says):
    # the caller's strict=True raises to that caller, whatever COLO_SHIM_STRICT says (issue 35, item 1)
    child = run_python(STRICT_ARGUMENT, args=(json.dumps(patches), "true"), env=env)
    verdict, message = last_json(child)
    assert verdict == "refused" and message.startswith(says), (verdict, message, child.stderr)


def test_install_strict_false_argument_only_warns_under_a_strict_environment():
    child = run_python(STRICT_ARGUMENT, args=('["nope"]', "false"), env={"COLO_SHIM_STRICT": "1"})
    assert last_json(child) == ["installed", []]
    assert "install(patches=['nope']) names unknown patch(es) nope" in child.stderr, child.stderr


def test_disable_list_wins():
    child = run_python(PROBE, env={"COLO_SHIM": "all", "COLO_SHIM_DISABLE": "nvrx,vllm,offload"})
    assert last_json(child) == ["megatron"]


@pytest.mark.parametrize("var,value", [("COLO_SHIM", "yes please"), ("COLO_SHIM", "nvrx,bogus"),
                                       ("COLO_SHIM_DISABLE", "bogus")])
def test_bad_value_gives_one_clear_line(var, value):
    env = {"COLO_SHIM": "1", var: value}
    child = run_python(PROBE, env=env)
    lines = [line for line in child.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, child.stderr
    assert "bogus" in lines[0] or "yes please" in lines[0]
    assert "valid values" in lines[0] and "nvrx" in lines[0] and "megatron" in lines[0]
    if value == "nvrx,bogus":
        assert last_json(child) == ["nvrx"]


def test_family_knobs_validate_values():
    child = run_python("""
        import json
        from colo_shim.core import config as _config
        print(json.dumps([_config.env_choice("X_CHOICE", ("auto", "always", "never"), "auto"),
                          _config.env_float("X_FLOAT", 5.0), _config.env_float("X_NEG", 5.0)]))
    """, env={"X_CHOICE": "Sometimes", "X_FLOAT": "2.5", "X_NEG": "-1"})
    assert last_json(child) == ["auto", 2.5, 5.0]
    assert "X_CHOICE='Sometimes' is not valid; valid values: auto, always, never" in child.stderr
    assert "X_NEG='-1' is not valid" in child.stderr


def test_offload_knobs_are_read_through_config():
    child = run_python("""
        import json
        from colo_shim.offload import budget, megatron
        print(json.dumps([megatron.on(), budget.limit()]))
    """, env={"COLO_SHIM_OFFLOAD": "Maybe", "COLO_SHIM_OFFLOAD_HOST_GIB": "-3", "LOCAL_WORLD_SIZE": "4"})
    on, (cap, source) = last_json(child)
    # node-wide: the node's ranks share one budget in the node's ledger, whatever LOCAL_WORLD_SIZE says
    assert on is (megatron_default() == "on") and cap > 0 and source.startswith("0.5 x (MemAvailable "), source
    assert "COLO_SHIM_OFFLOAD='Maybe' is not valid; valid values: on, off" in child.stderr
    assert "COLO_SHIM_OFFLOAD_HOST_GIB='-3' is not valid; valid values: a non-negative number of GiB" in child.stderr
    child = run_python("""
        import json
        from colo_shim.offload import budget, megatron
        print(json.dumps([megatron.on(), budget.limit()]))
    """, env={"COLO_SHIM_OFFLOAD": "off", "COLO_SHIM_OFFLOAD_HOST_GIB": "1.5"})
    assert last_json(child) == [False, [3 << 29, "COLO_SHIM_OFFLOAD_HOST_GIB=1.5 (per node)"]]


def megatron_default() -> str:
    from colo_shim.offload import megatron

    return megatron.DEFAULT


def test_log_level_attaches_one_handler():
    child = run_python("""
        import logging, shimtest_family, colo_shim
        shimtest_family.register_all()
        colo_shim.install(["shimtest"]); colo_shim.install(["shimtest"])
        print(len(logging.getLogger("colo_shim").handlers))
    """, pythonpath=(TARGETS,), env={"COLO_SHIM_LOG_LEVEL": "info"})
    assert child.stdout.strip() == "1"


def test_retired_stage_knobs_get_one_line_when_the_process_starts_even_when_strict():
    """COLO_SHIM_STAGE_* belonged to the retired stage release: a config that still sets them was
    valid, so the job runs, and one line (not one per read) says they do nothing now."""
    child = run_python("""
        import colo_shim
        from colo_shim.core import config
        config.retired_knobs()
        print('job ran')
    """, env={"COLO_SHIM": "nvrx", "COLO_SHIM_STRICT": "1", "COLO_SHIM_STAGE_PIN": "0",
              "COLO_SHIM_STAGE_SHM_BYTES": "1e9"})
    lines = [line for line in child.stderr.splitlines() if line.strip()]
    assert child.stdout.strip() == "job ran" and len(lines) == 1, child.stderr
    assert "COLO_SHIM_STAGE_PIN, COLO_SHIM_STAGE_SHM_BYTES have no effect since stage was retired" in lines[0], lines
