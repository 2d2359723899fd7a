"""Every COLO_SHIM_* variable: declared once in core/config.py, read through it, a bad value said once.

The names are found in the code itself (string constants parsed with ast), so a knob added
anywhere without a declaration fails here, and the bad-value cases iterate the declaration table,
so a declared knob cannot skip its check either. Each case runs in a fresh interpreter, as a job
would: `import colo_shim` with COLO_SHIM set, and the start-up path of `colo-shim run` (the
bootstrap sitecustomize), where strict mode must stop with one line and exit 2, not a traceback.
"""

import ast
import json
import os
import re

import pytest

from harness.procs import REPO
from helpers import TARGETS, last_json, run_python
from colo_shim.core import config

NAME = re.compile(r"^COLO_SHIM(_[A-Z0-9_]+)?$")
PKG = os.path.join(REPO, "colo_shim")
BOOTSTRAP = os.path.join(PKG, "bootstrap")
# read directly: the bootstrap runs where colo_shim may not import, so it cannot ask core/config.py
DIRECT_READERS = {os.path.join("colo_shim", "core", "config.py"), os.path.join("colo_shim", "bootstrap",
                                                                             "sitecustomize.py")}
BAD = {"families": "bogus", "choice": "wrong", "bool": "maybe", "number": "abc", "level": "loud",
       "newdir": "/proc/nope/status"}
TABLE = last_json(run_python("""
    import json
    from colo_shim.core import config, knobs
    print(json.dumps({"knobs": {k.name: k.kind for k in config.KNOBS.values()}, "kinds": knobs.KINDS,
                      "harness": config.HARNESS_PREFIXES, "off": config._OFF, "guesses": list(config._MEANT),
                      "retired": config.RETIRED_STAGE_KNOBS}))
""", timeout=60))
KNOBS = TABLE["knobs"]
LIVE = sorted(name for name, kind in KNOBS.items() if kind != "retired")  # a retired knob has no bad value


def _sources(*roots):
    for root in roots:
        for folder, _, files in os.walk(os.path.join(REPO, root)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    yield os.path.relpath(path, REPO), ast.parse(open(path).read(), path)
    pth = os.path.join(REPO, "activator", "colo_shim.pth")
    yield os.path.relpath(pth, REPO), ast.parse(open(pth).read(), pth)


def _names(tree) -> set:
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and NAME.match(n.value)}


def test_every_variable_the_code_reads_is_declared():
    found = {}
    for path, tree in _sources("colo_shim"):
        for name in _names(tree):
            found.setdefault(name, path)
    assert {"COLO_SHIM", "COLO_SHIM_NVRX_RELEASE", "COLO_SHIM_STAGE_PIN"} <= set(found)  # the walk sees them
    # config.py also names what is not a knob: the harness prefixes, the guesses it answers
    not_knobs = set(TABLE["harness"]) | set(TABLE["guesses"])
    undeclared = {name: path for name, path in found.items() if name not in KNOBS and name not in not_knobs}
    assert not undeclared, f"declare these in colo_shim/core/config.py KNOBS: {undeclared}"


def test_harness_variables_use_a_reserved_prefix():
    # a test or bench variable under any other name would be flagged as a typo in the processes it reaches
    stray = {}
    for root in ("tests", "bench", "harness"):
        for path, tree in _sources(root):
            if os.path.abspath(os.path.join(REPO, path)) == os.path.abspath(__file__):
                continue  # misspelt on purpose, below
            for name in _names(tree):
                if name not in KNOBS and not name.startswith(tuple(TABLE["harness"])):
                    stray[name] = path
    assert not stray, f"use a prefix of config.HARNESS_PREFIXES, or declare the knob: {stray}"


