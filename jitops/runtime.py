"""get_kernel(): memory -> disk -> remote -> lock and re-check -> compile -> publish -> load.

The only module that joins the cache and the backends.  Ops call get_kernel() on a miss of their own
shape-class table (a dict lookup per call); everything here runs once per kernel per process.
"""
from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import errno
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from . import backends
from .backends import processes, toolkit
from .cache import CacheEntry, CorruptEntry, DiskCache, remote
from .cache.disk import entry_meta
from .config import Config, config
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
    fallbacks: int = 0        # calls that ran torch's implementation while their kernels compiled (background)
    background_compiles: int = 0  # kernels handed to the background pool
    # The remote tier (JITOPS_REMOTE_CACHE); all stay 0 without one.
    remote_hits: int = 0      # kernels loaded from a verified remote entry (then stored on the local disk)
    remote_misses: int = 0    # lookups the remote answered without a usable entry (absent or rejected)
    remote_rejected: int = 0  # remote entries whose checksum, signature, key or meta did not match
    remote_errors: int = 0    # failed requests (down, timeout): each leaves the remote alone for the back-off
    remote_publishes: int = 0           # entries shared after a local compile
    remote_publish_failures: int = 0    # publishes refused: remote full, entry over the size limit, error
    remote_seconds: float = 0.0         # wall time in the remote tier: lookups, publishes, fleet-lock waits

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


@dataclass(frozen=True)
class Located:
    """A kernel's binary as Runtime.locate() finds it: checked, on the local disk, not loaded."""

    tier: str                          # "disk" or "remote"
    path: Path                         # its entry directory (or, where nothing can be stored, a private one)
    blobs: dict[str, bytes] = field(repr=False)  # every file, checked against its size and sha256
    meta: dict[str, Any] = field(repr=False)


