"""export / import: one archive file of verified cache entries, to bake into an image or carry between machines.

Archive layout (a plain tar, optionally gzip or zstd compressed), the same as a cache root's, so it also
unpacks straight into a root (Docker's ADD does that for tar and tar.gz):
    jitops-archive.json                              the index: every entry and the sha256 of every file
    v1/<arch>/<dtype>/<kernel>-<request>-<toolchain>/meta.json, kernel.cubin, ...

import trusts nothing in the archive.  It reads the whole archive into a private staging directory first,
rejecting absolute paths, '..', links, device files and anything outside that layout; checks every file
against the index and every entry against its meta.json (sha256 and size) and its key (the directory name
must be the hash of the key in meta.json); and only then publishes each entry with the runtime's atomic
publish.  A bad archive changes nothing in the cache.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any, Sequence

import jitops
from jitops import config, runtime
from jitops.cache import CacheEntry, CacheRoot, CorruptEntry
from jitops.keys import FORMAT_VERSION, CacheKey

from .common import UsageError, WriteError, check_output_file, os_error_message
from .entries import cache_entries, entry_record, op_names

INDEX = "jitops-archive.json"
ARCHIVE_FORMAT = "jitops-cache-archive"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
GZIP_MAGIC = b"\x1f\x8b"
STAMP = "last_used"  # the runtime's last-use stamp: machine-local, never exported
INDEX_LIMIT = 64 << 20  # an index of ~100k entries; a bigger one is not from `export`


@dataclass
class ExportReport:
    path: str
    compression: str
    entries: list[dict[str, Any]] = field(default_factory=list)
    skipped_corrupt: list[dict[str, Any]] = field(default_factory=list)
    size: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"archive": self.path, "compression": self.compression, "size": self.size,
                "entries": self.entries, "skipped_corrupt": self.skipped_corrupt}


def compression_for(path: Path, zstd: bool = False) -> str:
    name = path.name.lower()
    if zstd or name.endswith((".zst", ".zstd", ".tzst")):
        return "zstd"
    if name.endswith((".gz", ".tgz")):
        return "gzip"
    return "none"


def export(output: str | Path, archs: Sequence[str] = (), zstd: bool = False, jobs: int | None = None,
           level: int = 10) -> ExportReport:
    """Write every verified entry of every root (filtered by --arch) into one archive.  Entries that fail
    their checksum are left out and reported.  The file appears complete or not at all (written beside, then
    renamed).  The archive is reproducible: sorted members, fixed owners, mtimes from the entries."""
    output = Path(output)
    check_output_file(output)
    compression = compression_for(output, zstd)
    compressor = _zstd_module() if compression == "zstd" else None
    good, bad = cache_entries(archs)
    report = ExportReport(str(output), compression, skipped_corrupt=list(bad))

    def check(entry: CacheEntry) -> tuple[CacheEntry, dict[str, bytes] | None, str | None]:
        try:
            return entry, entry.verify(), None
        except CorruptEntry as exc:
            return entry, None, str(exc)

    chosen: dict[str, tuple[CacheEntry, dict[str, bytes]]] = {}
    with ThreadPoolExecutor(max_workers=max(1, jobs or config.jobs)) as pool:
        for entry, blobs, problem in pool.map(check, good):
            if blobs is None:
                report.skipped_corrupt.append({"path": str(entry.path), "root": str(entry.root.path),
                                               "reason": problem})
                continue
            relative = entry.path.relative_to(entry.root.path).as_posix()
            chosen.setdefault(relative, (entry, blobs))  # the first root wins, as in a lookup
    index_entries = []
    members: list[tuple[str, bytes, float]] = []
    for relative in sorted(chosen):
        entry, blobs = chosen[relative]
        meta_bytes = (entry.path / "meta.json").read_bytes()
        files = {"meta.json": _digest(meta_bytes)}
        files.update({name: _digest(blobs[name]) for name in sorted(blobs)})
        record = entry_record(entry)
        index_entries.append({"path": relative, "files": files,
                              **{k: record[k] for k in ("op", "kernel_op", "kernel", "label", "backend", "arch",
                                                        "dtype", "shape_class", "compile_seconds")}})
        mtime = float(entry.meta.get("created") or 0)
        members.append((f"{relative}/meta.json", meta_bytes, mtime))
        members += [(f"{relative}/{name}", blobs[name], mtime) for name in sorted(blobs)]
        report.entries.append({"path": relative, "op": record["op"], "label": record["label"],
                               "arch": record["arch"], "dtype": record["dtype"]})
    # "created": the newest entry's, not the clock's, so the same entries always give the same bytes.
    index = {"format": ARCHIVE_FORMAT, "version": 1, "cache_format": FORMAT_VERSION,
             "jitops": jitops.__version__, "created": max((m[2] for m in members), default=0.0),
             "entries": index_entries}
    index_bytes = json.dumps(index, indent=1, sort_keys=True).encode()

    partial = output.with_name(f".{output.name}.{os.getpid()}.partial")
    try:
        with open(partial, "wb") as raw:
            if compressor is not None:
                stream: IO[bytes] = compressor.ZstdCompressor(level=level).stream_writer(raw, closefd=False)
            else:
                stream = raw
            mode = "w:gz" if compression == "gzip" else "w"
            with tarfile.open(fileobj=stream, mode=mode, format=tarfile.PAX_FORMAT) as tar:
                _add(tar, INDEX, index_bytes, index["created"])  # first: a reader learns what to expect
                for name, data, mtime in members:
                    _add(tar, name, data, mtime)
            if compressor is not None:
                stream.close()
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(partial, output)
    except BaseException as exc:
        partial.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise WriteError(f"cannot write {output}: {os_error_message(exc, 'output')}") from None
        raise
    report.size = output.stat().st_size
    return report


def _add(tar: tarfile.TarFile, name: str, data: bytes, mtime: float) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = int(mtime)
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


def _digest(data: bytes) -> dict[str, Any]:
    return {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def _zstd_module() -> Any:
    try:
        import zstandard
    except ImportError:
        raise UsageError("zstd archives need the zstandard package (pip install zstandard, or jitops[zstd]); "
                         "or use a .tar or .tar.gz name") from None
    return zstandard


# ---- import --------------------------------------------------------------------------------------------------
@dataclass
class ImportReport:
    archive: str
    imported: list[dict[str, Any]] = field(default_factory=list)
    present: list[dict[str, Any]] = field(default_factory=list)
    failed: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failed

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "archive": self.archive, "imported": self.imported, "already_present": self.present,
                "failed": self.failed}


def import_archive(archive: str | Path, jobs: int | None = None) -> ImportReport:
    """Check the whole archive, then publish its entries into the writable root (see the module docstring).
    Raises UsageError, having changed nothing, if anything in the archive is unsafe, incomplete or corrupt."""
    archive = Path(archive)
    disk = runtime.disk_cache()
    if disk.writable is None:
        raise UsageError("no writable cache root to import into: give --cache-dir DIR (or set JITOPS_CACHE_DIR)")
    report = ImportReport(str(archive))
    staging = Path(tempfile.mkdtemp(prefix="jitops-import-"))
    try:
        index = _unpack(archive, staging)
        entries = _check_entries(index, staging, archive, jobs)
        for relative, key, meta in entries:
            record = {"path": relative, "op": op_names(meta)[0], "label": meta.get("label"), "arch": key.arch,
                      "dtype": key.dtype}
            existing = disk.writable.entry_dir(key)
            if existing.is_dir():
                if _intact(existing, disk.writable):
                    report.present.append(record)
                    continue
                disk.remove(existing, disk.writable)  # a corrupt copy of the same key: the archive's replaces it
                record["replaced_corrupt"] = True
            files = list(meta["files"])
            kept = {k: v for k, v in meta.items()
                    if k not in ("files", "key", "request", "request_hash", "toolchain", "toolchain_hash",
                                 "format", "created")}
            # publish() copies into the root's tmp/, fsyncs and renames: the runtime's own atomic store.
            if disk.publish(key, staging / relative, files, kept) is None:
                report.failed.append(dict(record, reason=f"could not write to {disk.writable.path} (see the "
                                                         "warning above: disk full or read-only?)"))
            else:
                report.imported.append(record)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return report


def _intact(path: Path, root: CacheRoot) -> bool:
    try:
        CacheEntry(path, root, json.loads((path / "meta.json").read_text())).verify()
        return True
    except (OSError, ValueError, CorruptEntry, AttributeError):
        return False


def _open_stream(archive: Path, raw: IO[bytes]) -> tuple[IO[bytes], str]:
    magic = raw.read(4)
    raw.seek(0)
    if magic.startswith(ZSTD_MAGIC):
        return _zstd_module().ZstdDecompressor().stream_reader(raw), "r|"
    if magic.startswith(GZIP_MAGIC):
        return raw, "r|gz"
    return raw, "r|"


def _unpack(archive: Path, staging: Path) -> dict[str, Any]:
    """Stream every member into `staging`, refusing anything that is not a plain file at a cache path."""
    bad = f"{archive} is not a safe jitops cache archive"
    try:
        raw = open(archive, "rb")
    except FileNotFoundError:
        raise UsageError(f"archive {archive} not found") from None
    except IsADirectoryError:
        raise UsageError(f"archive {archive} is a directory; give the archive file `export` wrote") from None
    except OSError as exc:
        raise UsageError(f"cannot read archive {archive}: {os_error_message(exc, 'input')}") from None
    seen: set[str] = set()
    index_bytes = None
    if os.fstat(raw.fileno()).st_size == 0:
        raw.close()
        raise UsageError(f"{archive} is an empty file, not an archive.  Nothing was imported.")
    try:
        with raw:
            stream, mode = _open_stream(archive, raw)
            with tarfile.open(fileobj=stream, mode=mode) as tar:
                for member in tar:
                    name = _safe_name(member.name, bad)
                    if member.isdir():
                        continue
                    if not member.isreg():
                        kind = ("a symbolic link" if member.issym() else "a hard link" if member.islnk() else
                                "a device file" if member.ischr() or member.isblk() else
                                "a FIFO" if member.isfifo() else "not a regular file")
                        raise UsageError(f"{bad}: member {member.name!r} is {kind}; archives from "
                                         "`jitops-cache export` hold regular files only.  Nothing was imported.")
                    if name != INDEX and name.count("/") != 4:
                        raise UsageError(f"{bad}: file {name!r} is not at a cache entry path "
                                         f"(v{FORMAT_VERSION}/<arch>/<dtype>/<entry>/<file>).  Nothing was imported.")
                    if name in seen:
                        raise UsageError(f"{bad}: member {name!r} appears twice.  Nothing was imported.")
                    seen.add(name)
                    source = tar.extractfile(member)
                    assert source is not None
                    if name == INDEX:
                        if member.size > INDEX_LIMIT:
                            raise UsageError(f"{bad}: its index is {member.size} bytes.  Nothing was imported.")
                        index_bytes = source.read()
                        if len(index_bytes) != member.size:
                            raise EOFError(f"member {name!r} is cut short")
                        continue
                    target = staging / name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with open(target, "xb") as fh:  # our own file, mode 0644 by umask: no bits from the tar
                        shutil.copyfileobj(source, fh, 1 << 20)
                        if fh.tell() != member.size:
                            raise EOFError(f"member {name!r} is cut short")
    except UsageError:
        raise
    except Exception as exc:  # tarfile.ReadError, EOFError, zstd errors: a truncated or damaged archive
        raise UsageError(f"{archive} is truncated or damaged ({type(exc).__name__}: {exc}).  "
                         "Nothing was imported; export it again.") from None
    if index_bytes is None:
        raise UsageError(f"{archive} has no {INDEX}: it was not made by `jitops-cache export`.  Nothing was "
                         "imported.")
    try:
        index = json.loads(index_bytes)
    except ValueError:
        raise UsageError(f"{archive}: {INDEX} is not valid JSON (damaged archive).  Nothing was imported.") from None
    if not isinstance(index, dict) or index.get("format") != ARCHIVE_FORMAT or \
            not isinstance(index.get("entries"), list):
        raise UsageError(f"{archive}: {INDEX} is not a jitops cache archive index.  Nothing was imported.")
    if index.get("cache_format") != FORMAT_VERSION:
        raise UsageError(f"{archive} holds cache format v{index.get('cache_format')}; this jitops reads "
                         f"v{FORMAT_VERSION}.  Export it again with this jitops version.  Nothing was imported.")
    listed = {INDEX}
    for item in index["entries"]:
        path = item.get("path") if isinstance(item, dict) else None
        files = item.get("files") if isinstance(item, dict) else None
        if not isinstance(path, str) or not isinstance(files, dict) or \
                any(not isinstance(n, str) or "/" in n or n.startswith(".") for n in files):
            raise UsageError(f"{archive}: {INDEX} has a malformed entry.  Nothing was imported.")
        if _safe_name(f"{path}/meta.json", bad) != f"{path}/meta.json" or path.count("/") != 3:
            raise UsageError(f"{bad}: its index names the entry path {path!r}, which is not "
                             f"v{FORMAT_VERSION}/<arch>/<dtype>/<entry>.  Nothing was imported.")
        listed |= {f"{path}/{name}" for name in files}
    missing = sorted(listed - seen - {INDEX})
    if missing:
        raise UsageError(f"{archive} is truncated: {len(missing)} file(s) its index lists are absent, e.g. "
                         f"{missing[0]}.  Nothing was imported; export it again.")
    extra = sorted(seen - listed)
    if extra:
        raise UsageError(f"{archive} holds files its index does not list, e.g. {extra[0]}.  Nothing was imported.")
    return index


def _safe_name(name: str, bad: str) -> str:
    """A member name that stays inside the staging directory and has the layout of a cache root."""
    if "\\" in name or "\x00" in name:
        raise UsageError(f"{bad}: member {name!r} has a backslash or NUL in its name.  Nothing was imported.")
    path = PurePosixPath(name)
    if path.is_absolute():
        raise UsageError(f"{bad}: member {name!r} is an absolute path.  Nothing was imported.")
    parts = [p for p in path.parts if p != "."]
    if ".." in parts:
        raise UsageError(f"{bad}: member {name!r} climbs out with '..'.  Nothing was imported.")
    clean = "/".join(parts)
    if clean == INDEX:
        return clean
    if not parts or parts[0] != f"v{FORMAT_VERSION}" or len(parts) > 5 or \
            any(p.startswith(".") or p in ("tmp", "locks", "quarantine") for p in parts[1:]):
        raise UsageError(f"{bad}: member {name!r} is not at a cache entry path "
                         f"(v{FORMAT_VERSION}/<arch>/<dtype>/<entry>/<file>).  Nothing was imported.")
    return clean


def _check_entries(index: dict[str, Any], staging: Path, archive: Path,
                   jobs: int | None) -> list[tuple[str, CacheKey, dict[str, Any]]]:
    """Every entry: its files match the index and its meta.json, and its path is its key's.  All or nothing."""
    root = CacheRoot(staging, writable=False)

    def check(item: dict[str, Any]) -> tuple[str, CacheKey, dict[str, Any]]:
        relative = str(item["path"])
        where = f"{archive}: entry {relative}"
        directory = staging / relative
        present = {p.name for p in directory.iterdir()} if directory.is_dir() else set()
        if set(item["files"]) != present or "meta.json" not in present:
            raise UsageError(f"{where} does not hold exactly the files its index lists.  Nothing was imported.")
        for name, expected in item["files"].items():
            data = (directory / name).read_bytes()
            if not isinstance(expected, dict) or _digest(data) != {"sha256": expected.get("sha256"),
                                                                   "size": expected.get("size")}:
                raise UsageError(f"{where}: {name} does not match its sha256 in the index (corrupt archive).  "
                                 "Nothing was imported.")
        try:
            meta = json.loads((directory / "meta.json").read_text())
            key = CacheKey(meta["request"], meta["toolchain"])
            if meta.get("format") != FORMAT_VERSION or not isinstance(meta.get("files"), dict):
                raise ValueError("no format or files")
            expected_path = f"v{FORMAT_VERSION}/{key.arch}/{key.dtype}/{key.dirname()}"
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise UsageError(f"{where}: meta.json is not a jitops entry's ({exc}).  Nothing was imported.") from None
        if expected_path != relative or meta.get("request_hash") != key.request_hash:
            raise UsageError(f"{where}: its key in meta.json belongs at {expected_path}; the entry was renamed "
                             "or edited.  Nothing was imported.")
        if set(meta["files"]) | {"meta.json"} != present:
            raise UsageError(f"{where}: its files differ from those its meta.json lists.  Nothing was imported.")
        try:
            CacheEntry(directory, root, meta).verify()
        except CorruptEntry as exc:
            raise UsageError(f"{where} is corrupt: {exc}.  Nothing was imported.") from None
        return relative, key, meta

    with ThreadPoolExecutor(max_workers=max(1, jobs or config.jobs)) as pool:
        return list(pool.map(check, index["entries"]))
