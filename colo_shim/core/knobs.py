"""How each kind of knob reads its value, and the words for a bad one.

Separate from the table in config.py so that adding a knob there is one line, while a new kind
of value (and the promise that a bad one is described, tested for every kind) lands here.
Nothing here reads the environment: callers pass the raw text, so the same words serve the
arm-time check, the reader that acts on the value and doctor. The one side effect: a `newdir`
is made when checked, because only trying tells whether it can be.
"""

import os

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# retired: a knob of a removed feature; any value is accepted (a job config that set it was valid)
# and config.retired_knobs() says it has no effect
KINDS = ("families", "choice", "bool", "number", "level", "newdir", "retired")


class Knob:
    """One variable: kind is one of KINDS; default applies when it is unset or its value is bad.

    A bad bool counts as off instead of the default: only a clear yes turns a feature on. unset says
    in words what an empty default means (doctor and the warnings show it). A deprecated choice is
    still valid, so strict mode never stops a job for it; the reader says what it runs as. unit and
    example belong to numbers: the bad-value line says what to write instead.
    """

    __slots__ = ("name", "kind", "default", "meaning", "choices", "unset", "deprecated", "unit", "example")

    def __init__(self, name, kind, default, meaning, choices=(), unset="", deprecated=(), unit="seconds",
                 example="30"):
        if kind not in KINDS:
            raise ValueError(f"{name}: unknown kind {kind!r}; one of {', '.join(KINDS)}")
        self.name, self.kind, self.default, self.meaning = name, kind, default, meaning
        self.choices, self.unset, self.deprecated = tuple(choices), unset, tuple(deprecated)
        self.unit, self.example = unit, example


def valid(knob: Knob) -> str:
    """What is valid, in words: the middle of every complaint."""
    if knob.kind == "choice":
        old = f" (deprecated: {', '.join(knob.deprecated)})" if knob.deprecated else ""
        return ", ".join(knob.choices) + old
    if knob.kind == "number":
        return f"a non-negative number of {knob.unit}, e.g. {knob.name}={knob.example}"
    return {"families": "a comma list of patch families (COLO_SHIM also 0, 1 or all)", "bool": ", ".join(TRUE + FALSE),
            "level": f"{', '.join(LEVELS)} or a number", "newdir": "a directory, or a path where one can be made",
            "retired": "any (it has no effect)"}[knob.kind]


def shown(knob: Knob, value) -> str:
    """A value as the user would write it, or what its absence means."""
    if value is None or value == "":
        return f"unset ({knob.unset})"
    if knob.kind == "bool":
        return "on" if value else "off"
    if knob.kind == "number":
        return f"{value:g} {knob.unit}"
    return repr(value) if isinstance(value, str) else str(value)


def _made(path: str) -> bool:
    """A directory written to later (at exit) is made now: only trying tells (/proc, read-only mounts, root)."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return False
    return os.path.isdir(path)


def parse(knob: Knob, raw: str):
    """(value, None) when raw is valid, else (what applies instead, that in words)."""
    text, kind = raw.strip(), knob.kind
    if kind in ("families", "retired"):  # family names: config.requested_patches(); retired: any value
        return text, None
    if kind == "choice" and text.lower() in knob.choices + knob.deprecated:
        return text.lower(), None
    if kind == "bool" and text.lower() in TRUE + FALSE:
        return text.lower() in TRUE, None
    if kind == "number":
        try:
            number = float(text)
        except ValueError:
            number = float("nan")
        if 0 <= number < float("inf"):
            return number, None
    if kind == "level" and (text.upper() in LEVELS or text.isdigit()):
        return text.upper(), None
    if kind == "newdir" and (os.path.isdir(text) or _made(text)):
        return text, None
    if kind == "bool":
        return False, "taken as off: only a clear yes turns it on"
    return knob.default, f"using the default: {shown(knob, knob.default)}"


def problem(knob: Knob, raw: str) -> tuple[str, str] | None:
    """(the line, what applies instead) for a bad value; None for a good one."""
    applies = parse(knob, raw)[1]
    if applies is None:
        return None
    return f"{knob.name}={raw!r} is not valid; valid values: {valid(knob)}", applies