class Runtime:
    def __init__(self) -> None:
        self._loaded: dict[tuple[BuildRequest, str, int | None], Any] = {}
        # Builds that could not be stored (EROFS, ENOSPC): key -> (directory, files, meta), kept until exit.
        self._private: dict[str, tuple[Path, list[str], dict[str, Any]]] = {}
        self._locks: dict[tuple[BuildRequest, str, int | None], threading.Lock] = {}
        self._guard = threading.Lock()
        self._disk: tuple[tuple[Any, ...], DiskCache] | None = None
        self._remote: remote.RemoteCache | None = None
        self._recorded: set[str] = set()
        self._background = _BackgroundCompiles(self)

    # ---- configuration -------------------------------------------------------------------------------------
    def disk_cache(self) -> DiskCache:
        """The DiskCache for the current JITOPS_CACHE_DIR / JITOPS_CACHE_PATH (rebuilt when they change)."""
        roots = (config.cache_dir, config.cache_path)
        if self._disk is None or self._disk[0] != roots:
            self._disk = (roots, DiskCache(roots[0], roots[1]))
        return self._disk[1]

    def remote_cache(self) -> remote.RemoteCache | None:
        """The remote tier for the current JITOPS_REMOTE_* settings, or None when JITOPS_REMOTE_CACHE is unset
        (then this is one environment lookup on a disk miss, and the redis client is never imported)."""
        url = config.remote_cache
        if url is None:
            return None
        settings = remote.RemoteSettings(url, config.remote_cache_key, config.remote_timeout, config.remote_backoff,
                                         config.remote_ttl, config.remote_max_entry_size,
                                         config.remote_lock_seconds)
        if self._remote is None or self._remote.settings != settings:
            self._remote = remote.RemoteCache(settings, stats)
        return self._remote

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
                   context: MissContext | None = None, build: bool = True) -> Any:
        """The loaded kernel: from memory, else a cache root, else compiled (and published).  build=False
        stops before compiling and returns None instead (background mode asks this first)."""
        arch = request.arch(target)
        memory_key = (request, arch, device_index)
        loaded = self._loaded.get(memory_key)
        if loaded is not None:
            return loaded
        with self._guard:
            lock = self._locks.setdefault(memory_key, threading.Lock())
        # One compile per kernel across this process's threads (the file lock covers processes).  A caller that
        # will not build does not wait for one either: a worker compiling this kernel holds the lock.
        if not lock.acquire(blocking=build):
            return None
        try:
            loaded = self._loaded.get(memory_key)
            if loaded is None:
                loaded = self._load_or_build(request, target, device_index, context, build)
                if loaded is not None:
                    self._loaded[memory_key] = loaded
        finally:
            lock.release()
        return loaded

    def _load_or_build(self, request: BuildRequest, target: Target, device_index: int | None,
                       context: MissContext | None, build: bool = True) -> Any:
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
        if not build:  # the background worker that builds it also asks the remote
            return None
        fleet = self.remote_cache()
        if fleet is not None:
            for found in self._remote_candidates(fleet, key, any_toolchain):
                loaded = self._adopt(found, key, disk, request, device_index)
                if loaded is not None:
                    return loaded
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
            # One compile per key across the fleet too: another node may be compiling it (then wait for its
            # entry), and this node's other processes wait on the file lock meanwhile.
            turn = fleet.compile_turn(key, request.label(), config.lock_timeout) if fleet else contextlib.nullcontext()
            with turn as found:
                if found is not None:
                    loaded = self._adopt(found, key, disk, request, device_index)
                    if loaded is not None:
                        return loaded
                build_dir, files, meta = self._compile(request, key, context)
                entry = disk.publish(key, build_dir, files, meta)
                blobs = {name: (build_dir / name).read_bytes() for name in files}
                if fleet is not None:  # before the fleet lock is released, so waiters find it
                    fleet.publish(key, blobs, entry.meta if entry is not None else entry_meta(key, blobs, meta))
        if entry is None:  # could not store: keep the build directory for this process
            self._private[key.full] = (build_dir, files, meta)
            atexit.register(shutil.rmtree, build_dir, True)
            return backends.get(request.backend).load(request, build_dir, blobs, meta, device_index)
        shutil.rmtree(build_dir, ignore_errors=True)
        return backend.load(request, entry.path, blobs, entry.meta, device_index)

    @staticmethod
    def _loadable(key: CacheKey, toolchain: Any) -> bool:
        """Whether a build of key's request by `toolchain` can load here (the key's own toolchain's always can)."""
        return toolchain == key.toolchain or (isinstance(toolchain, dict) and
                                              backends.get(key.request["backend"]).loads_builds_by(toolchain))

    def _candidates(self, disk: DiskCache, key: CacheKey, any_toolchain: bool):
        """disk.candidates, less the other toolchains' builds this process cannot load (a host library linked
        against another torch): passed over, not quarantined, since they are good builds for their machines."""
        for candidate in disk.candidates(key, any_toolchain):
            if isinstance(candidate, tuple) or self._loadable(key, candidate.meta.get("toolchain")):
                yield candidate

    def _remote_candidates(self, fleet: Any, key: CacheKey, any_toolchain: bool):
        """fleet.lookup, less the builds this process cannot load (as _candidates, for the remote tier)."""
        for found in fleet.lookup(key, any_toolchain):
            if self._loadable(key, found.meta.get("toolchain")):
                yield found

    def _verified_on_disk(self, disk: DiskCache, key: CacheKey,
                          any_toolchain: bool) -> Iterator[tuple[CacheEntry, dict[str, bytes]]]:
        """The entries for `key` in every root, best first, each with its bytes checked against meta.json; an
        entry that fails is counted and quarantined."""
        for candidate in self._candidates(disk, key, any_toolchain):
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
            yield candidate, blobs

    def _load_from_disk(self, disk: DiskCache, key: CacheKey, any_toolchain: bool, request: BuildRequest,
                        device_index: int | None) -> Any:
        backend = backends.get(request.backend)
        for candidate, blobs in self._verified_on_disk(disk, key, any_toolchain):
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

    def _adopt(self, found: remote.RemoteEntry, key: CacheKey, disk: DiskCache, request: BuildRequest,
               device_index: int | None) -> Any:
        """A verified remote entry: stored in the writable root by the atomic publish (so the node's next process
        hits the disk), then loaded from there as a disk entry is.  None if it does not load."""
        path, meta, entry = self._store_remote_hit(found, key, disk, request)
        try:
            loaded = backends.get(request.backend).load(request, path, found.blobs, meta, device_index)
        except Exception as exc:  # noqa: BLE001 - a verified binary that will not load is a bad entry
            stats.corrupt_entries += 1
            self._private.pop(key.full, None)
            if entry is not None:
                disk.quarantine(entry.path, entry.root, f"from the remote cache; checksum ok but loading failed: {exc}")
            return None
        stats.remote_hits += 1
        return loaded

    def _store_remote_hit(self, found: remote.RemoteEntry, key: CacheKey, disk: DiskCache,
                          request: BuildRequest) -> tuple[Path, dict[str, Any], CacheEntry | None]:
        """Where a verified remote entry now lies on this node: the writable root (the atomic publish, without
        fsync: a copy a crash tears fails its checksum and is fetched again; its meta's checksums, just compared
        with the bytes, are not computed again), else a private directory."""
        entry = disk.store(found.key, found.blobs, found.meta, durable=False, checked=True)
        if entry is not None:
            return entry.path, entry.meta, entry
        directory = Path(tempfile.mkdtemp(prefix=f"jitops-{request.kernel}-remote-"))
        for name, data in found.blobs.items():
            (directory / name).write_bytes(data)
        atexit.register(shutil.rmtree, directory, True)
        self._private[key.full] = (directory, list(found.blobs), found.meta)
        return directory, found.meta, None

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
                fleet = self.remote_cache()
                if fleet is not None and entry is not None:
                    fleet.publish(key, {name: (entry.path / name).read_bytes() for name in files}, entry.meta)
            finally:
                shutil.rmtree(build_dir, ignore_errors=True)
        if entry is None:  # the OSError's errno and path let cache_tools say what to do (a full disk, ...)
            where = str(disk.writable.path) if disk.writable else "(no writable root)"
            cause = disk.store_error
            raise OSError(cause.errno if cause is not None else errno.EIO,
                          f"could not store {request.label()}: "
                          f"{(cause.strerror or str(cause)) if cause is not None else 'no writable cache root'}", where)
        return "compiled"

    def find_entry(self, key: CacheKey, any_toolchain: bool) -> CacheEntry | None:
        """The entry a call would load, checksum verified, or None."""
        for candidate in self._candidates(self.disk_cache(), key, any_toolchain):
            if isinstance(candidate, CacheEntry):
                try:
                    candidate.verify()
                except CorruptEntry:
                    continue
                return candidate
        return None

    def locate(self, request: BuildRequest, target: Target) -> Located | None:
        """The verified binary a first call of `request` would load, found by get_kernel()'s own lookups (the
        key, every disk root, then the remote tier, whose hit is stored on the local disk) and stopping just
        before the backend's load (the driver's module load, which needs a GPU and is the same for every tier).
        None where a call would compile.  Counts no hit: nothing is loaded.  No GPU needed
        (bench_remote_cache.py times a CUTLASS sm_90a entry's disk and remote hits with it)."""
        key, can_compile = self.key_for(request, target)
        disk = self.disk_cache()
        any_toolchain = config.offline or not can_compile
        for candidate, blobs in self._verified_on_disk(disk, key, any_toolchain):
            candidate.touch()
            return Located("disk", candidate.path, blobs, candidate.meta)
        fleet = self.remote_cache()
        if fleet is not None:
            for found in self._remote_candidates(fleet, key, any_toolchain):
                path, meta, _ = self._store_remote_hit(found, key, disk, request)
                return Located("remote", path, found.blobs, meta)
        return None

    def clear_memory(self) -> None:
        """Forget loaded kernels (the next call of each op looks at the disk cache again).  Builds that could
        not be stored stay available to this process."""
        self._loaded.clear()

    # ---- background compiles (JITOPS_COMPILE=background) ----------------------------------------------------
    def submit(self, request: BuildRequest, target: Target, device_index: int | None,
               context: MissContext | None = None, prepare: Callable[[], None] | None = None
               ) -> concurrent.futures.Future:
        """Compile and load `request` in the background worker pool (once per kernel: a second submit returns
        the first one's future).  `prepare` runs first in the worker (binding the device's context).  A
        failure is logged once, as a warning; the future holds the exception."""
        return self._background.submit(request, target, device_index, context, prepare)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every background compile has finished (True), or `timeout` seconds passed (False)."""
        return self._background.wait(timeout)

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


class _BackgroundCompiles:
    """The worker pool behind Runtime.submit: JITOPS_JOBS threads (NVRTC releases the GIL while it compiles;
    nvcc, the C++ compiler and load_inline run as child processes), a progress bar in notebooks (tqdm.auto) and
    log lines elsewhere."""

    def __init__(self, runtime: "Runtime") -> None:
        self._runtime = runtime
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._futures: dict[tuple, concurrent.futures.Future] = {}
        self._guard = threading.Lock()
        self._bar: Any = None
        self._announced = 0  # compiles the log and the progress bar have announced
        self._done = 0

    def submit(self, request: BuildRequest, target: Target, device_index: int | None,
               context: MissContext | None, prepare: Callable[[], None] | None) -> concurrent.futures.Future:
        key = (request, request.arch(target), device_index)
        with self._guard:
            future = self._futures.get(key)
            if future is not None:
                return future
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=config.jobs,
                                                                   thread_name_prefix="jitops-compile")
            stats.background_compiles += 1
            future = self._pool.submit(self._build, request, target, device_index, context, prepare)
            self._futures[key] = future
        return future

    def _build(self, request: BuildRequest, target: Target, device_index: int | None,
               context: MissContext | None, prepare: Callable[[], None] | None) -> Any:
        """In a worker.  The warning and the progress update happen before the future completes, so whoever
        waits on it (jitops.wait()) sees them."""
        announced = False
        try:
            if prepare is not None:
                prepare()
            # Only a compile is announced (log line, progress bar): the C++ host path is submitted on every
            # process's first CUDA call, and "compiling host_path in the background" each time, though it loads
            # from disk, misled users.
            found = self._runtime.get_kernel(request, target, device_index, context, build=False)
            if found is not None:
                return found
            with self._guard:
                self._announced += 1
                announced = True
                self._announce(request, target, context)
            return self._runtime.get_kernel(request, target, device_index, context)
        except BaseException as error:
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            log.warning("background compile of %s for %s failed; %s keeps running torch's implementation for "
                        "this shape class: %s", request.label(), request.arch(target),
                        f"jitops.{context.op}" if context else "the op", first_line)
            raise
        finally:
            if announced:
                with self._guard:
                    self._done += 1
                    if self._bar:
                        self._bar.update(1)

    def pending(self) -> int:
        with self._guard:
            return sum(not f.done() for f in self._futures.values())

    def _announce(self, request: BuildRequest, target: Target, context: MissContext | None) -> None:
        total = self._announced
        if self._bar is None and "ipykernel" in sys.modules:
            try:
                from tqdm.auto import tqdm

                self._bar = tqdm(total=total, desc="jitops: compiling", unit="kernel", leave=True)
            except ImportError:  # no tqdm: the log lines below say the same
                self._bar = False
        if self._bar:
            self._bar.total = total
            self._bar.set_postfix_str(f"{context.op if context else request.kernel} ({request.arch(target)})")
            self._bar.refresh()
        else:
            log.info("compiling %s for %s in the background; %s", request.label(), request.arch(target),
                     "calls run torch's implementation until it is ready" if context else "no call waits for it")

    def wait(self, timeout: float | None = None) -> bool:
        with self._guard:
            futures = list(self._futures.values())
        done, not_done = concurrent.futures.wait(futures, timeout=timeout)
        return not not_done


runtime = Runtime()

# Importing the redis client takes 78-189 ms after torch on the dev box, several times a remote hit's own cost;
# a process configured for the remote tier starts that import now, in a thread, and its first call finds it done.
if os.environ.get(Config.remote_cache.env, "").strip():
    remote.import_client_in_background()
