"""get_kernel(): memory -> disk -> lock and re-check -> compile -> publish -> load.

The only module that joins the cache and the backends.  Ops call get_kernel() on a miss of their own
shape-class table (a dict lookup per call); everything here runs once per kernel per process.
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import backends
from .backends import processes, toolkit
from .cache import CacheEntry, CorruptEntry, DiskCache
from .config import config
from .errors import CacheMissError, ToolchainError
from .keys import CacheKey, request_components
from .specs import BuildRequest, Target

log = logging.getLogger("jitops")


@dataclass
class Stats:
    """Counters since the process started (or reset_stats())."""

    memory_hits: int = 0      # op calls served by a shape class already loaded in this process
    disk_hits: int = 0        # kernels loaded from a cache root
    compiles: int = 0         # kernels compiled
    compile_seconds: float = 0.0
    failed_compiles: int = 0
    corrupt_entries: int = 0  # entries that failed verification and were moved aside or skipped

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


stats = Stats()


def reset_stats() -> None:
    for name, value in asdict(Stats()).items():
        setattr(stats, name, value)


@dataclass(frozen=True)
class MissContext:
    """Who asked for a kernel: for progress messages, JITOPS_RECORD lines and offline errors."""

    op: str                          # the public op ("layer_norm")
    shape_class: Any
    manifest_item: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    kernel_op: str | None = None     # the op that asked, when it is not the public one ("layer_norm_backward")


class Runtime:
    def __init__(self) -> None:
        self._loaded: dict[tuple[BuildRequest, str, int | None], Any] = {}
        # Builds that could not be stored (EROFS, ENOSPC): key -> (directory, files, meta), kept until exit.
        self._private: dict[str, tuple[Path, list[str], dict[str, Any]]] = {}
        self._locks: dict[tuple[BuildRequest, str, int | None], threading.Lock] = {}
        self._guard = threading.Lock()
        self._disk: tuple[tuple[Any, ...], DiskCache] | None = None
        self._recorded: set[str] = set()

    # ---- configuration -------------------------------------------------------------------------------------
    def disk_cache(self) -> DiskCache:
        """The DiskCache for the current JITOPS_CACHE_DIR / JITOPS_CACHE_PATH (rebuilt when they change)."""
        roots = (config.cache_dir, config.cache_path)
        if self._disk is None or self._disk[0] != roots:
            self._disk = (roots, DiskCache(roots[0], roots[1]))
        return self._disk[1]

    def key_for(self, request: BuildRequest, target: Target) -> tuple[CacheKey, bool]:
        """The request's key, and whether this machine has the toolchain to compile it."""
        backend = backends.get(request.backend)
        toolchain = backend.toolchain(request)
        uses_cutlass = request.source.includes_external(toolkit.CUTLASS_PREFIXES)
        components = request_components(request, target,
                                        cutlass_version=toolkit.cutlass_version() if uses_cutlass else None,
                                        env_allowlist=backend.env_allowlist)
        return CacheKey(components, toolchain or {}), toolchain is not None

    # ---- the pipeline --------------------------------------------------------------------------------------
    def get_kernel(self, request: BuildRequest, target: Target, device_index: int | None,
                   context: MissContext | None = None) -> Any:
        arch = request.arch(target)
        memory_key = (request, arch, device_index)
        loaded = self._loaded.get(memory_key)
        if loaded is not None:
            return loaded
        with self._guard:
            lock = self._locks.setdefault(memory_key, threading.Lock())
        with lock:  # one compile per kernel across this process's threads; the file lock covers processes
            loaded = self._loaded.get(memory_key)
            if loaded is None:
                loaded = self._load_or_build(request, target, device_index, context)
                self._loaded[memory_key] = loaded
        return loaded

    def _load_or_build(self, request: BuildRequest, target: Target, device_index: int | None,
                       context: MissContext | None) -> Any:
        backend = backends.get(request.backend)
        key, can_compile = self.key_for(request, target)
        disk = self.disk_cache()
        any_toolchain = config.offline or not can_compile
        loaded = self._load_from_disk(disk, key, any_toolchain, request, device_index)
        if loaded is not None:
            return loaded
        private = self._private.get(key.full)
        if private is not None:
            return self._load_private(private, request, device_index)
        self._record_miss(context, target)
        if config.offline:
            raise CacheMissError(op=context.op if context else "?", kernel=request.label(),
                                 shape_class=context.shape_class if context else request.params, arch=key.arch,
                                 roots=[r.path for r in disk.roots],
                                 manifest_item=json.dumps(context.manifest_item) if context and
                                 context.manifest_item else None,
                                 kernel_op=context.kernel_op if context else None)
        if not can_compile:
            raise ToolchainError(
                f"jitops: cannot compile {request.label()} for {key.arch}: {backend.unavailable_reason(request)}; "
                f"and no build of it is cached in {', '.join(str(r.path) for r in disk.roots) or '(no roots)'}")

        def waiting() -> None:
            log.info("waiting for another process that is compiling %s for %s", request.label(), key.arch)

        with disk.lock(key, config.lock_timeout, on_wait=waiting):
            loaded = self._load_from_disk(disk, key, False, request, device_index)  # it may have finished
            if loaded is not None:
                return loaded
            build_dir, files, meta = self._compile(request, key, context)
            entry = disk.publish(key, build_dir, files, meta)
        blobs = {name: (build_dir / name).read_bytes() for name in files}
        if entry is None:  # could not store: keep the build directory for this process
            self._private[key.full] = (build_dir, files, meta)
            atexit.register(shutil.rmtree, build_dir, True)
            return backends.get(request.backend).load(request, build_dir, blobs, meta, device_index)
        shutil.rmtree(build_dir, ignore_errors=True)
        return backend.load(request, entry.path, blobs, entry.meta, device_index)

    def _load_from_disk(self, disk: DiskCache, key: CacheKey, any_toolchain: bool, request: BuildRequest,
                        device_index: int | None) -> Any:
        backend = backends.get(request.backend)
        for candidate in disk.candidates(key, any_toolchain):
            if isinstance(candidate, tuple):
                path, root, reason = candidate
                stats.corrupt_entries += 1
                disk.quarantine(path, root, reason)
                continue
            try:
                blobs = candidate.verify()
            except CorruptEntry as exc:
                stats.corrupt_entries += 1
                disk.quarantine(candidate.path, candidate.root, str(exc))
                continue
            try:
                loaded = backend.load(request, candidate.path, blobs, candidate.meta, device_index)
            except Exception as exc:  # noqa: BLE001 - a verified binary that will not load is a bad entry too
                stats.corrupt_entries += 1
                disk.quarantine(candidate.path, candidate.root, f"checksum ok but loading failed: {exc}")
                continue
            candidate.touch()
            stats.disk_hits += 1
            return loaded
        return None

    def _load_private(self, private: tuple[Path, list[str], dict[str, Any]], request: BuildRequest,
                      device_index: int | None) -> Any:
        directory, files, meta = private
        blobs = {name: (directory / name).read_bytes() for name in files}
        return backends.get(request.backend).load(request, directory, blobs, meta, device_index)

    def _compile(self, request: BuildRequest, key: CacheKey,
                 context: MissContext | None) -> tuple[Path, list[str], dict[str, Any]]:
        backend = backends.get(request.backend)
        what = f"{request.label()} for {key.arch} ({backend.name})"
        if context is not None:
            what += f", op {context.op}"
        build_dir = processes.new_build_dir(f"jitops-{request.kernel}-")  # removed at exit if left behind
        announce = threading.Timer(config.progress_seconds, log.info, args=("compiling %s ...", what))
        announce.daemon = True
        announce.start()
        started = time.perf_counter()
        try:
            output = backend.compile(request, key.arch, build_dir, key.request_hash)
        except BaseException:
            stats.failed_compiles += 1
            if config.keep_failed_builds:
                log.warning("failed build of %s kept at %s", what, build_dir)
            else:
                shutil.rmtree(build_dir, ignore_errors=True)
            processes.release_build_dir(build_dir)
            raise
        finally:
            announce.cancel()
        seconds = time.perf_counter() - started
        stats.compiles += 1
        stats.compile_seconds += seconds
        if seconds >= config.progress_seconds:
            log.info("compiled %s in %.1f s", what, seconds)
        else:
            log.debug("compiled %s in %.3f s", what, seconds)
        files = list(output.files)
        if output.log.strip():
            (build_dir / "compile.log").write_text(output.log)
            files.append("compile.log")
        meta = dict(output.meta, backend=backend.name, label=request.label(), compile_seconds=round(seconds, 3),
                    op=context.op if context else None,
                    kernel_op=context.kernel_op if context else None,
                    shape_class=str(context.shape_class) if context else None)
        return build_dir, files, meta

    # ---- prewarm and inspection (cache_tools) ---------------------------------------------------------------
    def prewarm(self, request: BuildRequest, target: Target, context: MissContext | None = None) -> str:
        """Make sure `request` is in the writable cache without loading it (no GPU needed).
        Returns 'cached' or 'compiled'.  Raises ToolchainError or CompileError."""
        backend = backends.get(request.backend)
        key, can_compile = self.key_for(request, target)
        disk = self.disk_cache()
        if self.find_entry(key, any_toolchain=not can_compile) is not None:
            return "cached"
        if not can_compile:
            raise ToolchainError(f"cannot compile {request.label()} for {key.arch}: "
                                 f"{backend.unavailable_reason(request)}")
        with disk.lock(key, config.lock_timeout):
            if self.find_entry(key, any_toolchain=False) is not None:
                return "cached"
            build_dir, files, meta = self._compile(request, key, context)
            try:
                entry = disk.publish(key, build_dir, files, meta)
            finally:
                shutil.rmtree(build_dir, ignore_errors=True)
        if entry is None:
            where = disk.writable.path if disk.writable else "(no writable root)"
            raise OSError(f"jitops: could not store {request.label()} in {where}")
        return "compiled"

    def find_entry(self, key: CacheKey, any_toolchain: bool) -> CacheEntry | None:
        """The entry a call would load, checksum verified, or None."""
        for candidate in self.disk_cache().candidates(key, any_toolchain):
            if isinstance(candidate, CacheEntry):
                try:
                    candidate.verify()
                except CorruptEntry:
                    continue
                return candidate
        return None

    def clear_memory(self) -> None:
        """Forget loaded kernels (the next call of each op looks at the disk cache again).  Builds that could
        not be stored stay available to this process."""
        self._loaded.clear()

    # ---- JITOPS_RECORD -------------------------------------------------------------------------------------
    def _record_miss(self, context: MissContext | None, target: Target) -> None:
        path = config.record
        if path is None or context is None or context.manifest_item is None:
            return
        item = dict(context.manifest_item, archs=[target.arch()])
        line = json.dumps(item, sort_keys=True)
        if line in self._recorded:
            return
        self._recorded.add(line)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # One write() of one line with O_APPEND: concurrent recorders do not interleave lines.
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, (line + "\n").encode())
            finally:
                os.close(fd)
        except OSError as exc:
            log.warning("cannot append to JITOPS_RECORD=%s: %s", path, exc)


runtime = Runtime()
