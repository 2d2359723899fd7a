"""`colo-shim` command line: run, bundle, doctor, demo."""

from __future__ import annotations

import argparse
import os
import sys


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
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("colo-shim run: give a command, e.g. colo-shim run -- python train.py", file=sys.stderr)
        return 2
    value, source = (args.patches, "--patches") if args.patches is not None else \
        (os.environ.get("COLO_SHIM", "all"), "COLO_SHIM in the environment")
    error = _patches_error(value, source)
    if error:
        print(f"colo-shim run: {error}", file=sys.stderr)
        return 2
    bootstrap = _bootstrap_dir(args.bundle)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([bootstrap] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["COLO_SHIM"] = value
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

    return doctor.main(as_json=args.json, import_targets=args.import_targets, from_dir=args.from_dir)


def _demo(args) -> int:
    from colo_shim.cli import demo

    return demo.main(args.demo_args)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="colo-shim", description=__import__("colo_shim").__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run a command with colo-shim active in it and every child process")
    run.add_argument("--patches", help="comma list of patch families (default: all, or COLO_SHIM)")
    run.add_argument("--bundle", metavar="DIR", help="where to keep the bootstrap copy of colo_shim and wrapt "
                     "(default ~/.cache/colo-shim); on several nodes, a directory all of them see")
    run.add_argument("command", nargs=argparse.REMAINDER)
    run.set_defaults(func=_run)
    bun = sub.add_parser("bundle", help="write a self-contained bootstrap directory for PYTHONPATH")
    bun.add_argument("dir")
    bun.set_defaults(func=_bundle)
    doc = sub.add_parser("doctor", help="show each patch's status in this environment")
    doc.add_argument("--json", action="store_true")
    doc.add_argument("--import", dest="import_targets", action="store_true", help="import targets to apply for real")
    doc.add_argument("--from", dest="from_dir", help="read status files written by processes (COLO_SHIM_STATUS_DIR)")
    doc.set_defaults(func=_doctor)
    demo = sub.add_parser("demo", help="checkpoint fence before/after on this machine's device (--help for options)",
                          add_help=False)
    demo.set_defaults(func=_demo)
    args, extra = parser.parse_known_args(argv)
    if args.cmd != "demo" and extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.demo_args = extra
    return args.func(args)

