"""Pieces every subcommand shares: the bad-input error, arch/size/age parsing, and plain-text tables."""
from __future__ import annotations

import errno
import json
import os
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Sequence, TextIO

from jitops import Target


class UsageError(Exception):
    """Bad input (a flag, a manifest, an archive): the CLI prints the message and exits with code 2.
    Raised before anything in the cache is changed."""


class WriteError(Exception):
    """A write of a file the user named failed part-way (a full disk): the CLI prints the message, which names
    the path and the remedy, and exits with code 1."""


# ---- archs ---------------------------------------------------------------------------------------------------------
def parse_archs(values: Iterable[str] | None) -> list[str]:
    """--arch values (repeatable, comma-separated) -> normalized arch names, in order, without duplicates.
    'sm_90a' stays 'sm_90a' (kernels that need arch-specific instructions build for it; the others for sm_90)."""
    archs: list[str] = []
    for value in values or ():
        for part in str(value).split(","):
            part = part.strip()
            if not part:
                continue
            try:
                Target.parse(part)
            except ValueError as exc:
                raise UsageError(str(exc).removeprefix("jitops: ")) from None
            name = normalize_arch(part)
            if name not in archs:
                archs.append(name)
    return archs


def normalize_arch(arch: str) -> str:
    """'90a', 'SM_90A', 'sm90a' -> 'sm_90a'; 'cpu' -> 'cpu'."""
    target = Target.parse(arch)
    if target.device_type == "cpu":
        return "cpu"
    return target.arch(specific=arch.strip().lower().endswith("a"))


def entry_archs(archs: Sequence[str]) -> set[str]:
    """The entry arch directories a set of --arch values selects: sm_90a selects both sm_90 and sm_90a entries
    (an sm_90 device loads both kinds), sm_80 selects sm_80."""
    selected = set()
    for arch in archs:
        target = Target.parse(arch)
        selected.add(target.arch(False))
        selected.add(target.arch(True))
    return selected


def check_archs_supported(archs: Sequence[str]) -> None:
    """Bad input, before any work: a GPU arch that no compiler installed here can target (sm_999, or one newer
    than this CUDA).  Where no compiler is installed nothing can be checked; prewarm then reports every kernel
    as one it cannot build here."""
    from jitops.backends import toolkit

    gpu = [a for a in archs if a != "cpu"]
    if not gpu:
        return
    compilers = {name: found for name, found in (("NVRTC", toolkit.nvrtc_archs()), ("nvcc", toolkit.nvcc_archs()))
                 if found is not None}
    if not compilers:
        return
    for arch in gpu:
        if not any(toolkit.arch_number(arch) in found for found in compilers.values()):
            known = "; ".join(f"{name} compiles for {toolkit.format_archs(found)}" for name, found in compilers.items())
            raise UsageError(f"--arch {arch}: no compiler here can build for it ({known}).  Use one of those "
                             "(sm_80 for A100, sm_90a for H100), or install the CUDA release that supports it")


# ---- filesystem errors ---------------------------------------------------------------------------------------------
# What to do, by errno, when a write into the cache root failed ("cache"), a write of a file the user named
# (an export's archive: "output") or a read of one (an archive to import: "input").
_REMEDIES = {
    "cache": {
        errno.EROFS: "the filesystem is read-only: give a writable --cache-dir (a read-only cache is read, never "
                     "changed, through JITOPS_CACHE_PATH)",
        errno.EACCES: "permission denied: run as the owner of that path, or give a --cache-dir you can write",
        errno.EPERM: "not permitted: run as the owner of that path, or give a --cache-dir you can write",
        errno.ENOSPC: "the disk is full: free space there (`prune --max-size SIZE` frees cache space) or give a "
                      "--cache-dir on another disk",
        errno.EDQUOT: "the disk quota is exhausted: free space there or give a --cache-dir elsewhere",
        errno.ENAMETOOLONG: "the path is too long: use a shorter --cache-dir",
    },
    "output": {
        errno.EROFS: "the filesystem is read-only: write the file to a writable directory",
        errno.EACCES: "permission denied: write the file to a directory you can write",
        errno.EPERM: "not permitted: write the file to a directory you can write",
        errno.ENOSPC: "the disk is full: free space there or write the file to another disk",
        errno.EDQUOT: "the disk quota is exhausted: free space there or write the file elsewhere",
        errno.ENAMETOOLONG: "the path is too long: give a shorter file name",
    },
    "input": {
        errno.EACCES: "permission denied: run as a user who can read it, or copy it somewhere readable",
        errno.EPERM: "not permitted: run as a user who can read it, or copy it somewhere readable",
    },
}
_ANY_PATH = {
    errno.ENOENT: "it does not exist: create it, or check the path",
    errno.ENOTDIR: "a part of that path is a file, not a directory: check the path",
    errno.EISDIR: "it is a directory where a file was expected: give a file name",
}


def os_error_message(exc: OSError, subject: str = "cache") -> str:
    """'Read-only file system: /c/v1/x -> /c/v1/tmp/x.removed; the filesystem is read-only: give a writable
    --cache-dir ...': what failed, on which path, and what to do.  `subject`: "cache" (a write into the cache
    root), "output" or "input" (a file the user named: an export's archive, an archive to import)."""
    paths = [str(p) for p in (exc.filename, exc.filename2) if p is not None]
    what = exc.strerror or str(exc).removeprefix("jitops: ")
    text = what + (f": {' -> '.join(paths)}" if paths else "")
    remedy = None
    if exc.errno is not None:
        remedy = _REMEDIES[subject].get(exc.errno) or _ANY_PATH.get(exc.errno)
    return f"{text}; {remedy}" if remedy else text


