"""What is cached, whether it is intact, what a manifest would miss, and pruning: list, verify, prune.

Everything goes through jitops.runtime.disk_cache(): the roots of the current jitops.config (read-only
JITOPS_CACHE_PATH roots first, then the writable JITOPS_CACHE_DIR or --cache-dir).  Only the writable root is
ever changed.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import jitops
from jitops import config, runtime
from jitops.cache import CacheEntry, CorruptEntry

from .common import dir_size, entry_archs, iso_time
from .manifest import Job, Plan


def cache_entries(archs: Sequence[str] = ()) -> tuple[list[CacheEntry], list[dict[str, Any]]]:
    """(readable entries, unreadable ones as {"path", "root", "reason"}) of every root, filtered by --arch."""
    selected = entry_archs(archs) if archs else None
    good, bad = [], []
    for item in runtime.disk_cache().entries():
        if isinstance(item, CacheEntry):
            if selected is None or item.meta.get("request", {}).get("arch") in selected:
                good.append(item)
        else:
            path, root, reason = item
            if selected is None or path.parent.parent.name in selected:
                bad.append({"path": str(path), "root": str(root.path), "writable": root.writable, "reason": reason})
    return good, bad


def op_names(meta: dict[str, Any]) -> tuple[str | None, str | None]:
    """(public op, the op that asked) of an entry.  Entries written before public names kept only the op
    that asked (layer_norm_forward): its public op is looked up (an op of a module not imported stays as is)."""
    op, kernel_op = meta.get("op"), meta.get("kernel_op")
    if op is None or kernel_op is not None:
        return op, kernel_op
    try:
        return jitops.find_public(op).name, op
    except ValueError:
        return op, op


def entry_record(entry: CacheEntry) -> dict[str, Any]:
    """One row of `list` (and of an archive's index)."""
    meta, request = entry.meta, entry.meta.get("request", {})
    op, kernel_op = op_names(meta)
    return {
        "op": op, "kernel_op": kernel_op, "kernel": request.get("kernel"), "label": meta.get("label"),
        "backend": request.get("backend"), "arch": request.get("arch"), "dtype": request.get("dtype"),
        "shape_class": meta.get("shape_class") or " ".join(f"{k}={v}" for k, v in request.get("shape_class", [])),
        "size": dir_size(entry.path), "compile_seconds": meta.get("compile_seconds"),
        "created": meta.get("created"), "created_iso": iso_time(meta.get("created")),
        "last_used": entry.last_used, "last_used_iso": iso_time(entry.last_used),
        "toolchain": meta.get("toolchain"), "root": str(entry.root.path), "writable": entry.root.writable,
        "path": str(entry.path),
    }


def list_entries(archs: Sequence[str] = (), ops: Sequence[str] = ()) -> dict[str, Any]:
    good, bad = cache_entries(archs)
    rows = [entry_record(e) for e in good]
    if ops:  # a public op (layer_norm) or one of its ops (layer_norm_backward)
        wanted = {o.removeprefix("jitops::") for o in ops}
        rows = [r for r in rows if r["op"] in wanted or r["kernel_op"] in wanted]
    rows.sort(key=lambda r: (str(r["op"]), str(r["kernel_op"]), str(r["kernel"]), str(r["arch"]), str(r["dtype"]),
                             str(r["label"])))
    return {"roots": roots(), "entries": rows, "unreadable": bad}


def roots() -> list[dict[str, Any]]:
    return [{"path": str(r.path), "writable": r.writable} for r in runtime.disk_cache().roots]


# ---- verify --------------------------------------------------------------------------------------------------
@dataclass
class VerifyReport:
    checked: int = 0
    corrupt: list[dict[str, Any]] = field(default_factory=list)   # {"path", "root", "writable", "reason", "removed"}
    missing: list[dict[str, Any]] = field(default_factory=list)   # manifest kernels a call would not find
    covered: int = 0

    @property
    def ok(self) -> bool:
        return not self.missing and all(c.get("removed") for c in self.corrupt)

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "roots": roots(), "checked": self.checked, "corrupt": self.corrupt,
                "coverage": None if not (self.missing or self.covered) else
                {"covered": self.covered, "missing": self.missing}}


