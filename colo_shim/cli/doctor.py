"""`colo-shim doctor`: what each patch would do in this environment, or did in a running job.

By default nothing is imported (safe on a login node, answers in milliseconds): versions come
from metadata and module presence from the path finders. `--import` imports the targets to show
applied / not-needed for real. Running processes write their own status to COLO_SHIM_STATUS_DIR
at exit; `--from DIR` reads those, because the decisions that matter happen in Ray actors.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import json
import os
import sys

from colo_shim.core import config, registry, versions

COLUMNS = ("name", "target", "status", "installed_version", "supported", "calls", "reason")


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
        record["status"], record["reason"] = registry.PENDING, f"applies when {module} is imported"
    return record


def report(import_targets: bool = False) -> list[dict]:
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


def _from_dir(directory: str, as_json: bool) -> int:
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
            print(format_table(proc.get("records") or []))
    return 0


def _header() -> str:
    """What processes started with this environment really patch, not just whether COLO_SHIM is set."""
    state = config.raw(config.ENABLE)
    setting = f"{config.ENABLE}={state!r}" if state is not None else f"{config.ENABLE} unset"
    head = f"colo-shim {__import__('colo_shim').__version__}; {setting}"
    if not config.active():
        return f"{head} (inactive: processes with this environment patch nothing)"
    wanted = config.requested_patches(tuple(registry.families()))
    if not wanted:
        return f"{head} (names no known family: processes with this environment patch nothing)"
    return f"{head} (active: {', '.join(wanted)})"


def format_table(records: list[dict]) -> str:
    rows = [[str(r.get(c) if r.get(c) is not None else "-") for c in COLUMNS] for r in records]
    widths = [max(len(c), *(len(row[i]) for row in rows)) if rows else len(c) for i, c in enumerate(COLUMNS)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in rows]
    details = {r["name"]: r["details"] for r in records if r.get("details")}
    lines += [f"{name}: {json.dumps(d, default=str, sort_keys=True)}" for name, d in details.items()]
    return "\n".join(lines)


def main(as_json: bool = False, import_targets: bool = False, from_dir: str | None = None) -> int:
    if from_dir:
        return _from_dir(from_dir, as_json)
    config.check_environment()  # a bad value or a misspelt name: one line each on stderr (strict: exit 2)
    try:
        records = report(import_targets)
        header = _header()
    except config.ConfigError as exc:  # COLO_SHIM_STRICT=1 and a target that cannot be patched
        print(f"colo-shim doctor: error: {exc} ({config.STRICT}=1)", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps(records, indent=2, default=str))
        return 0
    print(header)
    print(format_table(records))
    for title, rows in (("checkpoint fence", _fence_advice()), ("offload mirrors", _offload_advice())):
        if rows:
            print(f"\n{title}:")
            print(format_table(rows))
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
