"""push, pull, and the remote part of info: the fleet's shared cache tier (JITOPS_REMOTE_CACHE, a Redis URL).

push uploads the verified entries of the local roots (an image layer prewarmed at build time, a build box's
cache); pull fills the writable root with what a manifest needs (or everything the remote holds), checking
every entry as the runtime does (key, sha256 of every file, signature when JITOPS_REMOTE_CACHE_KEY is set)
before storing it with the runtime's atomic publish.  Unlike the runtime, which never lets the remote break a
call, these commands say when it cannot be reached (exit 1).
"""
from __future__ import annotations

import errno
from dataclasses import dataclass, field
from typing import Any, Sequence

from jitops import config, runtime, stats
from jitops.cache import CacheEntry, CorruptEntry
from jitops.cache.remote import RemoteCache, RemoteError, redact
from jitops.keys import CacheKey

from .common import UsageError, entry_archs
from .entries import cache_entries, entry_record
from .manifest import Plan

# The runtime's 50 ms request timeout is for calls that must not wait; a tool moving whole entries over a
# fleet's network may wait longer per request.
TOOL_TIMEOUT = 10.0


def connect() -> RemoteCache:
    """The configured remote, answering a PING, or an error that says what to do."""
    if config.remote_cache is None:
        raise UsageError("no remote cache: set JITOPS_REMOTE_CACHE=redis://host:port/db or give --remote URL")
    with config.scope(remote_timeout=max(config.remote_timeout, TOOL_TIMEOUT)):
        fleet = runtime.remote_cache()
    assert fleet is not None
    try:
        fleet.ping()
    except RemoteError as exc:
        raise ConnectionError(str(exc)) from None
    return fleet


def _unreachable(fleet: RemoteCache) -> ConnectionError:
    return ConnectionError(f"the remote cache {redact(fleet.settings.url)} failed: {fleet.last_error}")


# ---- push --------------------------------------------------------------------------------------------------------
@dataclass
class PushReport:
    remote: str
    pushed: list[dict[str, Any]] = field(default_factory=list)
    present: list[dict[str, Any]] = field(default_factory=list)
    refused: list[dict[str, Any]] = field(default_factory=list)   # too large, remote full
    skipped_corrupt: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.refused

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "remote": self.remote, "pushed": self.pushed, "present": self.present,
                "refused": self.refused, "skipped_corrupt": self.skipped_corrupt}


def push(archs: Sequence[str] = (), force: bool = False) -> PushReport:
    """Upload every verified entry of every local root (filtered by --arch) that the remote lacks."""
    fleet = connect()
    report = PushReport(redact(fleet.settings.url))
    good, bad = cache_entries(archs)
    report.skipped_corrupt += bad
    chosen: dict[str, CacheEntry] = {}
    for entry in good:  # the first root wins, as in a lookup
        chosen.setdefault(str(entry.meta.get("key")), entry)
    entries = list(chosen.values())
    try:
        present = [False] * len(entries) if force else fleet.present([e.meta.get("key", "") for e in entries])
    except Exception as exc:  # noqa: BLE001
        raise ConnectionError(f"the remote cache {report.remote} failed: {exc}") from None
    for entry, there in zip(entries, present):
        record = _describe(entry)
        if there:
            report.present.append(record)
            continue
        try:
            blobs = entry.verify()
            key = CacheKey(entry.meta["request"], entry.meta["toolchain"])
            if key.full != entry.meta.get("key"):
                raise CorruptEntry("its key halves do not hash to the key in meta.json")
        except (CorruptEntry, KeyError, TypeError) as exc:
            report.skipped_corrupt.append({"path": str(entry.path), "root": str(entry.root.path), "reason": str(exc)})
            continue
        outcome = fleet.publish(key, blobs, entry.meta)
        if outcome == "stored":
            report.pushed.append(record)
        elif outcome in ("too large", "full"):
            report.refused.append(dict(record, reason=outcome))
        else:
            raise _unreachable(fleet)
    return report


def _describe(entry: CacheEntry) -> dict[str, Any]:
    record = entry_record(entry)
    return dict({k: record[k] for k in ("op", "label", "arch", "dtype", "path")}, size=entry.size)


# ---- pull --------------------------------------------------------------------------------------------------------
@dataclass
class PullReport:
    remote: str
    pulled: list[dict[str, Any]] = field(default_factory=list)
    present: list[dict[str, Any]] = field(default_factory=list)
    missing: list[dict[str, Any]] = field(default_factory=list)   # not on the remote, or rejected there
    rejected: int = 0

    @property
    def ok(self) -> bool:
        return not self.missing

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "remote": self.remote, "pulled": self.pulled, "present": self.present,
                "missing": self.missing, "rejected": self.rejected}


