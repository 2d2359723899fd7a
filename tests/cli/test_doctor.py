"""`colo-shim doctor` in fresh interpreters against the real NVRx wheels and the test family."""

import glob
import json
import os
import re

import pytest

from harness.procs import REPO
from helpers import TARGETS, deps_dir, last_json, run_python

TABLE_FAMILIES = ("nvrx", "offload", "megatron", "vllm")
STATUSES = {"applied", "pending", "not-needed", "unsupported-version", "target-missing", "disabled", "failed"}


def doctor(*args, pythonpath=(), env=None):
    proc = run_python("import sys; from colo_shim.cli import main; sys.exit(main(sys.argv[1:]))",
                      args=("doctor", *args), pythonpath=pythonpath, env=env, timeout=240)
    assert proc.returncode == 0
    return proc


def test_json_lists_every_target_without_importing_it():
    proc = doctor("--json", pythonpath=(deps_dir("nvrx", "0.7.0"),), env={"COLO_SHIM": "nvrx"})
    records = json.loads(proc.stdout)
    assert records and all({"name", "target", "status", "reason", "installed_version"} <= set(r) for r in records)
    assert {r["status"] for r in records} <= STATUSES
    nvrx = [r for r in records if r["name"] == "nvrx"]
    assert nvrx and all(r["installed_version"] == "0.7.0" for r in nvrx)
    assert {r["status"] for r in nvrx} <= {"pending", "target-missing"}
    assert any(r["status"] == "pending" for r in nvrx)
    others = [r for r in records if r["name"] != "nvrx"]
    assert others and {r["status"] for r in others} == {"disabled"}


def test_unsupported_version_is_reported_from_metadata():
    proc = doctor("--json", pythonpath=(deps_dir("nvrx", "0.4.1"), deps_dir("mcore", "0.16.1")))
    records = json.loads(proc.stdout)
    versions = {r["installed_version"] for r in records if r["name"] == "nvrx"}
    assert versions == {"0.4.1"}
    assert all(r["status"] != "failed" for r in records)


def test_import_mode_applies_for_real_and_text_table():
    proc = doctor("--import", pythonpath=(deps_dir("nvrx", "0.7.0"),), env={"COLO_SHIM": "nvrx"})
    header, table = proc.stdout.splitlines()[0], proc.stdout.splitlines()[1:]
    assert "COLO_SHIM='nvrx' (active: nvrx): 6 applied, 0 waiting" in header, header
    assert table[0].split() == ["name", "target", "status", "version", "calls", "reason"]
    rows = [line.split() for line in table[1:] if line.startswith("nvrx ")]
    assert any(row[2] == "applied" for row in rows), proc.stdout
    assert not any(row[2] == "failed" for row in rows), proc.stdout


def _table_rows(stdout: str) -> list[list[str]]:
    """The first table's rows (up to the first blank line), split on the two-space column gaps."""
    table = stdout.split("\n\n")[0].splitlines()[2:]
    return [re.split(r"\s{2,}", line.strip()) for line in table if re.match(r"^[a-z]+\s{2,}", line)]


@pytest.mark.parametrize("import_targets", [True, False], ids=["import", "offline"])
def test_unset_colo_shim_rows_say_what_the_job_gets_as_the_header_does(import_targets):
    # issue 35 item 7: doctor --import installed the patches in its own process and its rows said
    # "applied" under a header saying the environment patches nothing
    args = ("--import",) if import_targets else ()
    text = doctor(*args, pythonpath=(deps_dir("nvrx", "0.7.0"),)).stdout
    assert "COLO_SHIM unset (inactive: a job patches nothing; with COLO_SHIM=1: " in text.splitlines()[0], text
    rows = _table_rows(text)
    assert rows and {row[2] for row in rows} == {"disabled"}, text
    nvrx = [row for row in rows if row[0] == "nvrx"]
    would = "with COLO_SHIM=1: applied" if import_targets else "with COLO_SHIM=1: pending"
    assert nvrx and any(row[-1].startswith(would) for row in nvrx), text
    records = json.loads(doctor("--json", *args, pythonpath=(deps_dir("nvrx", "0.7.0"),)).stdout)
    assert {r["status"] for r in records} == {"disabled"}, records
    assert "applied" in {r["if_enabled"] for r in records} or not import_targets, records


def _outcomes(records: list[dict]) -> str:
    kinds = {"applied": "applied", "pending": "waiting", "failed": "failed", "shadowed": "failed"}
    tally = {k: 0 for k in ("applied", "waiting", "skipped", "failed")}
    for r in records:
        tally[kinds.get(r.get("if_enabled", r["status"]), "skipped")] += 1
    return ", ".join(f"{n} {k}" for k, n in tally.items())


@pytest.mark.parametrize("env,says", [
    ({"COLO_SHIM": "1"}, "(active: nvrx, offload, megatron, vllm): {counts}; release inplace; no warnings"),
    ({}, "(inactive: a job patches nothing; with COLO_SHIM=1: {counts}); release inplace; no warnings"),
    ({"COLO_SHIM": "nvrx,bogus", "COLO_SHIM_NVRX_RELEASE": "restart", "COLO_SHIM_DISCARD": "maybe"},
     "(active: nvrx): {counts}; release restart; WARNING: 1 bad COLO_SHIM_* setting(s), on stderr; COLO_SHIM names "
     "unknown bogus; release inplace recommended here"),
])
def test_first_line_sums_up_and_rows_fit_160_columns_with_every_row_under_v(env, says):
    # issue 35 item 10: ~76 lines up to 400 columns wide with no summary
    where = (deps_dir("nvrx", "0.7.0"), deps_dir("mcore", "0.19.2"))
    records = json.loads(doctor("--json", pythonpath=where, env=env).stdout)
    text = doctor(pythonpath=where, env=env).stdout
    first = text.splitlines()[0]
    assert first.startswith("colo-shim 0.1.0; ") and first.endswith(says.format(counts=_outcomes(records))), first
    assert max(len(line) for line in text.splitlines()[1:]) <= 160, text
    assert len(text.splitlines()) < len(records), text  # targets not installed fold to one row per family
    full = doctor("-v", pythonpath=where, env=env).stdout
    listed = [line for line in full.split("\n\n")[0].splitlines()[2:] if line.split(" ")[0] in TABLE_FAMILIES]
    assert sorted(line.split()[1] for line in listed) == sorted(r["target"] for r in records), full


