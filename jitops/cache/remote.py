"""The remote tier: cache entries shared by a fleet through Redis, checked like the disk cache.

Keys (one prefix per entry format, so a format change never reads old entries):
    jitops:v1:entry:<full key sha256>    hash: "meta" (the entry's meta.json, both key halves, every file's sha256
                                         and size), "sig" (HMAC-SHA256 of the meta, when a secret is set) and
                                         "file:<name>" (each file's bytes)
    jitops:v1:builds:<request sha256>    sorted set: the full keys of every toolchain's build of one request, by
                                         creation time (a node without a compiler takes the newest, as on disk)
    jitops:v1:index                      hash: full key -> one line of JSON (kernel, arch, dtype, op, size), for
                                         `cache_tools info` and `pull --all`
    jitops:v1:lock:<full key sha256>     the fleet lock: "<host> pid <pid> <token>", SET NX PX
An entry is written by one MULTI/EXEC (entry, builds, index), each with the TTL, which a load renews.

Trust: an entry is bytes and JSON, never a pickle.  Before anything from it is written to disk or loaded, the
meta's key halves are hashed again and must give the key it was stored under and the request asked for (and,
unless any toolchain will do, the toolchain too), every file's size and sha256 must match the meta, and with
JITOPS_REMOTE_CACHE_KEY the HMAC over key and meta must match.  A rejected entry is counted and left alone: the
local compile that follows overwrites it.

Failures: every request has a socket timeout (JITOPS_REMOTE_TIMEOUT, 50 ms) and no retry.  Any error warns
once per process on the `jitops` logger, counts, and leaves the remote alone for JITOPS_REMOTE_BACKOFF seconds;
a full remote (maxmemory with noeviction) stops publishes for that long but not lookups.  Nothing here raises
into a call.  The `redis` client is imported only when a remote is configured.
"""
from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import os
import re
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator

from ..keys import FORMAT_VERSION, CacheKey, canonical_json
from .disk import META, STAMP

log = logging.getLogger("jitops")

PREFIX = f"jitops:v{FORMAT_VERSION}:"
INDEX = PREFIX + "index"
SIGNATURE_CONTEXT = b"jitops-remote-entry-v1\n"
# Other nodes poll for the entry this often while one compiles: a CUTLASS compile takes 50-90 s, an NVRTC one
# 0.2-8 s, so a waiter finishes at most 50 ms after the entry appears and polls a few hundred times at most.
POLL_SECONDS = 0.05

# The holder renews the fleet lock with this (only if it still holds it: the token must match).
_RENEW = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0"
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


def entry_name(full: str) -> str:
    return f"{PREFIX}entry:{full}"


def builds_name(request_hash: str) -> str:
    return f"{PREFIX}builds:{request_hash}"


def lock_name(full: str) -> str:
    return f"{PREFIX}lock:{full}"


def redact(url: str) -> str:
    """The URL without its password, for messages."""
    return re.sub(r"//[^/@]*@", "//***@", url)


class RemoteError(Exception):
    """The remote cannot be reached or answered with an error (raised only to cache_tools, through ping())."""


class RejectedEntry(Exception):
    """A remote entry that failed verification: its checksum, signature, key or metadata do not match."""


@dataclass(frozen=True)
class RemoteSettings:
    url: str
    secret: str | None = None
    timeout: float = 0.05
    backoff: float = 60.0
    ttl: float = 30 * 86400.0
    max_entry_size: int = 64 * 2**20
    lock_seconds: float = 30.0


@dataclass
class RemoteEntry:
    """A verified remote entry: its own key (another toolchain's, when any will do), meta and file bytes."""

    key: CacheKey
    meta: dict[str, Any] = field(repr=False)
    blobs: dict[str, bytes] = field(repr=False)


def sign(secret: str, full: str, meta_bytes: bytes) -> str:
    return hmac.new(secret.encode(), SIGNATURE_CONTEXT + full.encode() + b"\n" + meta_bytes,
                    hashlib.sha256).hexdigest()


