"""On-disk kernel cache: entries under one writable root and any number of read-only roots.

Layout of a root:
    <root>/v1/<arch>/<dtype>/<kernel>-<request16>-<toolchain8>/   an entry: binaries, meta.json, last_used
    <root>/v1/tmp/          entries being written (renamed into place when complete)
    <root>/v1/locks/        one lock file per key (flock: the OS drops it if the holder dies)
    <root>/v1/quarantine/   entries that failed their checksum, moved aside for inspection

Safety rules, each with a test:
  * an entry appears by one rename of a complete directory: readers never see half an entry; a compile's entry
    is fsynced first, an entry copied from the remote tier is not (a crash that tears it leaves files that fail
    their checksum, and fetching it again takes milliseconds where the fsyncs took 3-30 ms of a remote hit);
  * every file's sha256 (recorded in meta.json) is checked before anything is loaded; a bad entry is moved
    aside and never loaded;
  * read-only roots are read, never written (no stamps, no locks, no quarantine);
  * ENOSPC/EROFS while storing leaves the cache as it was; the caller keeps the kernel in memory.
Nothing in an entry is unpickled or executed except binaries whose checksum matched.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import filelock

from ..keys import FORMAT_VERSION, CacheKey

log = logging.getLogger("jitops")

META = "meta.json"
STAMP = "last_used"
_STORE_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EACCES, errno.EPERM}


class CorruptEntry(Exception):
    """An entry whose meta.json or files do not match their recorded checksums."""


@dataclass(frozen=True)
class CacheRoot:
    path: Path
    writable: bool

    @property
    def base(self) -> Path:
        return self.path / f"v{FORMAT_VERSION}"

    def entry_dir(self, key: CacheKey) -> Path:
        return self.base / key.arch / key.dtype / key.dirname()


@dataclass
class CacheEntry:
    path: Path
    root: CacheRoot
    meta: dict[str, Any] = field(repr=False)

    @property
    def files(self) -> dict[str, dict[str, Any]]:
        return self.meta.get("files", {})

    def file(self, name: str) -> Path:
        return self.path / name

    @property
    def size(self) -> int:
        return sum(int(f.get("size", 0)) for f in self.files.values())

    @property
    def last_used(self) -> float:
        try:
            return (self.path / STAMP).stat().st_mtime
        except OSError:
            return float(self.meta.get("created", 0))

    def verify(self) -> dict[str, bytes]:
        """Read every file and check its size and sha256; return the verified bytes.  Raises CorruptEntry."""
        if not self.files:
            raise CorruptEntry("meta.json lists no files")
        blobs = {}
        for name, info in self.files.items():
            if "/" in name or name.startswith("."):
                raise CorruptEntry(f"unsafe file name {name!r} in meta.json")
            try:
                data = (self.path / name).read_bytes()
            except OSError as exc:
                raise CorruptEntry(f"{name}: {exc.strerror or exc}") from None
            if len(data) != info.get("size"):
                raise CorruptEntry(f"{name}: {len(data)} bytes, meta.json says {info.get('size')} (truncated?)")
            if hashlib.sha256(data).hexdigest() != info.get("sha256"):
                raise CorruptEntry(f"{name}: sha256 does not match meta.json")
            blobs[name] = data
        return blobs

    def touch(self) -> None:
        """Write the last-used stamp (prune orders by it, not by filesystem atime)."""
        if not self.root.writable:
            return
        stamp = self.path / STAMP
        try:
            os.utime(stamp)
        except FileNotFoundError:
            with contextlib.suppress(OSError):
                stamp.touch()
        except OSError:
            pass


def _read_meta(path: Path) -> dict[str, Any]:
    try:
        meta = json.loads((path / META).read_text())
    except FileNotFoundError:
        raise CorruptEntry("meta.json is missing") from None
    except (OSError, ValueError) as exc:
        raise CorruptEntry(f"meta.json is unreadable: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_VERSION:
        raise CorruptEntry("meta.json has no format field or another format version")
    return meta


def entry_meta(key: CacheKey, blobs: dict[str, bytes], meta: dict[str, Any],
               checked: bool = False) -> dict[str, Any]:
    """An entry's meta.json: `meta` (backend fields, label, compile seconds, op) plus both key halves and the
    sha256 and size of every file.  The same dict travels with an entry to and from the remote tier.

    `checked`: meta["files"] holds the sha256 and size of exactly these blobs, just compared with their bytes (a
    verified remote entry), so they are taken as they are: hashing a 2.7 MB CUTLASS cubin again costs 1.5 ms of
    a remote hit."""
    given = meta.get("files") if checked else None
    if (isinstance(given, dict) and given.keys() == blobs.keys()
            and all(isinstance(given[name], dict) and given[name].get("size") == len(data)
                    and isinstance(given[name].get("sha256"), str) for name, data in blobs.items())):
        records = {name: {"sha256": given[name]["sha256"], "size": len(data)} for name, data in blobs.items()}
    else:
        records = {name: {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
                   for name, data in blobs.items()}
    return dict(meta, format=FORMAT_VERSION, key=key.full, request=key.request, request_hash=key.request_hash,
                toolchain=key.toolchain, toolchain_hash=key.toolchain_hash, files=records,
                created=meta.get("created") or time.time())


def _children(directory: Path) -> list[Path]:
    try:
        return sorted(directory.iterdir())
    except OSError:
        return []


def _no_sync(path: Path) -> None:
    pass


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class DiskCache:
    """Read-only roots first (images), then the writable root."""

    def __init__(self, writable: Path | None, readonly: tuple[Path, ...] = ()) -> None:
        self.roots: list[CacheRoot] = [CacheRoot(Path(p), False) for p in readonly]
        self.writable: CacheRoot | None = CacheRoot(Path(writable), True) if writable else None
        if self.writable is not None:
            self.roots.append(self.writable)
        self._store_warned = False
        self.store_error: OSError | None = None  # the last write into the writable root that failed

    # ---- reading -------------------------------------------------------------------------------------------
    def candidates(self, key: CacheKey, any_toolchain: bool) -> Iterator[CacheEntry | tuple[Path, CacheRoot, str]]:
        """Entries for `key`, best first: the exact toolchain in each root, then any toolchain's build of the
        same request, newest first: from read-only roots always (they are shipped builds, made on purpose on
        another machine), from the writable root only if `any_toolchain`.  Unreadable entries come as
        (path, root, reason)."""
        seen: set[Path] = set()
        for root in self.roots:
            exact = root.entry_dir(key)
            if exact.is_dir():
                seen.add(exact)
                yield self._open(exact, root)
        for root in self.roots:
            if root.writable and not any_toolchain:
                continue
            parent = root.base / key.arch / key.dtype
            try:
                names = [n for n in os.listdir(parent) if n.startswith(key.request_prefix())]
            except OSError:
                continue
            opened = [self._open(parent / n, root) for n in names if parent / n not in seen]
            good = [e for e in opened if isinstance(e, CacheEntry) and e.meta.get("request") == key.request]
            good.sort(key=lambda e: e.meta.get("created", 0), reverse=True)
            yield from good

    @staticmethod
    def _open(path: Path, root: CacheRoot) -> CacheEntry | tuple[Path, CacheRoot, str]:
        try:
            return CacheEntry(path, root, _read_meta(path))
        except CorruptEntry as exc:
            return (path, root, str(exc))

    def entries(self) -> Iterator[CacheEntry | tuple[Path, CacheRoot, str]]:
        """Every entry of every root (for cache_tools)."""
        for root in self.roots:
            if not root.base.is_dir():
                continue
            for arch_dir in sorted(p for p in root.base.iterdir() if p.is_dir()):
                if arch_dir.name in {"tmp", "locks", "quarantine"}:
                    continue
                for dtype_dir in sorted(p for p in arch_dir.iterdir() if p.is_dir()):
                    for entry_dir in sorted(p for p in dtype_dir.iterdir() if p.is_dir()):
                        yield self._open(entry_dir, root)

    # ---- writing -------------------------------------------------------------------------------------------
    def _ensure_base(self) -> Path | None:
        root = self.writable
        if root is None:
            return None
        try:
            if not root.path.exists():
                root.path.mkdir(mode=0o700, parents=True, exist_ok=True)
            for sub in ("tmp", "locks"):
                (root.base / sub).mkdir(parents=True, exist_ok=True)
            return root.base
        except OSError as exc:
            self._warn_store(exc)
            return None

    @contextlib.contextmanager
    def lock(self, key: CacheKey, timeout: float, on_wait: Any = None) -> Iterator[None]:
        """Per-key lock across processes.  flock-based, so a holder that dies (even by SIGKILL) releases it."""
        base = self._ensure_base()
        if base is None:  # nowhere to lock: compile privately
            yield
            return
        path = base / "locks" / f"{key.request_hash[:24]}-{key.toolchain_hash[:8]}.lock"
        lock = filelock.FileLock(str(path))
        try:
            lock.acquire(timeout=1.0)
        except filelock.Timeout:
            if on_wait is not None:
                on_wait()
            try:
                lock.acquire(timeout=max(timeout - 1.0, 0.0))
            except filelock.Timeout:
                raise TimeoutError(
                    f"jitops: waited {timeout:.0f} s for another process compiling {key.kernel} ({path}); "
                    "raise JITOPS_LOCK_TIMEOUT if that compile is legitimately slow") from None
        except OSError as exc:  # read-only lock dir and the like: compile without the lock
            self._warn_store(exc)
            yield
            return
        try:
            yield
        finally:
            lock.release()

    def publish(self, key: CacheKey, build_dir: Path, files: list[str], meta: dict[str, Any]) -> CacheEntry | None:
        """Copy `files` from build_dir into a new entry atomically.  None (and one warning) if storing failed."""
        return self.store(key, {name: (build_dir / name).read_bytes() for name in files}, meta)

    def store(self, key: CacheKey, blobs: dict[str, bytes], meta: dict[str, Any], durable: bool = True,
              checked: bool = False) -> CacheEntry | None:
        """Write `blobs` as a new entry atomically (a compile's files, or a verified remote entry).  `durable`:
        fsync the files and directories before and after the rename.  `checked`: meta["files"] was just compared
        with these bytes (entry_meta() takes it as it is).  None (and one warning) if storing failed."""
        sync = _fsync_path if durable else _no_sync

        def write(path: Path, data: bytes) -> None:
            with open(path, "wb") as fh:
                fh.write(data)
                if durable:
                    fh.flush()
                    os.fsync(fh.fileno())

        base = self._ensure_base()
        if base is None:
            return None
        assert self.writable is not None
        final = self.writable.entry_dir(key)
        tmp = base / "tmp" / f"{key.dirname()}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        try:
            tmp.mkdir(parents=True)
            for name, data in blobs.items():
                write(tmp / name, data)
            full_meta = entry_meta(key, blobs, meta, checked)
            write(tmp / META, json.dumps(full_meta, indent=1, sort_keys=True).encode())
            (tmp / STAMP).touch()
            sync(tmp)
            final.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.rename(tmp, final)
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                # Someone published the same key first (it can only be the same build): keep theirs.
                shutil.rmtree(tmp, ignore_errors=True)
                existing = self._open(final, self.writable)
                return existing if isinstance(existing, CacheEntry) else None
            sync(final.parent)
            return CacheEntry(final, self.writable, full_meta)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if exc.errno in _STORE_ERRNOS:
                self._warn_store(exc)
                return None
            raise

    def quarantine(self, path: Path, root: CacheRoot, reason: str) -> None:
        """Move a bad entry aside (writable root) or skip it (read-only root).  Never loads it."""
        if not root.writable:
            log.warning("ignoring bad cache entry %s in read-only root %s: %s", path.name, root.path, reason)
            return
        target = root.base / "quarantine" / f"{path.name}.{int(time.time())}.{uuid.uuid4().hex[:6]}"
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.rename(path, target)
            log.warning("cache entry %s is corrupt (%s); moved to %s and rebuilding", path.name, reason, target)
        except OSError as exc:
            if not path.exists():  # another process moved it first
                return
            log.warning("cache entry %s is corrupt (%s) and could not be moved aside (%s); ignoring it",
                        path.name, reason, exc)

    # ---- maintenance (cache_tools prune, verify --fix) -----------------------------------------------------
    def remove(self, path: Path, root: CacheRoot) -> bool:
        """Delete an entry (or a quarantined one) of the writable root atomically: one rename into tmp/, so
        readers see the whole entry or none of it, then the delete.  False if it was already gone."""
        if not root.writable:
            raise PermissionError(f"jitops: {root.path} is a read-only cache root; nothing in it is removed")
        aside = root.base / "tmp" / f"{path.name}.removed.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        try:
            aside.parent.mkdir(parents=True, exist_ok=True)
            os.rename(path, aside)
        except FileNotFoundError:
            return False
        shutil.rmtree(aside, ignore_errors=True)
        return True

    def quarantined(self) -> list[Path]:
        """Entries of the writable root that were moved aside as corrupt (kept for inspection)."""
        if self.writable is None:
            return []
        try:
            return sorted(p for p in (self.writable.base / "quarantine").iterdir() if p.is_dir())
        except OSError:
            return []

    def clean_stale(self, older_than: float) -> list[Path]:
        """Remove what interrupted writers left in the writable root: temporary directories and lock files
        not modified for `older_than` seconds.  A lock file is removed only while this process holds its lock
        (a held lock is someone compiling).  A process that opened it just before may then compile alongside
        one that creates a new lock file: both builds are the same and publish() keeps one.  Returns what was
        removed."""
        if self.writable is None:
            return []
        removed: list[Path] = []
        cutoff = time.time() - older_than
        for path in _children(self.writable.base / "tmp"):
            with contextlib.suppress(OSError):
                if path.lstat().st_mtime < cutoff:
                    if path.is_dir() and not path.is_symlink():
                        shutil.rmtree(path)
                    else:
                        path.unlink()
                    removed.append(path)
        for path in _children(self.writable.base / "locks"):
            with contextlib.suppress(OSError):
                if path.suffix != ".lock" or path.stat().st_mtime >= cutoff:
                    continue
                lock = filelock.FileLock(str(path))
                try:
                    lock.acquire(timeout=0)
                except filelock.Timeout:
                    continue
                try:
                    path.unlink()
                    removed.append(path)
                finally:
                    lock.release()
        return removed

    def _warn_store(self, exc: OSError) -> None:
        self.store_error = exc
        if not self._store_warned:
            self._store_warned = True
            root = self.writable.path if self.writable else "(none)"
            log.warning("cannot write the kernel cache at %s (%s); compiled kernels stay in memory for "
                        "this process only.  Set JITOPS_CACHE_DIR to a writable directory to keep them.",
                        root, exc.strerror or exc)