def storage_error(exc: OSError) -> bool:
    """A write refused for lack of space or permission (not, say, a compiler that is not installed)."""
    return exc.errno in _REMEDIES["cache"]


def _nearest_existing(path: Path) -> Path:
    existing = Path(path)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    return existing


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def check_writable(path: Path) -> None:
    """Bad input before anything is written: `path` (or the directory that would hold it) is on a read-only
    filesystem, below a file, or not writable by this user."""
    existing = _nearest_existing(path)
    if not existing.is_dir():
        raise UsageError(f"the cache root {path} cannot be made: {existing} is a file, not a directory; give "
                         "another --cache-dir")
    if _read_only(existing):
        raise UsageError(f"the cache root {path} is on a read-only filesystem ({existing}); give a writable "
                         "--cache-dir (a read-only cache is read, never changed, through JITOPS_CACHE_PATH)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"the cache root {path} is not writable by this user ({existing}); run as its owner, "
                         "or give a --cache-dir you can write")


def check_output_file(output: Path) -> None:
    """Bad input before any work: a file the user asked to write (an export's archive) cannot be written
    where they named it.  Its directory must exist: a typo'd path is not silently created."""
    directory = output.parent
    if output.is_dir():
        raise UsageError(f"{output} is a directory; give the archive's file name, e.g. {output / 'kernels.tar.gz'}")
    if not directory.exists():
        raise UsageError(f"cannot write {output}: the directory {directory} does not exist; create it first "
                         f"(mkdir -p {shlex.quote(str(directory))}) or give another path")
    if not directory.is_dir():
        raise UsageError(f"cannot write {output}: {directory} is a file, not a directory; give another path")
    if _read_only(directory):
        raise UsageError(f"cannot write {output}: {directory} is on a read-only filesystem; write the file to a "
                         "writable directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write {output}: the directory {directory} is not writable by this user; write "
                         "the file to a directory you can write")


# ---- sizes and ages ------------------------------------------------------------------------------------------------
_SIZE_UNITS = {"": 1, "b": 1,
               "k": 2**10, "kib": 2**10, "m": 2**20, "mib": 2**20, "g": 2**30, "gib": 2**30, "t": 2**40, "tib": 2**40,
               "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


def parse_size(text: str) -> int:
    """'500M' (MiB), '2G', '1.5GiB', '800MB' (10**6 bytes), '4096' (bytes) -> bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = match.group(2).lower() if match else None
    if not match or unit not in _SIZE_UNITS:
        raise UsageError(f"{text!r} is not a size; use a number of bytes or one with a unit: 500M, 2G, 1.5GiB, "
                         "800MB (K, M, G, T and KiB, MiB, GiB, TiB are powers of 1024; KB, MB, GB, TB of 1000)")
    return int(float(match.group(1)) * _SIZE_UNITS[unit])


_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str) -> float:
    """'30d', '12h', '90m', '45s', '2w', '1d12h' -> seconds."""
    compact = str(text).replace(" ", "").lower()
    parts = re.findall(r"(\d+(?:\.\d+)?)([smhdw])", compact)
    if not compact or "".join(n + u for n, u in parts) != compact:
        raise UsageError(f"{text!r} is not an age; use a number with a unit: 30d, 12h, 90m, 45s, 2w or 1d12h")
    return sum(float(n) * _AGE_UNITS[u] for n, u in parts)


def format_size(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"  # pragma: no cover - unreachable


def format_age(stamp: float | None, now: float | None = None) -> str:
    """How long ago `stamp` was: '12 s ago', '5 min ago', '3 h ago', '2 d ago'."""
    if not stamp:
        return "-"
    seconds = max((now or time.time()) - stamp, 0)
    for limit, unit, div in ((90, "s", 1), (90 * 60, "min", 60), (36 * 3600, "h", 3600)):
        if seconds < limit:
            return f"{seconds / div:.0f} {unit} ago"
    return f"{seconds / 86400:.0f} d ago"


def iso_time(stamp: float | None) -> str | None:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(stamp)) if stamp else None


def dir_size(path: Path) -> int:
    """Bytes of the regular files under `path` (an entry: binaries, meta.json, logs, the stamp)."""
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


# ---- output --------------------------------------------------------------------------------------------------------
def print_table(rows: Sequence[Sequence[Any]], header: Sequence[str], out: TextIO | None = None,
                right: Iterable[int] = ()) -> None:
    """A plain aligned table; columns whose index is in `right` are right-aligned (numbers)."""
    out = out or sys.stdout
    right = set(right)
    cells = [[str(c) for c in header]] + [["-" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))

    print(line(cells[0]).rstrip(), file=out)
    print("  ".join("-" * w for w in widths), file=out)
    for row in cells[1:]:
        print(line(row).rstrip(), file=out)


def print_json(value: Any, out: TextIO | None = None) -> None:
    json.dump(value, out or sys.stdout, indent=2, sort_keys=False, default=_json_default)
    (out or sys.stdout).write("\n")


def _json_default(value: Any) -> Any:
    return str(value)  # Paths, dtypes: their text


def compact_shape_class(text: str | None) -> str:
    """'GeluClass(dtype=torch.bfloat16, vec=8, approximate='tanh', index='int')' ->
    'dtype=bfloat16 vec=8 approximate=tanh index=int' (for tables; --json keeps the full text)."""
    if not text:
        return "-"
    inner = re.sub(r"^\w+\((.*)\)$", r"\1", text)
    return inner.replace("torch.", "").replace("'", "").replace(", ", " ")