def _env_names(module_trees) -> set:
    """Identifiers that hold a knob's name somewhere (ENV = config.DISCARD, TIMEOUT_ENV = "COLO_SHIM_...")."""
    held = {re.sub(r"^COLO_SHIM_?", "", n) or "ENABLE" for n in KNOBS}  # config's own constants
    grown = True
    while grown:  # to a fixpoint: ACK_ENV = config.NVRX_ACK_TIMEOUT, then a module's X = door.ACK_ENV
        grown = False
        for _, tree in module_trees:
            for node in ast.walk(tree):
                if isinstance(node, ast.Assign) and any(
                        (isinstance(v, ast.Constant) and isinstance(v.value, str) and NAME.match(v.value))
                        or (isinstance(v, ast.Attribute) and v.attr in held) for v in ast.walk(node.value)):
                    new = {t.id for target in node.targets for t in ast.walk(target) if isinstance(t, ast.Name)}
                    grown |= not new <= held
                    held |= new
    return held


def _is_environ(node) -> bool:
    return ast.unparse(node) in ("os.environ", "environ")


def test_knobs_are_read_only_through_config():
    trees = list(_sources("colo_shim"))
    held = _env_names(trees)

    def names_a_knob(arg) -> bool:
        if isinstance(arg, ast.Constant):
            return isinstance(arg.value, str) and bool(NAME.match(arg.value))
        return (isinstance(arg, ast.Name) and arg.id in held) or (isinstance(arg, ast.Attribute) and arg.attr in held)

    direct = []
    for path, tree in trees:
        if path in DIRECT_READERS or path.endswith(".pth"):
            continue
        for node in ast.walk(tree):
            key = None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
                if (node.func.attr in ("get", "pop") and _is_environ(node.func.value)) or \
                        ast.unparse(node.func) == "os.getenv":
                    key = node.args[0]
            elif isinstance(node, ast.Subscript) and _is_environ(node.value) and isinstance(node.ctx, ast.Load):
                key = node.slice
            elif isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators):
                key = node.left
            if key is not None and names_a_knob(key):
                direct.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    assert not direct, "read these through colo_shim.core.config (get, env_choice, env_float, raw):\n" + \
        "\n".join(direct)


def test_choice_and_number_readers_agree_with_the_table():
    # env_choice/env_float take the caller's choices, default, deprecated values, unit and example (their
    # signature is older than the table): the values at every call site must be the declared ones, or the
    # check and the reader differ
    calls = []
    for path, tree in _sources("colo_shim"):
        if not path.endswith(".py") or path.endswith(os.path.join("core", "config.py")):
            continue
        module = path[:-3].replace(os.sep, ".")
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("config.env_choice", "config.env_float"):
                calls.append([module, node.func.attr, [ast.unparse(a) for a in node.args],
                              {k.arg: ast.unparse(k.value) for k in node.keywords}, node.lineno])
    assert calls, "the walk found no reader"
    child = run_python("""
        import importlib, inspect, json, sys
        from colo_shim.core import config
        out = []
        for module, func, args, keywords, line in json.loads(sys.argv[1]):
            scope = vars(importlib.import_module(module))
            bound = inspect.signature(getattr(config, func)).bind(*(eval(a, scope) for a in args),
                                                                  **{k: eval(v, scope) for k, v in keywords.items()})
            bound.apply_defaults()
            used = [list(v) if isinstance(v, tuple) else v for v in bound.arguments.values()]
            knob = config.KNOBS.get(used[0])
            declared = None if knob is None else (
                [knob.name, list(knob.choices), knob.default, list(knob.deprecated)] if func == "env_choice"
                else [knob.name, knob.default, knob.unit, knob.example])
            out.append([f"{module}:{line}", used, declared])
        print(json.dumps(out))
    """, args=(json.dumps(calls),), timeout=60)
    for where, used, declared in last_json(child):
        assert used == declared, f"{where} reads {used}, config.KNOBS declares {declared}"


