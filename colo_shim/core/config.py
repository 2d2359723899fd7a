"""Environment switches: every COLO_SHIM_* variable is declared in KNOBS below and read through here.

Read on every call rather than cached at import, because drivers set them late (Ray runtime_env,
launch scripts) and tests flip them per subprocess. A bad value must never stop a 1,000-GPU job,
so it costs one line per process naming the variable, the value, what is valid and what applies
instead; COLO_SHIM_STRICT=1 turns that line into an error: on stderr, exit status 2, no traceback
(a traceback from inside an import or a .pth line reads like a crash of the shim, not a typo of the
user's). The whole environment is checked when the shim arms, so a value read hours later (a fence
timeout) and a misspelt name (the knob silently keeps its default) get their word at start-up.
Declaring each knob once, with its kind, default and meaning, keeps that check, the readers and
the documentation from drifting apart; tests/core/test_knobs.py finds every name the code reads.
"""

import os
import sys

from colo_shim.core.knobs import TRUE, Knob, parse, problem, shown

ENABLE = "COLO_SHIM"
DISABLE = "COLO_SHIM_DISABLE"
STRICT = "COLO_SHIM_STRICT"
LOG_LEVEL = "COLO_SHIM_LOG_LEVEL"
STATUS_DIR = "COLO_SHIM_STATUS_DIR"
FENCE_TIMEOUT = "COLO_SHIM_FENCE_TIMEOUT"
FENCE_WARN_EVERY = "COLO_SHIM_FENCE_WARN_EVERY"
NVRX_RELEASE = "COLO_SHIM_NVRX_RELEASE"
NVRX_ACK_TIMEOUT = "COLO_SHIM_NVRX_ACK_TIMEOUT"
DISCARD = "COLO_SHIM_DISCARD"
# the offload family: its mirrors on or off, the host memory they may hold per node, the node's ledger of it
OFFLOAD = "COLO_SHIM_OFFLOAD"
OFFLOAD_HOST_GIB = "COLO_SHIM_OFFLOAD_HOST_GIB"
LEDGER_DIR = "COLO_SHIM_LEDGER_DIR"
# knobs of the stage release, retired in issue 22: set, they cost one line (never an error), not silence
RETIRED_STAGE_KNOBS = ("COLO_SHIM_STAGE_PIN", "COLO_SHIM_STAGE_LEDGER_WAIT", "COLO_SHIM_STAGE_SHM_BYTES",
                       "COLO_SHIM_STAGE_SHM_DIR")
# what a deprecated value runs as: said once per process, at arm time and where it is read (never an
# error, strict or not: the value is valid, so job configs that name it keep running)
DEPRECATED = {(NVRX_RELEASE, "stage"): "stage was retired and runs as inplace, which no longer waits for the "
                                       "checkpoint write; unset it or set inplace"}
EXIT_STRICT = 2
# the project's own test and benchmark harness reads these; the shim never does
HARNESS_PREFIXES = ("COLO_SHIM_TEST_", "COLO_SHIM_COMPAT_", "COLO_SHIM_NEMO_RL_")
# names people reach for that mean another knob (the CLI's flag is --patches), and how to say it
_MEANT = dict.fromkeys(("COLO_SHIM_PATCHES", "COLO_SHIM_FAMILIES", "COLO_SHIM_ENABLE"),
                       "families are chosen by COLO_SHIM, e.g. COLO_SHIM=nvrx,megatron")

_OFF = ("", "0", "off", "false", "no")  # the .pth line and bootstrap/sitecustomize.py repeat it (tested)
_ALL = ("1", "all", "true", "yes", "on")  # what a user who means "on" writes
_said: set = set()
_checked = False


KNOBS = {k.name: k for k in (
    Knob(ENABLE, "families", "", "turns the shim on in every process that inherits it: 1/all/true/yes/on or families",
         unset="off"),
    Knob(DISABLE, "families", "", "families subtracted from COLO_SHIM", unset="none"),
    Knob(STRICT, "bool", False, "a bad value, unsupported target or failed patch stops the process (exit 2)"),
    Knob(LOG_LEVEL, "level", "", "a stderr handler on the colo_shim logger at this level",
         unset="the host's logging decides"),
    Knob(STATUS_DIR, "newdir", "", "each activated process writes <host>-<pid>.json there at exit (doctor --from)",
         unset="no status files"),
    Knob(FENCE_TIMEOUT, "number", 0.0, "a rank waiting longer at a fence raises (0: wait as long as the write)"),
    Knob(FENCE_WARN_EVERY, "number", 60.0, "how often a waiting fence says what it waits for (0: never)"),
    Knob(NVRX_RELEASE, "choice", "inplace", "how the NVRx writer lets go of GPU memory",
         choices=("inplace", "restart", "none"), deprecated=("stage",)),
    Knob(NVRX_ACK_TIMEOUT, "number", 30.0, "how long an offload waits for the writer's answer at its side door "
         "before it waits for the write instead"),
    Knob(DISCARD, "choice", "auto", "vLLM sleep level at finish_generation(refit_pending=None)",
         choices=("auto", "always", "never")),
    Knob(OFFLOAD, "choice", "on", "family offload: optimizer offload/reload through page-locked mirrors "
         "(on: the H200 host peak rose 0.89 GiB, the step fell to 0.37x; off keeps the original copies)",
         choices=("on", "off")),
    Knob(OFFLOAD_HOST_GIB, "number", None, "host memory the offload mirrors (and the NVRx writers' host copies) of "
         "all processes on a node may hold together; over it, the original copy runs", unset="half of MemAvailable, "
         "fixed by the node's first process", unit="GiB", example="64"),
    Knob(LEDGER_DIR, "newdir", "", "node-local directory of the ledger in which a node's processes share that budget",
         unset="/dev/shm"),
    *(Knob(name, "retired", "", "retired with COLO_SHIM_NVRX_RELEASE=stage: no effect")
      for name in RETIRED_STAGE_KNOBS),
)}


