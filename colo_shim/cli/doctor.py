"""`colo-shim doctor`: what each patch would do in this environment, or did in a running job.

By default nothing is imported (safe on a login node, answers in milliseconds): versions come
from metadata and module presence from the path finders. `--import` imports the targets to show
applied / not-needed for real. Running processes write their own status to COLO_SHIM_STATUS_DIR
at exit; `--from DIR` reads those, because the decisions that matter happen in Ray actors.

Every row says what a job started with this environment would get: with COLO_SHIM unset that is
nothing, so each row is `disabled` and its reason says what COLO_SHIM=1 would do (doctor itself
installs the patches to find out, which must not read as the job's). The first line sums the rows
up, because a first-time reader looks at one line; the table fits 160 columns (the targets that
are not installed folded to one row per family), and -v or --json give every row in full.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import json
import os
import sys

from colo_shim.cli.table import counts, fold, format_table
from colo_shim.core import config, registry, versions



def _findable(module: str) -> bool:
    """Whether `module` could be imported, decided from the file system so no package runs."""
    if module in sys.modules:
        return True
    dirs, parts = sys.path, module.split(".")
    for i, part in enumerate(parts):
        packages = [os.path.join(d or ".", part) for d in dirs if os.path.isdir(os.path.join(d or ".", part))]
        if i == len(parts) - 1:
            files = (os.path.join(d or ".", part + s) for d in dirs for s in importlib.machinery.all_suffixes())
            return bool(packages) or any(os.path.isfile(f) for f in files)
        if not packages:
            return False
        dirs = packages
    return False


def _static(record: dict, wanted: tuple) -> dict:
    if record["name"] not in wanted:
        record["status"], record["reason"] = registry.DISABLED, "not enabled by COLO_SHIM / COLO_SHIM_DISABLE"
        return record
    module = record["target"].split(":", 1)[0]
    version = versions.installed_version(record["distribution"]) if record["distribution"] else None
    record["installed_version"] = version
    if version is not None and not versions.supported(version, record["supported"]):
        record["status"], record["reason"] = registry.UNSUPPORTED, f"{version} not in {record['supported']!r}"
    elif not _findable(module):
        record["status"], record["reason"] = registry.MISSING, f"module {module} not found"
    else:
        record["status"], record["reason"] = registry.PENDING, "applies when its module is imported"
    return record


def report(import_targets: bool = False) -> list[dict]:
    records = _report(import_targets)
    if config.active():
        return records
    for r in records:  # doctor's own install is not the job's: the job would patch nothing
        r["if_enabled"], r["status"] = r["status"], registry.DISABLED
        r["reason"] = f"with {config.ENABLE}=1: {r['if_enabled']}" + (f": {r['reason']}" if r["reason"] else "")
    return records


def _report(import_targets: bool) -> list[dict]:
    known = tuple(registry.families())
    wanted = config.requested_patches(known) if config.active() else known
    if not import_targets:
        return [_static(r, wanted) for r in registry.status()]
    registry.install(wanted)
    for record in registry.status():
        module = record["target"].split(":", 1)[0]
        if record["status"] == registry.PENDING and _findable(module):
            try:
                importlib.import_module(module)
            except Exception as exc:
                registry.log.warning("colo_shim: doctor could not import %s: %s", module, exc)
    return [_static(r, wanted) if r["status"] in (registry.PENDING, registry.DISABLED) else r
            for r in registry.status()]


def load(directory: str) -> list[dict]:
    """Every process file in directory; a half-written or foreign file is skipped with a note."""
    processes = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(".json"):
            try:
                with open(os.path.join(directory, name)) as fh:
                    processes.append(json.load(fh))
            except (OSError, ValueError) as exc:
                print(f"colo-shim doctor: skipped {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
    return processes


def _from_dir(directory: str, as_json: bool, verbose: bool) -> int:
    hint = (f"set {config.STATUS_DIR}={directory} in the job's environment: each activated process writes "
            "<host>-<pid>.json there at exit")
    if not os.path.isdir(directory):
        print(f"colo-shim doctor: {directory} is not a directory; {hint}", file=sys.stderr)
        return 2
    processes = load(directory)
    if not processes:
        print(f"colo-shim doctor: no status files in {directory}; {hint}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(processes, indent=2, default=str))
        return 0
    for proc in processes:
        print(f"== {proc.get('host')} pid {proc.get('pid')}: {' '.join(map(str, proc.get('argv') or []))[:120]}")
        if proc.get("not_active"):  # written by the bootstrap where colo_shim could not be imported
            print(f"NOT active: {proc.get('python')} (Python {proc.get('python_version')}) could not import "
                  f"colo_shim: {proc['not_active']}")
        else:
            records = proc.get("records") or []
            print(format_table(records if verbose else fold(records, config.ENABLE), verbose))
    return 0


def summary(records: list[dict], fence: list[dict]) -> str:
    """The first line: version, what a job with this environment patches, the counts, release, warnings."""
    state = config.raw(config.ENABLE)
    setting = f"{config.ENABLE}={state!r}" if state is not None else f"{config.ENABLE} unset"
    head = f"colo-shim {__import__('colo_shim').__version__}; {setting}"
    wanted = config.requested_patches(tuple(registry.families())) if config.active() else ()
    if not config.active():
        head = f"{head} (inactive: a job patches nothing; with {config.ENABLE}=1: {counts(records)})"
    elif not wanted:
        head = f"{head} (names no known family: a job patches nothing): {counts(records)}"
    else:
        head = f"{head} (active: {', '.join(wanted)}): {counts(records)}"
    configured, _, recommended = (fence[0]["status"] if fence else "unknown").partition("; recommended ")
    warnings = [f"{n} bad {config.ENABLE}_* setting(s), on stderr" for n in [len(config.problems())] if n]
    unknown = [n for n in config._names(state or "") if n not in config._ALL + tuple(registry.families())]
    warnings += [f"{config.ENABLE} names unknown {', '.join(unknown)}"] if config.active() and unknown else []
    for status in (registry.FAILED, registry.SHADOWED, registry.UNSUPPORTED):
        found = [r for r in records if r.get("if_enabled", r["status"]) == status]
        warnings += [f"{len(found)} target(s) {status}"] if found else []
    if recommended and recommended != configured.split()[0]:
        warnings.append(f"release {recommended} recommended here")
    return f"{head}; release {configured}; " + (f"WARNING: {'; '.join(warnings)}" if warnings else "no warnings")


def main(as_json: bool = False, import_targets: bool = False, from_dir: str | None = None,
         verbose: bool = False) -> int:
    if from_dir:
        return _from_dir(from_dir, as_json, verbose)
    config.check_environment()  # a bad value or a misspelt name: one line each on stderr (strict: exit 2)
    try:
        records = report(import_targets)
    except config.ConfigError as exc:  # COLO_SHIM_STRICT=1 and a target that cannot be patched
        print(f"colo-shim doctor: error: {exc} ({config.STRICT}=1)", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps(records, indent=2, default=str))
        return 0
    fence = _fence_advice()
    print(summary(records, fence))
    print(format_table(records if verbose else fold(records, config.ENABLE), verbose))
    for title, rows in (("checkpoint fence", fence), ("offload mirrors", _offload_advice())):
        if rows:
            print(f"\n{title}:")
            print(format_table(rows, verbose))
    return 0


def _fence_advice() -> list[dict]:
    """The release strategy that fits this job, and whether this NVRx build was tested."""
    try:
        from colo_shim.checkpoint import advice

        return advice.rows()
    except Exception as exc:  # advice must never break doctor
        return [dict(name="nvrx", target="release strategy", status="unknown", reason=f"{type(exc).__name__}: {exc}")]


def _offload_advice() -> list[dict]:
    """Whether the optimizer's host mirrors are on, and the host memory they may keep on this node."""
    try:
        from colo_shim.offload import budget, megatron

        return budget.rows(megatron.DEFAULT)
    except Exception as exc:
        return [dict(name="offload", target="host mirrors", status="unknown", reason=f"{type(exc).__name__}: {exc}")]