def test_the_start_up_gates_use_the_same_off_values():
    trees = dict(_sources("colo_shim"))
    site = next(n for n in ast.walk(trees[os.path.join("colo_shim", "bootstrap", "sitecustomize.py")])
                if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "_OFF")
    assert list(ast.literal_eval(site.value)) == TABLE["off"]
    pth = trees[os.path.join("activator", "colo_shim.pth")]
    tuples = [ast.literal_eval(n) for n in ast.walk(pth) if isinstance(n, ast.Tuple)]
    assert [list(t) for t in tuples] == [TABLE["off"]]


def test_every_kind_has_a_bad_sample_here():
    assert set(TABLE["kinds"]) - {"retired"} == set(BAD), "a new kind of knob needs a bad value in BAD"


def _job(env, *, strict=False, bootstrap=False, code="import colo_shim; colo_shim.status(); print('job ran')"):
    full = {"COLO_SHIM": "1", **env}
    if strict:
        full["COLO_SHIM_STRICT"] = "1"
    if bootstrap:  # `colo-shim run`'s path: colo_shim arms inside `site`, before any job code
        code = "print('job ran')"
    proc = run_python(code, env=full, pythonpath=(BOOTSTRAP,) if bootstrap else (), check=False, timeout=60)
    return proc, [line for line in proc.stderr.splitlines() if line.strip()]


def _bad(name):
    return "nvrx,bogus" if name == "COLO_SHIM" else BAD[KNOBS[name]]


@pytest.mark.parametrize("name", LIVE)
def test_a_bad_value_is_one_line_and_the_job_goes_on(name):
    value = _bad(name)
    proc, lines = _job({name: value})
    assert proc.returncode == 0 and proc.stdout.strip().endswith("job ran"), proc.stderr
    assert len(lines) == 1, proc.stderr
    line = lines[0]
    assert f"{name}={value!r}" in line and "valid values: " in line and line.endswith(")"), line
    if name == "COLO_SHIM_STRICT":
        assert "(taken as off" in line  # and the job went on: a bad strict switch is not strict
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("bootstrap", [False, True], ids=["import", "start-up"])
@pytest.mark.parametrize("name", sorted(set(LIVE) - {"COLO_SHIM_STRICT"}))
def test_a_bad_value_when_strict_is_one_line_and_exit_2(name, bootstrap):
    value = _bad(name)
    proc, lines = _job({name: value}, strict=True, bootstrap=bootstrap)
    assert proc.returncode == 2 and "job ran" not in proc.stdout, (proc.returncode, proc.stdout, proc.stderr)
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("colo_shim: error: ") and f"{name}={value!r}" in lines[0], lines[0]
    assert "valid values: " in lines[0] and "COLO_SHIM_STRICT=1: stopping" in lines[0], lines[0]


@pytest.mark.parametrize("name,value,says", [
    ("COLO_SHIM_NVRX_RELEAS", "stage", "did you mean COLO_SHIM_NVRX_RELEASE? (ignored; COLO_SHIM_NVRX_RELEASE "
                                       "stays 'inplace')"),
    ("COLO_SHIM_PATCHES", "nope", "families are chosen by COLO_SHIM, e.g. COLO_SHIM=nvrx,megatron (ignored"),
    ("COLO_SHIM_WHATEVER", "1", "known names: COLO_SHIM, COLO_SHIM_DISABLE"),
])
@pytest.mark.parametrize("strict", [False, True], ids=["warn", "strict"])
def test_an_unknown_name_is_flagged_with_the_nearest_known_one(name, value, says, strict):
    proc, lines = _job({name: value}, strict=strict)
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{name}={value!r} is not a colo-shim variable; " in lines[0], lines[0]
    if strict:
        assert proc.returncode == 2 and lines[0].startswith("colo_shim: error: "), proc.stderr
        assert says.split(" (ignored")[0] in lines[0]
    else:
        assert proc.returncode == 0 and says in lines[0], lines[0]


def test_harness_names_are_not_flagged():
    proc, lines = _job({"COLO_SHIM_TEST_ANYTHING": "x", "COLO_SHIM_COMPAT_DUMP": "1"}, strict=True)
    assert proc.returncode == 0 and lines == [], proc.stderr