def pull(plan: Plan, any_toolchain: bool = False) -> PullReport:
    """Store in the writable root every kernel of `plan` that a call here would not find locally.  A kernel
    is looked up as the runtime would: the exact toolchain, or any toolchain's build where this machine has no
    compiler for it, in offline mode, or with `any_toolchain` (a layer for read-only roots elsewhere)."""
    fleet = connect()
    report = PullReport(redact(fleet.settings.url))
    disk = runtime.disk_cache()
    rejected_before = stats.remote_rejected
    for job in plan.jobs:
        key, can_compile = runtime.key_for(job.request, job.target)
        accept_any = any_toolchain or config.offline or not can_compile
        record = {"op": job.op, "label": job.label, "arch": job.arch, "dtype": job.request.dtype,
                  "where": job.call.where}
        if runtime.find_entry(key, accept_any) is not None:
            report.present.append(record)
            continue
        found = next(fleet.lookup(key, accept_any, count=False), None)
        if not fleet.available():
            raise _unreachable(fleet)
        if found is None:
            report.missing.append(record)
            continue
        _store(disk, found)
        report.pulled.append(dict(record, size=sum(len(b) for b in found.blobs.values())))
    report.rejected = stats.remote_rejected - rejected_before
    return report


def pull_all(archs: Sequence[str] = ()) -> PullReport:
    """Store every entry the remote's index names (filtered by --arch) that the writable root lacks."""
    fleet = connect()
    report = PullReport(redact(fleet.settings.url))
    disk = runtime.disk_cache()
    selected = entry_archs(archs) if archs else None
    rejected_before = stats.remote_rejected
    have = {e.meta.get("key") for e in cache_entries()[0]}
    try:
        index = list(fleet.index())
    except Exception as exc:  # noqa: BLE001
        raise ConnectionError(f"the remote cache {report.remote} failed: {exc}") from None
    for full, line in index:
        line = line or {}
        if selected is not None and line.get("arch") not in selected:
            continue
        record = {"op": line.get("op"), "label": line.get("label"), "arch": line.get("arch"),
                  "dtype": line.get("dtype"), "key": full}
        if full in have:
            report.present.append(record)
            continue
        found = fleet.fetch(full)
        if not fleet.available():
            raise _unreachable(fleet)
        if found is None:  # expired or evicted since it was indexed, or rejected
            report.missing.append(record)
            continue
        _store(disk, found)
        report.pulled.append(dict(record, size=sum(len(b) for b in found.blobs.values())))
    report.rejected = stats.remote_rejected - rejected_before
    return report


def _store(disk: Any, found: Any) -> None:
    if disk.store(found.key, found.blobs, found.meta) is None:  # errno and path: the CLI says what to do
        where = str(disk.writable.path) if disk.writable else "(no writable root)"
        cause = disk.store_error
        raise OSError(cause.errno if cause is not None else errno.EIO,
                      f"could not store {found.meta.get('label') or found.key.kernel}: "
                      f"{(cause.strerror or str(cause)) if cause is not None else 'no writable cache root'}", where)


# ---- info --------------------------------------------------------------------------------------------------------
def remote_info(archs: Sequence[str] = ()) -> dict[str, Any] | None:
    """The remote tier's state for `info`, or None when none is configured.  An unreachable remote is reported,
    not raised."""
    if config.remote_cache is None:
        return None
    settings = {"ttl_seconds": config.remote_ttl, "max_entry_size": config.remote_max_entry_size,
                "lock_seconds": config.remote_lock_seconds, "timeout_seconds": config.remote_timeout,
                "backoff_seconds": config.remote_backoff, "signed": config.remote_cache_key is not None}
    result: dict[str, Any] = {"url": redact(config.remote_cache), "reachable": False, "error": None,
                              "settings": settings}
    try:
        fleet = connect()
        result["ping_ms"] = round(fleet.ping() * 1e3, 3)
        result["server"] = fleet.server()
        lines = list(fleet.index())
        live = []
        for start in range(0, len(lines), 1000):
            chunk = lines[start:start + 1000]
            live += fleet.present([full for full, _ in chunk])
    except (ConnectionError, RemoteError) as exc:
        result["error"] = str(exc)
        return result
    except Exception as exc:  # noqa: BLE001 - a server error mid-way: report it
        result["error"] = f"{type(exc).__name__}: {exc}"
        return result
    selected = entry_archs(archs) if archs else None
    by_arch: dict[str, dict[str, int]] = {}
    entries = size = stale = 0
    for (full, line), alive in zip(lines, live):
        line = line or {}
        if selected is not None and line.get("arch") not in selected:
            continue
        if not alive:
            stale += 1
            continue
        entries += 1
        size += int(line.get("size") or 0)
        row = by_arch.setdefault(str(line.get("arch")), {"entries": 0, "size": 0})
        row["entries"] += 1
        row["size"] += int(line.get("size") or 0)
    result.update(reachable=True, entries=entries, size=size, by_arch=by_arch, expired_or_evicted=stale)
    return result
