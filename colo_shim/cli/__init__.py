"""`colo-shim` command line: run, bundle, doctor, demo.

Every argument of every subcommand is declared here, so `--help` describes each one and a bad one
is refused before any work starts (argparse: one usage line, exit 2). A user's mistake that only
shows later (a directory that cannot be written) is one line naming the command, never a
traceback; a closed pipe (`colo-shim doctor | head -1`) is not a mistake at all and ends quietly.
"""

from __future__ import annotations

import argparse
import os
import sys

EXIT_PIPE = 141  # what a shell reports for a process ended by SIGPIPE, e.g. `yes | head -1`


def _patches_error(value: str, source: str) -> str | None:
    """Why `value` cannot be the job's COLO_SHIM, or None: an unknown family is a typo, never a default."""
    from colo_shim.core import config
    from colo_shim.core.families import FAMILIES

    if value.strip().lower() in config._OFF:
        return None
    unknown = [n for n in config._names(value) if n not in config._ALL + FAMILIES]
    if not unknown:
        return None
    return (f"unknown patch famil{'y' if len(unknown) == 1 else 'ies'} {', '.join(map(repr, unknown))} "
            f"({source}); valid: all, {', '.join(FAMILIES)} or a comma list of them")


def _off_reason(value: str, source: str) -> str | None:
    """Why the job would run with the shim off, or None: a launcher that exists to turn it on says so."""
    from colo_shim.core import config
    from colo_shim.core.families import FAMILIES

    if value.strip().lower() in config._OFF:
        return f"--patches {value!r}" if source == "--patches" else f"{config.ENABLE}={value!r} inherited"
    names = config._names(value)
    wanted = set(FAMILIES) if any(n in config._ALL for n in names) else set(names)
    disabled = config.raw(config.DISABLE) or ""
    if wanted and not wanted - set(config._names(disabled)):
        return f"{config.DISABLE}={disabled!r} inherited, which removes every family of {value!r}"
    return None


def _bootstrap_dir(where: str | None) -> str:
    """A bundle (colo_shim + pure-Python wrapt), so interpreters of other venvs are reached too."""
    from colo_shim.cli import bundle

    try:
        return bundle.cached(where)
    except Exception as exc:
        print(f"colo-shim run: warning: could not write the bootstrap bundle ({type(exc).__name__}: {exc}); "
              "interpreters without colo-shim installed will warn and stay unpatched (use --bundle DIR)",
              file=sys.stderr)
        return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bootstrap")