class ConfigError(ValueError):
    """An argument colo-shim cannot honour (install(patches=...), strict=True): raised to the caller."""


def strict() -> bool:
    return os.environ.get(STRICT, "").strip().lower() in TRUE


def _starting_up() -> bool:
    """True inside a .pth line or sitecustomize: the import of `site` is still executing."""
    spec = getattr(sys.modules.get("site"), "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def stop(*messages: str) -> None:
    """The strict answer to a bad environment: one line and exit 2, never a traceback.

    At start-up SystemExit would be a fatal error with a traceback of its own (and a .pth line's
    exception is printed and ignored), and outside the main thread it would end only that thread.
    """
    for message in messages[:-1]:
        sys.stderr.write(f"colo_shim: error: {message}\n")
    sys.stderr.write(f"colo_shim: error: {messages[-1]} ({STRICT}=1: stopping {sys.executable}, exit {EXIT_STRICT}; "
                     f"unset {STRICT} to warn and go on)\n")
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    threading = sys.modules.get("threading")  # not imported: no thread but the main one (and no import here)
    if _starting_up() or (threading and threading.current_thread() is not threading.main_thread()):
        os._exit(EXIT_STRICT)
    raise SystemExit(EXIT_STRICT)


def complain(message: str, *, strict_mode: bool | None = None, fallback: str = "", raises: bool = False) -> None:
    """One warning line per process about the environment; stop() when strict.

    fallback: what applies instead, said only when the job goes on. raises: strict_mode is a caller's
    argument (install(strict=True)), so that caller gets ConfigError rather than the process an exit.
    """
    if strict() if strict_mode is None else strict_mode:
        if raises and strict_mode is not None:
            raise ConfigError(message)
        stop(message)
    message = f"{message} ({fallback})" if fallback else message
    if message not in _said:  # the same bad value is seen at arm time and again where it is read
        _said.add(message)
        import logging

        logging.getLogger("colo_shim").warning("colo_shim: %s", message)


def get(name: str):
    """A declared knob's value as the code acts on it: the parsed value, else its fallback (said once)."""
    return _read(KNOBS[name])


def env_choice(name: str, choices: tuple[str, ...], default: str, deprecated: tuple[str, ...] = ()) -> str:
    """A choice knob; a deprecated value is returned as is (the caller says what it runs as), but the
    bad-value line lists it apart, so nobody picks it from there. The arguments are the caller's:
    tests/core/test_knobs.py checks they equal KNOBS at every call site."""
    return _read(Knob(name, "choice", default, "", choices, deprecated=deprecated))


def env_float(name: str, default: float, unit: str = "seconds", example: str = "30") -> float:
    """A non-negative number; the arguments are the caller's (equal to KNOBS, tested)."""
    return _read(Knob(name, "number", default, "", unit=unit, example=example))


def _read(knob: Knob):
    raw = os.environ.get(knob.name)
    if raw is None or not raw.strip():
        return knob.default
    value, applies = parse(knob, raw)
    if applies is not None:
        complain(problem(knob, raw)[0], fallback=applies)
    return value


def raw(name: str) -> str | None:
    """The environment's text of a declared knob, unchecked: for showing what was set, never for acting on it."""
    return os.environ.get(KNOBS[name].name)


def active() -> bool:
    """True when the environment asks for the shim; cheap, imports nothing."""
    return os.environ.get(ENABLE, "").strip().lower() not in _OFF


def _names(value: str) -> list[str]:
    return [part.strip().lower() for part in value.split(",") if part.strip()]


def requested_patches(known: tuple[str, ...], explicit=None, strict_mode: bool | None = None) -> tuple[str, ...]:
    """Patch names to install: explicit argument, else COLO_SHIM, minus COLO_SHIM_DISABLE.

    An unknown name in the explicit argument is the caller's bug (ConfigError when strict); in the
    environment it is the job's setting (one line, or stop when strict). strict_mode is install()'s
    argument, which counts at least as much as COLO_SHIM_STRICT: True raises ConfigError, False warns.
    """
    valid = ", ".join(("0",) + _ALL + known)
    if explicit is not None:
        wanted = [explicit] if isinstance(explicit, str) else list(explicit)
        wanted = [n for w in wanted for n in _names(w)]
        raw = ",".join(wanted)
    else:
        raw = os.environ.get(ENABLE, "").strip().lower()
        wanted = _names(raw) if raw not in _OFF else list(known)  # install() in code without COLO_SHIM: on
    if any(w in _ALL for w in wanted):
        wanted = list(known)
    disabled = set(_names(os.environ.get(DISABLE, "")))
    chosen = tuple(n for n in known if n in wanted and n not in disabled)
    unknown = [w for w in wanted if w not in known]
    if unknown:
        message = f"{ENABLE}={raw!r} names unknown patch(es) {', '.join(unknown)}; valid values: {valid}"
        if explicit is not None:
            message = f"install(patches={explicit!r}) names unknown patch(es) {', '.join(unknown)}; valid: {valid}"
            strict_mode = strict() if strict_mode is None else strict_mode
        complain(message, strict_mode=strict_mode, fallback=f"patching {', '.join(chosen) or 'nothing'}", raises=True)
    bad_disabled = sorted(disabled - set(known))
    if bad_disabled:
        complain(f"{DISABLE}={os.environ.get(DISABLE)!r} names unknown patch(es) {', '.join(bad_disabled)}; "
                 f"valid values: {', '.join(known)}", strict_mode=strict_mode, fallback="those names are ignored",
                 raises=True)
    return chosen


def retired_knobs() -> None:
    """One line naming the retired stage knobs that are set, once per process (never an error)."""
    found = [name for name in RETIRED_STAGE_KNOBS if os.environ.get(name, "").strip()]
    if found:
        complain(f"{', '.join(found)} {'has' if len(found) == 1 else 'have'} no effect since stage was retired "
                 "(COLO_SHIM_NVRX_RELEASE=stage runs as inplace); unset to silence this line", strict_mode=False)


def deprecated(name: str, value: str) -> None:
    complain(f"{name}={value} is deprecated: {DEPRECATED[name, value]}", strict_mode=False)


def unknown_names(environ=None) -> list[tuple[str, str]]:
    """(line, what applies) for each COLO_SHIM_* name nobody declared: a typo keeps a knob at its default."""
    environ = os.environ if environ is None else environ
    out = []
    for name in sorted(environ):
        if not name.startswith(ENABLE + "_") or name in KNOBS or name.startswith(HARNESS_PREFIXES):
            continue
        import difflib

        # the shared prefix would match anything; a retired knob is no one's meaning
        tails = {k[len(ENABLE) + 1:]: k for k, knob in KNOBS.items() if k != ENABLE and knob.kind != "retired"}
        close = difflib.get_close_matches(name[len(ENABLE) + 1:], list(tails), n=1, cutoff=0.7)
        meant = ENABLE if name in _MEANT else (tails[close[0]] if close else None)
        if name in _MEANT:
            hint = _MEANT[name]
        elif meant is None:
            hint = f"known names: {', '.join(k for k, knob in KNOBS.items() if knob.kind != 'retired')}"
        else:
            hint = f"did you mean {meant}?"
        applies = "ignored" + (f"; {meant} stays {shown(KNOBS[meant], _quiet(meant))}" if meant else "")
        out.append((f"{name}={environ[name]!r} is not a colo-shim variable; {hint}", applies))
    return out


def _quiet(name: str):
    """A knob's value without a complaint: for saying what applies, never for acting on it."""
    raw = os.environ.get(name)
    return KNOBS[name].default if raw is None or not raw.strip() else parse(KNOBS[name], raw)[0]


def problems() -> list[tuple[str, str]]:
    """Every bad value and unknown name in the environment as (line, what applies instead)."""
    out = []
    for knob in KNOBS.values():
        raw = os.environ.get(knob.name)
        if knob.kind not in ("families", "retired") and raw is not None and raw.strip():
            found = problem(knob, raw)
            if found:
                out.append(found)
    return out + unknown_names()


def check_environment(strict_mode: bool | None = None) -> None:
    """Once per process, when the shim arms or installs: every knob and name; strict_mode: install()'s."""
    global _checked
    if strict_mode and problems():
        raise ConfigError("; ".join(line for line, _ in problems()))
    if _checked:
        return
    _checked = True
    retired_knobs()
    for knob in KNOBS.values():
        value = os.environ.get(knob.name, "").strip().lower()
        if value in knob.deprecated:
            deprecated(knob.name, value)
    found = problems()
    if found and (strict() if strict_mode is None else strict_mode):
        stop(*(line for line, _ in found))
    for line, applies in found:
        complain(line, strict_mode=False, fallback=applies)


def configure_logging() -> None:
    """Attach a handler only when asked: a library must not reconfigure the host's logging."""
    level = get(LOG_LEVEL)
    if not level:
        return
    import logging

    log = logging.getLogger("colo_shim")
    log.setLevel(int(level) if level.isdigit() else logging.getLevelName(level))
    if not any(getattr(h, "_colo_shim", False) for h in log.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(process)d %(name)s %(levelname)s %(message)s"))
        handler._colo_shim = True
        log.addHandler(handler)
        log.propagate = False
