"""Environment switches.

Read on every call rather than cached at import, because drivers set them late (Ray runtime_env,
launch scripts) and tests flip them per subprocess. A bad value must never stop a 1,000-GPU job,
so it costs one clear warning line, unless COLO_SHIM_STRICT=1 asks for an error instead. In
strict mode at interpreter start-up (the .pth line, the bootstrap sitecustomize) there is no caller
to raise to: Python would print the traceback, once per .pth pass, and run the job anyway; so there
the error is one line on stderr and exit status 2, before any job code runs.
"""


import os
import sys

ENABLE = "COLO_SHIM"
DISABLE = "COLO_SHIM_DISABLE"
STRICT = "COLO_SHIM_STRICT"
LOG_LEVEL = "COLO_SHIM_LOG_LEVEL"
STATUS_DIR = "COLO_SHIM_STATUS_DIR"
FENCE_TIMEOUT = "COLO_SHIM_FENCE_TIMEOUT"
FENCE_WARN_EVERY = "COLO_SHIM_FENCE_WARN_EVERY"
NVRX_ACK_TIMEOUT = "COLO_SHIM_NVRX_ACK_TIMEOUT"
# read only when a fence waits, which may be hours into a job: checked at arm time too, so a bad
# value gets its word when the process starts
SECONDS = (FENCE_TIMEOUT, FENCE_WARN_EVERY, NVRX_ACK_TIMEOUT)
# knobs of COLO_SHIM_NVRX_RELEASE=stage, retired in issue 22: a job config that still sets them was
# valid, so they cost one line (never an error, strict or not) rather than silence
RETIRED_STAGE_KNOBS = ("COLO_SHIM_STAGE_PIN", "COLO_SHIM_STAGE_LEDGER_WAIT", "COLO_SHIM_STAGE_SHM_BYTES",
                       "COLO_SHIM_STAGE_SHM_DIR")
EXIT_STRICT = 2

_OFF = ("", "0", "off", "false", "no")
_ALL = ("1", "all")
_TRUE = ("1", "true", "yes", "on")
_said: set = set()
# the offload family (colo_shim/offload): its mirrors on or off, and the host memory they may hold per rank
OFFLOAD = "COLO_SHIM_OFFLOAD"
OFFLOAD_HOST_GIB = "COLO_SHIM_OFFLOAD_HOST_GIB"


class ConfigError(ValueError):
    """A switch has a value colo-shim cannot honour (raised only in strict mode)."""


def strict() -> bool:
    return os.environ.get(STRICT, "").strip().lower() in _TRUE


def _starting_up() -> bool:
    """True inside a .pth line or sitecustomize: the import of `site` is still executing."""
    spec = getattr(sys.modules.get("site"), "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def complain(message: str, *, strict_mode: bool | None = None, fallback: str = "") -> None:
    """One line for the operator; an error when strict, because strict means 'fail loudly'.

    fallback: what happens instead, said only when the job goes on (not strict).
    """
    if strict() if strict_mode is None else strict_mode:
        if _starting_up():
            sys.stderr.write(f"colo_shim: error: {message} ({STRICT}=1: stopping {sys.executable}, "
                             f"exit {EXIT_STRICT}; unset {STRICT} to warn and go on)\n")
            sys.stderr.flush()
            os._exit(EXIT_STRICT)  # SystemExit here would be a fatal start-up error with a traceback
        raise ConfigError(message)
    message = f"{message} ({fallback})" if fallback else message
    if message not in _said:  # the same bad value is seen at arm time and again at install
        _said.add(message)
        import logging

        logging.getLogger("colo_shim").warning("colo_shim: %s", message)


def status_dir() -> str:
    return os.environ.get(STATUS_DIR, "").strip()


def active() -> bool:
    """True when the environment asks for the shim; cheap, imports nothing."""
    return os.environ.get(ENABLE, "").strip().lower() not in _OFF


def _names(value: str) -> list[str]:
    return [part.strip().lower() for part in value.split(",") if part.strip()]


def requested_patches(known: tuple[str, ...], explicit=None) -> tuple[str, ...]:
    """Patch names to install: explicit argument, else COLO_SHIM, minus COLO_SHIM_DISABLE."""
    valid = ", ".join(("0", "1", "all") + known)
    if explicit is not None:
        wanted = [explicit] if isinstance(explicit, str) else list(explicit)
        wanted = [n for w in wanted for n in _names(w)]
        raw = ",".join(wanted)
    else:
        raw = os.environ.get(ENABLE, "").strip().lower()
        wanted = _names(raw) if raw not in _OFF else []
    if explicit is None:
        for name in SECONDS:
            env_float(name, 0.0)
        retired_knobs()
    if explicit is None and raw in _OFF:
        wanted = list(known)  # install() called in code without COLO_SHIM: the caller wants it on
    if any(w in _ALL for w in wanted):
        wanted = list(known)
    unknown = [w for w in wanted if w not in known]
    if unknown:
        complain(f"{ENABLE}={raw!r} names unknown patch(es) {', '.join(unknown)}; valid values: {valid}")
    disabled = set(_names(os.environ.get(DISABLE, "")))
    bad_disabled = sorted(disabled - set(known))
    if bad_disabled:
        complain(f"{DISABLE} names unknown patch(es) {', '.join(bad_disabled)}; valid values: {', '.join(known)}")
    return tuple(n for n in known if n in wanted and n not in disabled)


def env_choice(name: str, choices: tuple[str, ...], default: str, deprecated: tuple[str, ...] = ()) -> str:
    """The value of a switch with fixed choices; a deprecated value is still returned (the caller says
    what it runs as), but the bad-value line lists it apart, so nobody picks it from there."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    value = raw.strip().lower()
    if value in choices or value in deprecated:
        return value
    old = f" (deprecated: {', '.join(deprecated)})" if deprecated else ""
    complain(f"{name}={raw!r} is not valid; valid values: {', '.join(choices)}{old} (using {default!r})")
    return default


def retired_knobs() -> None:
    """One line naming the retired stage knobs that are set, once per process (never an error)."""
    found = [name for name in RETIRED_STAGE_KNOBS if os.environ.get(name, "").strip()]
    if found:
        complain(f"{', '.join(found)} {'has' if len(found) == 1 else 'have'} no effect since stage was retired "
                 "(COLO_SHIM_NVRX_RELEASE=stage runs as inplace); unset to silence this line", strict_mode=False)


def env_float(name: str, default: float, unit: str = "seconds", example: str = "30") -> float:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if value == value and value >= 0:
        return value
    complain(f"{name}={raw!r} is not valid; use a non-negative number of {unit}, e.g. {name}={example}",
             fallback="ignored: the default applies")
    return default


def configure_logging() -> None:
    """Attach a handler only when asked: a library must not reconfigure the host's logging."""
    raw = os.environ.get(LOG_LEVEL, "").strip()
    if not raw:
        return
    import logging

    log = logging.getLogger("colo_shim")
    level = logging.getLevelName(raw.upper()) if not raw.isdigit() else int(raw)
    if not isinstance(level, int):
        complain(f"{LOG_LEVEL}={raw!r} is not valid; valid values: DEBUG, INFO, WARNING, ERROR")
        return
    log.setLevel(level)
    if not any(getattr(h, "_colo_shim", False) for h in log.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(process)d %(name)s %(levelname)s %(message)s"))
        handler._colo_shim = True
        log.addHandler(handler)
        log.propagate = False