def _run(args) -> int:
    from colo_shim.core import config

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("colo-shim run: give a command, e.g. colo-shim run -- python train.py", file=sys.stderr)
        return 2
    value, source = args.patches, "--patches"
    if value is None:
        value, source = config.raw(config.ENABLE), f"{config.ENABLE} in the environment"
        value = "all" if value is None else value
    error = _patches_error(value, source)
    if error:
        print(f"colo-shim run: {error}", file=sys.stderr)
        return 2
    off = _off_reason(value, source)
    if off:
        print(f"colo-shim run: colo-shim is OFF in this job ({off}): the command runs unpatched; "
              "--patches all turns it on", file=sys.stderr)
    bootstrap = _bootstrap_dir(args.bundle)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([bootstrap] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env[config.ENABLE] = value
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        print(f"colo-shim run: cannot execute {command[0]}: {exc}", file=sys.stderr)
        return 127


def _bundle(args) -> int:
    from colo_shim.cli.bundle import bundle

    path = bundle(args.dir)
    print(f"wrote {path}; activate with: PYTHONPATH={path} COLO_SHIM=1 <command>")
    return 0


def _doctor(args) -> int:
    from colo_shim.cli import bundle

    bundle.add_vendor_path()  # run from a bundle with COLO_SHIM unset: its wrapt is not on sys.path yet
    from colo_shim.cli import doctor

    return doctor.main(as_json=args.json, import_targets=args.import_targets, from_dir=args.from_dir,
                       verbose=args.verbose)


def _demo(args) -> int:
    from colo_shim.cli import demo

    return demo.main(args)


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def parser() -> argparse.ArgumentParser:
    import colo_shim
    from colo_shim.core.families import FAMILIES

    top = argparse.ArgumentParser(prog="colo-shim", description=colo_shim.__doc__.splitlines()[0])
    top.add_argument("-V", "--version", action="version", version=f"colo-shim {colo_shim.__version__}")
    sub = top.add_subparsers(dest="cmd", required=True, metavar="{run,bundle,doctor,demo}")
    run = sub.add_parser("run", help="run a command with colo-shim active in it and every child process",
                         usage="colo-shim run [-h] [--patches FAMILIES] [--bundle DIR] -- COMMAND ...",
                         description="Run COMMAND with colo-shim active in it and in every process it starts.")
    run.add_argument("--patches", metavar="FAMILIES", help="comma list of patch families: all (default, or "
                     f"COLO_SHIM when set), {', '.join(FAMILIES)}")
    run.add_argument("--bundle", metavar="DIR", help="where to keep the bootstrap copy of colo_shim and wrapt "
                     "(default ~/.cache/colo-shim); on several nodes, a directory all of them see")
    run.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                     help="the job's command line, after --")
    run.set_defaults(func=_run)
    bun = sub.add_parser("bundle", help="write a self-contained bootstrap directory for PYTHONPATH",
                         description="Write colo_shim, a pure-Python wrapt and the bootstrap into DIR, for "
                                     "interpreters where colo-shim is not installed.")
    bun.add_argument("dir", metavar="DIR", help="directory to write (created; an existing copy is replaced)")
    bun.set_defaults(func=_bundle)
    doc = sub.add_parser("doctor", help="show each patch's status in this environment",
                         description="Show what each patch would do in this environment, or did in a job.")
    doc.add_argument("--json", action="store_true", help="print the records as JSON instead of a table")
    doc.add_argument("-v", "--verbose", action="store_true", help="every target on its own row and every "
                     "cell in full (by default rows fit 160 columns)")
    doc.add_argument("--import", dest="import_targets", action="store_true",
                     help="import the installed targets, so the patches apply for real")
    doc.add_argument("--from", dest="from_dir", metavar="DIR",
                     help="read the status files the job's processes wrote to COLO_SHIM_STATUS_DIR=DIR")
    doc.set_defaults(func=_doctor)
    demo = sub.add_parser("demo", help="checkpoint fence before/after on this machine's device",
                          description="Train, save async with NVRx, offload, reload and save again, without and "
                                      "with the shim, each in a fresh process; exit 1 when the shim's row does "
                                      "not show the fix, 2 when this machine or NVRx cannot show the bug.")
    demo.add_argument("--mib", type=_positive, default=None, metavar="MIB",
                      help="size of the parameters + Adam state in MiB (default 1024 on a GPU, 16 on CPU)")
    demo.add_argument("--timeout", type=_positive, default=900, metavar="SECONDS",
                      help="safety limit per run (default 900); a hang is detected by its cause, not by this")
    demo.add_argument("--json", action="store_true", help="print the two rows as JSON instead of a table")
    demo.set_defaults(func=_demo)
    return top


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        code = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit where it cannot be caught
        return code
    except BrokenPipeError:  # the reader went away (| head): nothing left to say, and no one to say it to
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        except OSError:
            pass
        return EXIT_PIPE
    except KeyboardInterrupt:
        print(f"colo-shim {args.cmd}: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:  # a path the user named: missing, read-only, not a directory
        print(f"colo-shim {args.cmd}: error: {exc.strerror or exc}"
              f"{': ' + repr(exc.filename) if exc.filename else ''}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as exc:  # bundle copies wrapt and packaging: this interpreter lacks one
        print(f"colo-shim {args.cmd}: error: {exc}", file=sys.stderr)
        return 1
