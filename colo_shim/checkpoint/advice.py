"""What `colo-shim doctor` says about the checkpoint fence: which release strategy fits this job.

Read from metadata and /dev/shm only (doctor imports nothing by default). The trade, measured on
an H200 with megatron-core 0.19.2 and a 12.2 GiB checkpoint (docs/checkpoint-fence.md): `inplace`
keeps the writer warm but an offload right after a save waits for the whole file write (10.2-10.4 s
to tmpfs, longer to a network file system); `stage` made that offload wait 0.2 ms, and pays a
device-to-host copy into /dev/shm at each save (1.0-6.7 s) plus one /dev/shm copy of the checkpoint
per rank, so it only fits where the node's /dev/shm holds every local rank's copy (the ranks
reserve it node-wide when the job runs, shm_ledger; here it is divided by the ranks per node that
the launcher's variables name, when doctor runs under one); `restart` relies on close() alone, the only
strategy that uses no NVRx internals, so it is the one for NVRx builds the shim was not tested on
(dev snapshots), and its next save boots a worker (9.7-9.8 s).
"""

from __future__ import annotations

import os

from colo_shim.checkpoint import release, shm_ledger, stage
from colo_shim.core import versions

GIB = float(1 << 30)


def _host_tensors(version) -> str:
    from packaging.version import Version

    v = Version(version)
    if v.release >= (0, 7):
        return "NVRx copies host tensors at schedule time: saves holding no GPU memory are left writing"
    if v.release >= (0, 6):
        return ("NVRx 0.6 passes host tensors live (NVRx #376); the shim copies them at schedule time, so saves "
                "holding no GPU memory are left writing")
    return "this NVRx passes host tensors live: the fence waits for every save, host-only ones too"


def _while_writing_row(version: str, configured: str) -> dict:
    """Whether an offload can release the writer while its write goes on, or must wait for it."""
    row = dict(name="nvrx", target="release while writing (side door)", installed_version=version)
    if configured not in ("inplace", "stage"):
        return dict(row, status="no", reason=f"{release.ENV}={configured}: the release waits for the write")
    if version not in ("0.6.0", "0.7.0"):
        return dict(row, status="no", reason=f"NVRx {version}: an offload waits for the write in flight "
                                             "(released in place only on 0.6.0 and 0.7.0)")
    return dict(row, status="yes", reason=(
        "an offload does not wait for the write; it falls back to waiting, with one warning, where NVRx's "
        "worker cannot import colo_shim (it is spawned with this interpreter and sys.path) or does not "
        f"answer within {release.door.ACK_ENV}; see release_fallbacks_by_cause in `doctor --from`"))


def recommend(version: str | None, shm_budget: int | None, ckpt_bytes: int | None = None) -> tuple:
    """(strategy, why) for this NVRx, this rank's share of /dev/shm, and the checkpoint size if known."""
    if version is None:
        return release.DEFAULT, "NVRx is not installed here"
    if not release.inplace_tested(version):
        return "restart", (f"NVRx {version} is not a release the in-place release was tested on "
                           f"({', '.join(release.INPLACE_TESTED)}); restart only uses close()")
    from packaging.version import Version

    if Version(version).release < (0, 6):
        return "inplace", "no CPU shared-memory staging before NVRx 0.6; inplace keeps the writer warm"
    room = f"{(shm_budget or 0) / GIB:.1f} GiB of /dev/shm per rank"
    if ckpt_bytes is None:
        return "stage", (f"if one rank's checkpoint fits in {room}: the offload then never waits for the write "
                         "(costs a device-to-host copy at each save); otherwise inplace")
    if shm_budget is not None and ckpt_bytes <= shm_budget:
        return "stage", f"a {ckpt_bytes / GIB:.1f} GiB checkpoint fits in {room}; the offload never waits for the write"
    return "inplace", f"a {ckpt_bytes / GIB:.1f} GiB checkpoint does not fit in {room}"


def rows(ckpt_bytes: int | None = None) -> list[dict]:
    """Doctor rows for the family `nvrx` (name, target, status, installed_version, reason)."""
    version = versions.installed_version(release.DIST)
    ranks = shm_ledger.local_ranks()
    try:
        budget = stage.shm_budget()  # an explicit budget is per rank already; the node's room is not
        if not os.environ.get(stage.SHM_BYTES_ENV) and ranks["count"]:
            budget //= ranks["count"]
    except Exception:
        budget = None
    choice, why = recommend(version, budget, ckpt_bytes)
    configured = release.strategy()
    out = [dict(name="nvrx", target=f"{release.ENV} (release strategy)", installed_version=version,
                status=f"{configured}; recommended {choice}", reason=why)]
    if version is not None:
        tested = release.inplace_tested(version)
        out.append(dict(name="nvrx", target="in-place release (NVRx internals)", installed_version=version,
                        status="tested" if tested else "untested",
                        reason=("tested on this release" if tested else
                                f"untested build {version}: inplace and stage release CUDA writers by restart")))
        out.append(_while_writing_row(version, configured))
        try:
            out.append(dict(name="nvrx", target="saves holding no GPU memory", installed_version=version,
                            status="left writing" if "left writing" in _host_tensors(version) else "waited for",
                            reason=_host_tensors(version)))
        except Exception:
            pass
    if os.environ.get(stage.SHM_BYTES_ENV):
        out[0]["reason"] += f" ({stage.SHM_BYTES_ENV}={os.environ[stage.SHM_BYTES_ENV]})"
    elif version is not None and choice in ("stage", "inplace") and "/dev/shm" in why:
        out[0]["reason"] += (f" (ranks per node: {ranks['count'] or 'unknown, counted as 1'}, from "
                             f"{ranks['source']})")
    return out