def check_meta(full: str, meta_bytes: bytes | None, signature: bytes | None, expected: CacheKey | None,
               any_toolchain: bool, settings: RemoteSettings) -> tuple[CacheKey, dict[str, Any]]:
    """Everything that can be checked before the files are downloaded.  `expected` None: whatever kernel the
    entry's own key names (`cache_tools pull --all`).  Raises RejectedEntry."""
    if meta_bytes is None:
        raise RejectedEntry("the entry has no meta")
    if settings.secret is not None:
        if signature is None:
            raise RejectedEntry("unsigned, and JITOPS_REMOTE_CACHE_KEY is set")
        if not hmac.compare_digest(signature, sign(settings.secret, full, meta_bytes).encode()):
            raise RejectedEntry("bad signature (written without this JITOPS_REMOTE_CACHE_KEY, or altered)")
    try:
        meta = json.loads(meta_bytes)
    except ValueError as exc:
        raise RejectedEntry(f"meta is not JSON: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_VERSION:
        raise RejectedEntry("meta has no format field or another format version")
    request, toolchain = meta.get("request"), meta.get("toolchain")
    if not isinstance(request, dict) or not isinstance(toolchain, dict):
        raise RejectedEntry("meta lacks the key halves")
    key = CacheKey(request, toolchain)
    if key.full != full or meta.get("key") != full:
        raise RejectedEntry("the key in its meta does not hash to the key it is stored under")
    if expected is not None and (key.request_hash != expected.request_hash
                                 or canonical_json(request) != canonical_json(expected.request)):
        raise RejectedEntry("it holds another kernel than the one asked for (request half differs)")
    if expected is not None and not any_toolchain and key.full != expected.full:
        raise RejectedEntry("built by another toolchain than the one asked for")
    files = meta.get("files")
    if not isinstance(files, dict) or not files:
        raise RejectedEntry("meta lists no files")
    total = 0
    for name, info in files.items():
        if (not isinstance(name, str) or not name or "/" in name or "\\" in name or "\0" in name
                or name.startswith(".") or name in (META, STAMP)):
            raise RejectedEntry(f"unsafe file name {name!r}")
        if not (isinstance(info, dict) and isinstance(info.get("size"), int) and isinstance(info.get("sha256"), str)):
            raise RejectedEntry(f"{name}: no size or sha256 in meta")
        total += info["size"]
    if total > settings.max_entry_size:
        raise RejectedEntry(f"{total} bytes, over JITOPS_REMOTE_MAX_ENTRY_SIZE ({settings.max_entry_size})")
    return key, meta


def check_files(meta: dict[str, Any], values: list[bytes | None]) -> dict[str, bytes]:
    """The files, in meta order, against their recorded size and sha256.  Raises RejectedEntry."""
    blobs = {}
    for (name, info), data in zip(meta["files"].items(), values):
        if data is None:
            raise RejectedEntry(f"{name} is missing")
        if len(data) != info["size"]:
            raise RejectedEntry(f"{name}: {len(data)} bytes, meta says {info['size']}")
        if hashlib.sha256(data).hexdigest() != info["sha256"]:
            raise RejectedEntry(f"{name}: sha256 does not match the meta")
        blobs[name] = data
    return blobs


def summary(meta: dict[str, Any]) -> dict[str, Any]:
    """The index's line for an entry."""
    request = meta.get("request", {})
    return {"kernel": request.get("kernel"), "arch": request.get("arch"), "dtype": request.get("dtype"),
            "backend": request.get("backend"), "op": meta.get("op"), "label": meta.get("label"),
            "request_hash": meta.get("request_hash"),
            "size": sum(int(f.get("size", 0)) for f in meta.get("files", {}).values()),
            "created": meta.get("created")}


# ---- the client --------------------------------------------------------------------------------------------------
_import_thread: threading.Thread | None = None


def import_client_in_background() -> None:
    """Start importing the redis client in a thread.  It takes 78-189 ms after torch on the loaded dev box (it
    imports asyncio), several times a remote hit itself, so a process configured for the remote starts it at
    import and a first call that misses the disk after any other start-up work finds it done.  The thread also
    imports the idna codec, which the first connection's getaddrinfo() loads to encode the host name: 0.9 ms of
    a remote hit otherwise."""
    global _import_thread
    if _import_thread is not None:
        return

    def load() -> None:
        with contextlib.suppress(Exception):  # not installed: the first lookup says so
            import encodings.idna  # noqa: F401
            import redis  # noqa: F401

    _import_thread = threading.Thread(target=load, name="jitops-redis-import", daemon=True)
    _import_thread.start()
    # A fork while the thread holds an import lock would leave the child waiting on a lock nobody holds.
    os.register_at_fork(before=lambda: _import_thread.join(timeout=10) if _import_thread else None)


def _client(settings: RemoteSettings) -> Any:
    try:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry
    except ImportError:
        raise RemoteError("JITOPS_REMOTE_CACHE is set but the redis client is not installed: "
                          "pip install 'jitops[remote]' (or unset JITOPS_REMOTE_CACHE)") from None
    options: dict[str, Any] = dict(socket_timeout=settings.timeout, socket_connect_timeout=settings.timeout,
                                   retry=Retry(NoBackoff(), 0), health_check_interval=0)
    # No handshake beyond the connect: HELLO 3, CLIENT SETINFO and maintenance notifications cost 4-6 ms
    # of round trips on a fresh connection (redis-py 8.1, loopback); RESP2 needs none of them.
    options["protocol"] = 2
    try:
        from redis.driver_info import DriverInfo  # noqa: F401 - redis-py >= 7.1 names the library this way

        options["driver_info"] = None
    except ImportError:
        options.update(lib_name=None, lib_version=None)
    try:
        from redis.maint_notifications import MaintNotificationsConfig

        options["maint_notifications_config"] = MaintNotificationsConfig(enabled=False)
    except ImportError:  # redis-py < 7 has no maintenance notifications
        pass
    return redis.Redis.from_url(settings.url, **options)


def _is_full(exc: BaseException) -> bool:
    return "OOM" in str(exc) or type(exc).__name__ == "OutOfMemoryError"


class RemoteCache:
    """One Redis database as a cache tier.  Lookups, publishes and the fleet lock never raise."""

    def __init__(self, settings: RemoteSettings, counters: Any) -> None:
        self.settings = settings
        self.counters = counters  # the runtime's Stats: remote_errors, remote_rejected, remote_misses, ...
        self._redis: Any = None
        self._scripts: dict[str, Any] = {}
        self._down_until = 0.0
        self._full_until = 0.0
        self._warned: set[str] = set()
        self._rejected: set[tuple[str, str]] = set()
        self._guard = threading.Lock()
        self._timing = threading.local()
        self.last_error: str | None = None

    def __repr__(self) -> str:
        return f"RemoteCache({redact(self.settings.url)})"

    # ---- state -------------------------------------------------------------------------------------------------
    def available(self) -> bool:
        return time.monotonic() >= self._down_until

    def _connection(self) -> Any:
        if self._redis is None:
            with self._guard:
                if self._redis is None:
                    self._redis = _client(self.settings)
        return self._redis

    def _warn_once(self, kind: str, message: str, *args: Any) -> None:
        if kind in self._warned:
            log.debug(message, *args)
            return
        self._warned.add(kind)
        log.warning(message, *args)

    def _failed(self, exc: BaseException, doing: str) -> None:
        """Count, warn once per process, and leave the remote alone for the back-off period."""
        self.counters.remote_errors += 1
        self.last_error = f"{type(exc).__name__}: {exc}"
        self._down_until = time.monotonic() + self.settings.backoff
        self._warn_once("down", "remote cache %s failed while %s (%s); using the local cache only, retrying in "
                        "%.0f s", redact(self.settings.url), doing, self.last_error, self.settings.backoff)

    @contextlib.contextmanager
    def _timed(self) -> Iterator[None]:
        """Adds the block's wall time to the remote_seconds counter (what the remote costs a process); blocks
        inside a timed block are not counted twice."""
        depth = getattr(self._timing, "depth", 0)
        self._timing.depth = depth + 1
        started = time.perf_counter()
        try:
            yield
        finally:
            self._timing.depth = depth
            if depth == 0:
                self.counters.remote_seconds += time.perf_counter() - started

    def _reject(self, full: str, reason: str) -> None:
        if (full, reason) in self._rejected:  # a waiter polls the same bad entry until the holder replaces it
            return
        self._rejected.add((full, reason))
        self.counters.remote_rejected += 1
        log.warning("rejected remote cache entry %s…: %s; compiling locally", full[:16], reason)

    # ---- reading -----------------------------------------------------------------------------------------------
    def lookup(self, key: CacheKey, any_toolchain: bool, count: bool = True) -> Iterator[RemoteEntry]:
        """Verified entries for `key`, best first: the exact build, then (if any toolchain will do) the other
        toolchains' builds of the same request, newest first.  Rejected entries are counted and skipped; with
        `count`, an answer without a usable entry counts as a miss."""
        if not self.available():
            return
        try:
            with self._timed():
                client = self._connection()
                pipe = client.pipeline(transaction=False)
                pipe.hmget(entry_name(key.full), ["meta", "sig"])
                if any_toolchain:
                    pipe.zrevrange(builds_name(key.request_hash), 0, 15)
                answers = pipe.execute()
        except Exception as exc:  # noqa: BLE001 - the remote must never break a call
            self._failed(exc, "looking up a kernel")
            return
        candidates: list[tuple[str, Any]] = [(key.full, answers[0])]
        if any_toolchain:
            candidates += [(f.decode(), None) for f in answers[1] if f.decode() != key.full]
        found = False
        for full, head in candidates:
            with self._timed():
                entry = self._fetch(full, head, key, any_toolchain)
            if entry is not None:
                found = True
                yield entry
            if not self.available():
                return
        if not found and count:
            self.counters.remote_misses += 1

    def fetch(self, full: str) -> RemoteEntry | None:
        """The entry stored under `full`, verified against the key its own meta holds (`pull --all`)."""
        return self._fetch(full, None, None, False) if self.available() else None

    def _fetch(self, full: str, head: Any, expected: CacheKey | None, any_toolchain: bool) -> RemoteEntry | None:
        try:
            client = self._connection()
            if head is None:
                head = client.hmget(entry_name(full), ["meta", "sig"])
            meta_bytes, signature = head
            if meta_bytes is None:
                return None  # absent (never published, expired or evicted)
            try:
                key, meta = check_meta(full, meta_bytes, signature, expected, any_toolchain, self.settings)
            except RejectedEntry as exc:
                self._reject(full, str(exc))
                return None
            pipe = client.pipeline(transaction=False)
            pipe.hmget(entry_name(full), [f"file:{name}" for name in meta["files"]])
            self._renew(pipe, full, key.request_hash)
            values = pipe.execute()[0]
        except Exception as exc:  # noqa: BLE001
            self._failed(exc, "fetching a kernel")
            return None
        try:
            blobs = check_files(meta, values)
        except RejectedEntry as exc:
            self._reject(full, str(exc))
            return None
        return RemoteEntry(key, meta, blobs)

    def _renew(self, pipe: Any, full: str, request_hash: str) -> None:
        """A loaded entry lives another TTL (and so do the index and builds set that name it)."""
        if self.settings.ttl > 0:
            ttl = int(self.settings.ttl * 1000)
            for name in (entry_name(full), builds_name(request_hash), INDEX):
                pipe.pexpire(name, ttl)

    # ---- writing -----------------------------------------------------------------------------------------------
    def publish(self, key: CacheKey, blobs: dict[str, bytes], meta: dict[str, Any]) -> str:
        """Share an entry (its full meta.json dict, as entry_meta() makes it).  Returns 'stored', 'too large',
        'full', 'unavailable' or 'error'; never raises.  Failures are counted in remote_publish_failures."""
        with self._timed():
            return self._publish(key, blobs, meta)

    def _publish(self, key: CacheKey, blobs: dict[str, bytes], meta: dict[str, Any]) -> str:
        if not self.available():
            return "unavailable"
        if time.monotonic() < self._full_until:
            self.counters.remote_publish_failures += 1
            return "full"
        size = sum(len(b) for b in blobs.values())
        if size > self.settings.max_entry_size:
            self.counters.remote_publish_failures += 1
            log.warning("not sharing %s through the remote cache: %d bytes, over JITOPS_REMOTE_MAX_ENTRY_SIZE (%d)",
                        meta.get("label") or key.kernel, size, self.settings.max_entry_size)
            return "too large"
        meta_bytes = json.dumps(meta, sort_keys=True).encode()
        fields: dict[str, bytes] = {"meta": meta_bytes}
        if self.settings.secret is not None:
            fields["sig"] = sign(self.settings.secret, key.full, meta_bytes).encode()
        fields.update({f"file:{name}": data for name, data in blobs.items()})
        name = entry_name(key.full)
        try:
            pipe = self._connection().pipeline(transaction=True)
            pipe.delete(name)  # a rejected entry under this key is replaced, never merged
            pipe.hset(name, mapping=fields)
            pipe.zadd(builds_name(key.request_hash), {key.full: float(meta.get("created") or time.time())})
            pipe.hset(INDEX, key.full, json.dumps(summary(meta), sort_keys=True))
            self._renew(pipe, key.full, key.request_hash)
            pipe.execute()
        except Exception as exc:  # noqa: BLE001
            self.counters.remote_publish_failures += 1
            if _is_full(exc):
                self._full_until = time.monotonic() + self.settings.backoff
                self._warn_once("full", "remote cache %s is full (%s); kernels stay in the local cache, publishing "
                                "resumes in %.0f s", redact(self.settings.url), exc, self.settings.backoff)
                return "full"
            self._failed(exc, "publishing a kernel")
            return "error"
        self.counters.remote_publishes += 1
        return "stored"

    # ---- one compile per key across the fleet ------------------------------------------------------------------
    @contextlib.contextmanager
    def compile_turn(self, key: CacheKey, label: str, timeout: float) -> Iterator[RemoteEntry | None]:
        """Around a local compile.  Yields None when this process should compile (it holds the fleet lock, or
        the remote is unavailable, or the holder took longer than `timeout`), or the verified entry another
        node published while this one waited.

        The holder renews the lock every third of JITOPS_REMOTE_LOCK_SECONDS while it compiles: a lock that had
        to outlast the slowest compile (a CUTLASS 3 kernel: 50-90 s) would stall the fleet that long when its
        holder dies; renewed, a dead holder stalls the others at most one expiry, and a live one never loses it."""
        token = f"{socket.gethostname()} pid {os.getpid()} {uuid.uuid4().hex}"
        lock = lock_name(key.full)
        expiry_ms = int(self.settings.lock_seconds * 1000)
        with self._timed():
            entry, held = self._take_turn(key, label, timeout, lock, token, expiry_ms)
        if not held:
            yield entry
            return
        renewer = _Renewer(self, lock, token, expiry_ms)
        renewer.start()
        try:
            yield None  # this process compiles and publishes; the others poll for the entry
        finally:
            renewer.stop()
            with self._timed():
                self._release(lock, token)

    def _take_turn(self, key: CacheKey, label: str, timeout: float, lock: str, token: str,
                   expiry_ms: int) -> tuple[RemoteEntry | None, bool]:
        """(entry, False): another node published it; (None, True): this process holds the lock and compiles;
        (None, False): compile without the lock (remote unavailable or full, or the wait timed out)."""
        deadline = time.monotonic() + timeout
        announced = False
        while True:
            if not self.available():
                return None, False
            try:
                held = bool(self._connection().set(lock, token, nx=True, px=expiry_ms))
            except Exception as exc:  # noqa: BLE001
                if _is_full(exc):  # a full remote cannot store a lock either: compile without one
                    self._warn_once("full", "remote cache %s is full (%s); compiling without the fleet lock",
                                    redact(self.settings.url), exc)
                else:
                    self._failed(exc, "taking the fleet lock")
                return None, False
            if held:
                # Published between this process's lookup and its lock?  Then there is nothing to compile.
                entry = next(self.lookup(key, False, count=False), None)
                if entry is not None:
                    self._release(lock, token)
                    return entry, False
                return None, True
            if not announced:
                announced = True
                log.info("waiting for %s, which is compiling %s for the fleet", self._holder(lock) or "another node",
                         label)
            entry = next(self.lookup(key, False, count=False), None)
            if entry is not None:
                return entry, False
            if time.monotonic() > deadline:
                log.warning("waited %g s for another node compiling %s; compiling it here too (raise "
                            "JITOPS_LOCK_TIMEOUT if such compiles are legitimately slow)", timeout, label)
                return None, False
            time.sleep(POLL_SECONDS)

    def _holder(self, lock: str) -> str | None:
        with contextlib.suppress(Exception):
            value = self._connection().get(lock)
            return value.decode(errors="replace").rsplit(" ", 1)[0] if value else None
        return None

    def _script(self, source: str) -> Any:
        script = self._scripts.get(source)
        if script is None:
            script = self._scripts[source] = self._connection().register_script(source)
        return script

    def _release(self, lock: str, token: str) -> None:
        try:
            self._script(_RELEASE)(keys=[lock], args=[token])
        except Exception as exc:  # noqa: BLE001 - it expires on its own
            log.debug("could not release the fleet lock %s: %s", lock, exc)

    # ---- cache_tools -------------------------------------------------------------------------------------------
    def ping(self) -> float:
        """Seconds for one PING.  Raises RemoteError naming the URL (for cache_tools, which must say why)."""
        started = time.perf_counter()
        try:
            self._connection().ping()
        except RemoteError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise RemoteError(f"cannot reach the remote cache {redact(self.settings.url)}: "
                              f"{type(exc).__name__}: {exc}") from None
        return time.perf_counter() - started

    def has(self, full: str) -> bool:
        return bool(self._connection().exists(entry_name(full)))

    def index(self) -> Iterator[tuple[str, dict[str, Any] | None]]:
        """(full key, summary) of every indexed entry; the summary is None if unreadable."""
        for full, line in self._connection().hscan_iter(INDEX, count=500):
            try:
                yield full.decode(), json.loads(line)
            except ValueError:
                yield full.decode(), None

    def present(self, fulls: list[str]) -> list[bool]:
        pipe = self._connection().pipeline(transaction=False)
        for full in fulls:
            pipe.exists(entry_name(full))
        return [bool(n) for n in pipe.execute()]

    def forget(self, fulls: list[str]) -> None:
        """Drop index lines whose entries expired or were evicted."""
        if fulls:
            self._connection().hdel(INDEX, *fulls)

    def server(self) -> dict[str, Any]:
        """The server's version, memory and eviction policy, and the locks held now."""
        client = self._connection()
        info = client.info()
        locks = sum(1 for _ in client.scan_iter(match=PREFIX + "lock:*", count=1000))
        return {"version": info.get("redis_version"), "used_memory": info.get("used_memory"),
                "maxmemory": info.get("maxmemory"), "maxmemory_policy": info.get("maxmemory_policy"),
                "evicted_keys": info.get("evicted_keys"), "expired_keys": info.get("expired_keys"),
                "locks_held": locks}


class _Renewer(threading.Thread):
    """Renews the fleet lock while its holder compiles; stops when the lock is lost or the remote fails."""

    def __init__(self, remote: RemoteCache, lock: str, token: str, expiry_ms: int) -> None:
        super().__init__(name="jitops-fleet-lock", daemon=True)
        self.remote, self.lock, self.token, self.expiry_ms = remote, lock, token, expiry_ms
        self._stopped = threading.Event()

    def run(self) -> None:
        while not self._stopped.wait(self.expiry_ms / 3000):
            try:
                if not self.remote._script(_RENEW)(keys=[self.lock], args=[self.token, self.expiry_ms]):
                    log.debug("fleet lock %s expired before it was renewed; another node may compile too", self.lock)
                    return
            except Exception as exc:  # noqa: BLE001 - the lock expires; the waiters then compile
                log.debug("could not renew the fleet lock %s: %s", self.lock, exc)
                return

    def stop(self) -> None:
        self._stopped.set()
        self.join(timeout=1)