def test_inactive_environment_says_so():
    proc = doctor()
    assert "inactive" in proc.stdout.splitlines()[0]


def test_processes_write_status_and_doctor_reads_them(tmp_path):
    run_python("""
        import shimtest_family, colo_shim
        shimtest_family.register_all()
        colo_shim.install(["shimtest"])
        import shimtarget.sub
        shimtarget.sub.free(1)
    """, pythonpath=(TARGETS,), env={"COLO_SHIM": "0", "COLO_SHIM_STATUS_DIR": str(tmp_path)})
    assert list(tmp_path.iterdir()) == []  # dumps only where the job turned the shim on by environment
    run_python("""
        import colo_shim
        from colo_shim.core import registry
        print(sorted(registry._enabled))
    """, env={"COLO_SHIM": "megatron", "COLO_SHIM_STATUS_DIR": str(tmp_path)})
    files = list(tmp_path.iterdir())
    assert len(files) == 1
    proc = doctor("--from", str(tmp_path))
    assert proc.stdout.startswith("== ") and "megatron" in proc.stdout
    dumped = json.loads(doctor("--from", str(tmp_path), "--json").stdout)
    assert dumped[0]["pid"] and {r["status"] for r in dumped[0]["records"] if r["name"] == "megatron"} <= STATUSES


def _doctor_raw(*args, env=None):
    return run_python("import sys; from colo_shim.cli import main; sys.exit(main(sys.argv[1:]))",
                      args=("doctor", *args), env=env, timeout=240, check=False)


def test_from_a_missing_or_empty_directory_says_what_to_set(tmp_path):
    missing = _doctor_raw("--from", str(tmp_path / "missing"))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr, missing.stderr
    assert missing.stderr.count("\n") == 1 and "is not a directory" in missing.stderr, missing.stderr
    assert "COLO_SHIM_STATUS_DIR=" in missing.stderr
    empty = _doctor_raw("--from", str(tmp_path))
    assert empty.returncode == 1 and "no status files in" in empty.stderr and "Traceback" not in empty.stderr


@pytest.mark.parametrize("value,says", [
    ("bogus", "(names no known family: a job patches nothing): 0 applied, 0 waiting, "),
    ("nvrx,bogus", "(active: nvrx): "),
    ("1", "(active: nvrx, offload, megatron, vllm): "),
])
def test_header_says_what_is_really_active(value, says):
    proc = doctor(env={"COLO_SHIM": value})
    assert f"COLO_SHIM={value!r} {says}" in proc.stdout.splitlines()[0], proc.stdout.splitlines()[0]


@pytest.mark.parametrize("release,status", [
    (None, "inplace; recommended inplace"),
    ("stage", "stage (deprecated: runs as inplace); recommended inplace"),
])
def test_fence_rows_recommend_inplace_and_name_the_retired_stage(release, status):
    """stage was retired (issue 22): doctor recommends inplace on a tested NVRx, shows a job config
    that still names stage as what it runs as, and has no /dev/shm budget or ledger row any more."""
    proc = doctor(pythonpath=(deps_dir("nvrx", "0.7.0"),), env={"COLO_SHIM": "nvrx", "COLO_SHIM_NVRX_RELEASE": release})
    # the fence's own rows: the offload family's node ledger (issue 32) is a section of its own below them
    fence = proc.stdout.split("checkpoint fence:")[1].split("offload mirrors:")[0]
    row = next(line for line in fence.splitlines() if "(release strategy)" in line)
    assert status in row, row
    assert "release while writing (side door)" in fence and "/dev/shm" not in fence and "ledger" not in fence, fence
    side_door = next(line for line in fence.splitlines() if "side door" in line)
    assert " yes " in side_door, side_door
    assert proc.stderr.count("COLO_SHIM_NVRX_RELEASE=stage is deprecated") == (release == "stage"), proc.stderr


def test_the_docs_name_only_strategies_doctor_can_recommend():
    """Issue 35 item 9: docs/checkpoint-fence.md said doctor recommends `stage`, retired in issue 22."""
    can = set(last_json(run_python("""
        import json
        from colo_shim.checkpoint import advice, release
        versions = (None, "0.1.0", "9.9.9.dev0", *release.INPLACE_TESTED)
        print(json.dumps(sorted({advice.recommend(v)[0] for v in versions})))
    """)))
    said = []
    for path in [os.path.join(REPO, "README.md"), *glob.glob(os.path.join(REPO, "docs", "*.md"))]:
        text = " ".join(open(path).read().split())
        found = re.findall(r"recommends? `(\w+)`|; recommended (\w+)", text)  # prose, or doctor's own row
        said += [(os.path.basename(path), a or b) for a, b in found]
    assert said and {name for _, name in said} <= can, (said, can)
