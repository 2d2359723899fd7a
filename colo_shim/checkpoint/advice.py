"""What `colo-shim doctor` says about the checkpoint fence: which release strategy fits this job.

Read from metadata only (doctor imports nothing by default). `inplace` (the default) releases the
writer through its side door while its write goes on, so an offload right after a save no longer
waits for the write (issue 22) and the worker stays warm; that is the recommendation wherever NVRx
is a release it was tested on. `restart` relies on close() alone, the only strategy that uses no
NVRx internals, so it is the one for NVRx builds the shim was not tested on (dev snapshots); its next
save boots a worker. `stage` (page-locked /dev/shm staging) was retired once inplace stopped
waiting: it bought no time and cost a checkpoint shard of host memory per rank; the value still runs,
as inplace, and the row says so.
"""

from __future__ import annotations

from colo_shim.checkpoint import release
from colo_shim.core import config, versions


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
    if configured != "inplace":
        return dict(row, status="no", reason=f"{release.ENV}={configured}: the release waits for the write")
    if version not in ("0.6.0", "0.7.0"):
        return dict(row, status="no", reason=f"NVRx {version}: an offload waits for the write in flight "
                                             "(released in place only on 0.6.0 and 0.7.0)")
    return dict(row, status="yes", reason=(
        "an offload does not wait for the write; it falls back to waiting, with one warning, where NVRx's "
        "worker cannot import colo_shim (it is spawned with this interpreter and sys.path) or does not "
        f"answer within {release.door.ACK_ENV}; see release_fallbacks_by_cause in `doctor --from`"))


def recommend(version: str | None) -> tuple:
    """(strategy, why) for this NVRx."""
    if version is None:
        return release.DEFAULT, "NVRx is not installed here"
    if not release.inplace_tested(version):
        return "restart", (f"NVRx {version} is not a release the in-place release was tested on "
                           f"({', '.join(release.INPLACE_TESTED)}); restart only uses close()")
    if version in ("0.6.0", "0.7.0"):
        return "inplace", "the offload releases the writer while its write goes on; the worker stays warm"
    return "inplace", "the offload waits for the write in flight, then drops the writer's cache; the worker stays warm"


def _configured() -> str:
    """The strategy as set, with what a deprecated value runs as."""
    raw = (config.raw(release.ENV) or "").strip().lower()
    how = release.strategy()
    return f"{raw} (deprecated: runs as {how})" if raw == release.RETIRED else how


def rows() -> list[dict]:
    """Doctor rows for the family `nvrx` (name, target, status, installed_version, reason)."""
    version = versions.installed_version(release.DIST)
    choice, why = recommend(version)
    configured = release.strategy()
    out = [dict(name="nvrx", target=f"{release.ENV} (release strategy)", installed_version=version,
                status=f"{_configured()}; recommended {choice}", reason=why)]
    if version is not None:
        tested = release.inplace_tested(version)
        out.append(dict(name="nvrx", target="in-place release (NVRx internals)", installed_version=version,
                        status="tested" if tested else "untested",
                        reason=("tested on this release" if tested else
                                f"untested build {version}: inplace releases CUDA writers by restart")))
        out.append(_while_writing_row(version, configured))
        try:
            out.append(dict(name="nvrx", target="saves holding no GPU memory", installed_version=version,
                            status="left writing" if "left writing" in _host_tensors(version) else "waited for",
                            reason=_host_tensors(version)))
        except Exception:
            pass
    return out