def verify(archs: Sequence[str] = (), jobs: int | None = None, fix: bool = False,
           coverage: Plan | None = None) -> VerifyReport:
    """Check every entry's files against the sha256 and size in its meta.json; with `fix`, remove the corrupt
    ones from the writable root (read-only roots are reported, never changed).  With `coverage`, also say
    which of the plan's kernels a call here would not find."""
    good, bad = cache_entries(archs)
    report = VerifyReport(checked=len(good) + len(bad), corrupt=list(bad))

    def check(entry: CacheEntry) -> dict[str, Any] | None:
        try:
            entry.verify()
        except CorruptEntry as exc:
            return {"path": str(entry.path), "root": str(entry.root.path), "writable": entry.root.writable,
                    "reason": str(exc)}
        return None

    with ThreadPoolExecutor(max_workers=max(1, jobs or config.jobs)) as pool:  # hashlib releases the GIL
        report.corrupt += [c for c in pool.map(check, good) if c is not None]
    if fix:
        disk = runtime.disk_cache()
        for item in report.corrupt:
            if item["writable"] and disk.writable is not None:
                disk.remove(Path(item["path"]), disk.writable)
                item["removed"] = True
            else:
                item["removed"] = False
    if coverage is not None:
        for job in coverage.jobs:
            if is_cached(job):
                report.covered += 1
            else:
                report.missing.append({"op": job.op, "kernel_op": job.kernel_op, "kernel": job.request.kernel,
                                       "label": job.label,
                                       "arch": job.arch, "dtype": job.request.dtype, "shape_class": job.shape_class,
                                       "where": job.call.where, "call": job.call.item()})
    return report


def lookup(job: Job) -> tuple[Any, bool]:
    """The kernel's cache key and whether a call would find it in the cache: the lookup a call makes, with any
    toolchain's build when it could not compile (offline, no compiler)."""
    key, can_compile = runtime.key_for(job.request, job.target)
    return key, runtime.find_entry(key, any_toolchain=config.offline or not can_compile) is not None


def is_cached(job: Job) -> bool:
    return lookup(job)[1]


# ---- prune ---------------------------------------------------------------------------------------------------
@dataclass
class PruneReport:
    removed: list[dict[str, Any]] = field(default_factory=list)
    kept: int = 0
    kept_size: int = 0
    stale: list[str] = field(default_factory=list)
    dry_run: bool = False

    @property
    def freed(self) -> int:
        return sum(r["size"] for r in self.removed)

    def as_dict(self) -> dict[str, Any]:
        return {"dry_run": self.dry_run, "removed": self.removed, "freed": self.freed, "kept": self.kept,
                "kept_size": self.kept_size, "stale_removed": self.stale}


# Temporary directories and lock files untouched this long are leftovers of interrupted writers.
STALE_SECONDS = 3600.0


def prune(max_size: int | None = None, older_than: float | None = None, archs: Sequence[str] = (),
          dry_run: bool = False, now: float | None = None) -> PruneReport:
    """Remove entries of the writable root: first those last used more than `older_than` seconds ago, then
    the least recently used until the rest fits in `max_size` bytes.  Quarantined (corrupt) entries go before
    any good one.  Last use is the stamp the runtime writes at each load, not the filesystem's atime.
    Each entry goes at once (one rename, then the delete): a reader sees all of it or none."""
    disk = runtime.disk_cache()
    report = PruneReport(dry_run=dry_run)
    if disk.writable is None:
        return report
    now = time.time() if now is None else now
    good, _ = cache_entries(archs)
    mine = [e for e in good if e.root.writable]
    # (last used, path, size, description); quarantined entries count as never used.
    candidates: list[tuple[float, Path, int, dict[str, Any]]] = []
    for path in ([] if archs else disk.quarantined()):
        stamp = path.stat().st_mtime if path.exists() else 0.0
        candidates.append((-1.0, path, dir_size(path), {"kernel": path.name, "quarantined": True,
                                                        "last_used": stamp}))
    for entry in mine:
        record = entry_record(entry)
        candidates.append((entry.last_used, entry.path, record["size"],
                           {k: record[k] for k in ("op", "kernel", "label", "arch", "dtype", "last_used")}))
    candidates.sort(key=lambda c: c[0])
    total = sum(c[2] for c in candidates)
    doomed: list[tuple[Path, int, dict[str, Any]]] = []
    for used, path, size, info in candidates:
        stamp = info["last_used"] if used < 0 else used
        too_old = older_than is not None and stamp < now - older_than
        too_big = max_size is not None and total > max_size
        if too_old or too_big:
            doomed.append((path, size, info))
            total -= size
    for path, size, info in doomed:
        if dry_run or disk.remove(path, disk.writable):
            report.removed.append(dict(info, path=str(path), size=size,
                                       last_used_iso=iso_time(info.get("last_used"))))
    report.kept = len(candidates) - len(doomed)
    report.kept_size = total
    if not dry_run:
        report.stale = [str(p) for p in disk.clean_stale(STALE_SECONDS)]
    return report