def test_the_readers_act_on_what_the_line_says_and_say_it_once():
    # the arm-time check and each reader meet the same bad values: one line each, not two
    env = {"COLO_SHIM_NVRX_RELEASE": "wrong", "COLO_SHIM_DISCARD": "maybe", "COLO_SHIM_FENCE_TIMEOUT": "-1",
           "COLO_SHIM_NVRX_ACK_TIMEOUT": "abc", "COLO_SHIM_OFFLOAD": "maybe", "COLO_SHIM_OFFLOAD_HOST_GIB": "lots",
           "COLO_SHIM_LOG_LEVEL": "loud"}
    proc, lines = _job(env, code="""
        import json, colo_shim
        colo_shim.status()  # installs: reads the log level again
        from colo_shim.checkpoint import door, release
        from colo_shim.core import config
        from colo_shim.discard import policy
        from colo_shim.offload import budget, megatron
        print(json.dumps([release.strategy(), policy.mode(), config.env_float(config.FENCE_TIMEOUT, 0.0),
                          config.env_float(door.ACK_ENV, door.DEFAULT_ACK_TIMEOUT), megatron.on(),
                          config.OFFLOAD_HOST_GIB in budget.limit()[1]]))
    """)
    offload_default = config.KNOBS[config.OFFLOAD].default == "on"  # a bad value runs the default
    assert last_json(proc) == ["inplace", "auto", 0.0, 30.0, offload_default, False]
    assert sorted(line.split("=")[0] for line in lines) == sorted(f"colo_shim: {name}" for name in env), lines


def test_strict_with_several_bad_values_names_each_then_stops():
    proc, lines = _job({"COLO_SHIM_OFFLOAD": "maybe", "COLO_SHIM_DISCARD": "maybe"}, strict=True, bootstrap=True)
    assert proc.returncode == 2 and len(lines) == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert all(line.startswith("colo_shim: error: ") for line in lines), lines


@pytest.mark.parametrize("bootstrap", [False, True], ids=["import", "start-up"])
def test_retired_knobs_are_one_line_that_never_stops_the_job(bootstrap):
    # a job config written for stage was valid: strict or not, the job runs and hears once that they do nothing
    proc, lines = _job({name: "abc" for name in TABLE["retired"]}, strict=True, bootstrap=bootstrap)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("job ran"), proc.stderr
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{', '.join(TABLE['retired'])} have no effect since stage was retired" in lines[0], lines[0]


def test_a_deprecated_choice_is_one_line_at_start_up_that_never_stops_the_job():
    # checked at arm time and read again for doctor's row, it is still one line: tests/cli/test_doctor.py
    proc, lines = _job({"COLO_SHIM_NVRX_RELEASE": "stage"}, strict=True, bootstrap=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "job ran", proc.stderr
    assert len(lines) == 1 and "COLO_SHIM_NVRX_RELEASE=stage is deprecated" in lines[0], proc.stderr


def test_a_status_dir_that_cannot_be_made_is_said_at_start_not_at_exit():
    proc, lines = _job({"COLO_SHIM_STATUS_DIR": "/proc/nope/status"})
    assert proc.returncode == 0 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "(using the default: unset (no status files))" in lines[0], lines[0]


def test_install_in_code_checks_the_environment_too():
    # no COLO_SHIM: the job turns the shim on in code, and its settings still get their word
    proc = run_python("""
        import shimtest_family, colo_shim
        shimtest_family.register_all()
        colo_shim.install(["shimtest"])
        print('job ran')
    """, pythonpath=(TARGETS,), env={"COLO_SHIM_NVRX_RELEAS": "stage"}, timeout=60)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.stdout.strip() == "job ran" and len(lines) == 1 and "COLO_SHIM_NVRX_RELEAS" in lines[0], lines
