"""The remote tier against a real redis-server: lookups and publishes, one compile per key across a simulated
fleet (two disk caches), a dead lock holder, a dead, slow, full or evicting Redis, tampered entries, and the
remote disabled.  Each test starts its own server on a random loopback port in a temporary directory."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import jitops
from jitops import config
from jitops.cache import remote
from jitops.cache.disk import entry_meta
from jitops.errors import CompileError, ConfigError
from jitops.runtime import runtime, stats
from jitops.specs import Target

import fakes
from cache_tools_helpers import cli, cli_json, entry_dirs, write_manifest
from redis_server import RedisServer, find_binary

REPO = Path(__file__).resolve().parent.parent
SM90 = Target.parse("sm_90")

pytestmark = pytest.mark.skipif(find_binary() is None, reason="redis-server not found: apt-get install "
                                "redis-server, or set JITOPS_REDIS_SERVER (CI installs it in .ci/run)")


@pytest.fixture
def server(tmp_path):
    redis = RedisServer(tmp_path / "redis").start()
    yield redis
    redis.stop()


@pytest.fixture
def echo(fresh_cache):
    backend = fakes.install()
    jitops.reset_stats()
    yield backend
    runtime._private.clear()


@contextlib.contextmanager
def node(root: Path, url: str | None, **settings):
    """One machine of the fleet: its own disk cache, the shared remote, a fresh memory cache."""
    runtime.clear_memory()
    with config.scope(cache_dir=root, remote_cache=url, **settings):
        yield
    runtime.clear_memory()


def payloads(root: Path) -> list[bytes]:
    return sorted((entry / "payload.bin").read_bytes() for entry in entry_dirs(root))


def remote_counts() -> dict[str, int]:
    return {k: v for k, v in stats.as_dict().items() if k.startswith("remote_") and k != "remote_seconds"}


def entry_key(client, request, target=SM90) -> str:
    key, _ = runtime.key_for(request, target)
    assert client.exists(remote.entry_name(key.full))
    return remote.entry_name(key.full)


# ---- the tier in one process -------------------------------------------------------------------------------------
def test_compile_publishes_a_fresh_node_hits_the_remote_then_its_own_disk(echo, server, tmp_path):
    request = fakes.request("body 1")
    with node(tmp_path / "a", server.url):
        assert runtime.get_kernel(request, SM90, 0) == b"sm_90|body 1"
    assert echo.compiles == 1
    assert remote_counts() == dict.fromkeys(remote_counts(), 0) | {"remote_misses": 1, "remote_publishes": 1}
    with node(tmp_path / "b", server.url):
        assert runtime.get_kernel(request, SM90, 0) == b"sm_90|body 1"
        assert (echo.compiles, stats.remote_hits, stats.disk_hits) == (1, 1, 0)
        runtime.clear_memory()
        assert runtime.get_kernel(request, SM90, 0) == b"sm_90|body 1"  # the next process on the node: disk
        assert (echo.compiles, stats.remote_hits, stats.disk_hits) == (1, 1, 1)
    # Stored by the disk's atomic publish: the same meta (both key halves, checksums) as a compiled entry.
    [a], [b] = entry_dirs(tmp_path / "a"), entry_dirs(tmp_path / "b")
    assert a.relative_to(tmp_path / "a") == b.relative_to(tmp_path / "b")
    meta_a, meta_b = json.loads((a / "meta.json").read_text()), json.loads((b / "meta.json").read_text())
    assert meta_a["files"]["payload.bin"] == meta_b["files"]["payload.bin"] and meta_a["key"] == meta_b["key"]
    assert list((tmp_path / "b" / "v1" / "tmp").iterdir()) == []
    client = server.client()
    assert 0 < client.pttl(entry_key(client, request)) <= config.remote_ttl * 1000


def test_a_disk_hit_in_a_read_only_root_never_asks_the_remote(echo, server, tmp_path):
    """Lookup order: the read-only roots (an image layer) and the writable root come before the remote."""
    request = fakes.request("in the image")
    with node(tmp_path / "image", None):  # the layer is built without a remote: Redis stays empty
        runtime.get_kernel(request, SM90, 0)
    jitops.reset_stats()
    with node(tmp_path / "pod", server.url, cache_path=(tmp_path / "image",)):
        assert runtime.get_kernel(request, SM90, 0) == b"sm_90|in the image"
    assert (stats.disk_hits, echo.compiles) == (1, 1)
    assert remote_counts() == dict.fromkeys(remote_counts(), 0) and stats.remote_seconds == 0
    assert entry_dirs(tmp_path / "pod") == [] and server.client().dbsize() == 0


def test_locate_finds_the_verified_binary_as_a_call_would_without_loading_it(echo, server, tmp_path):
    """Runtime.locate(): get_kernel()'s lookups (disk roots, then the remote, stored on the local disk), stopped
    before the backend's load; it never compiles and counts no hit."""
    request = fakes.request("located")
    with node(tmp_path / "a", server.url):
        runtime.get_kernel(request, SM90, 0)
        jitops.reset_stats()
        found = runtime.locate(request, SM90)
    assert found.tier == "disk" and found.blobs["payload.bin"] == b"sm_90|located"
    assert found.path == entry_dirs(tmp_path / "a")[0] and stats.disk_hits == 0 and stats.remote_seconds == 0
    with node(tmp_path / "b", server.url):
        found = runtime.locate(request, SM90)
        assert found.tier == "remote" and found.blobs["payload.bin"] == b"sm_90|located"
        assert found.path == entry_dirs(tmp_path / "b")[0]  # stored where the node's next process looks
        assert json.loads((found.path / "meta.json").read_text())["key"] == found.meta["key"]
        assert runtime.locate(request, SM90).tier == "disk"
        assert runtime.get_kernel(request, SM90, 0) == b"sm_90|located" and stats.disk_hits == 1
    assert (stats.remote_hits, echo.compiles) == (0, 1)
    _tamper(server.client(), entry_key(server.client(), request), "bad checksum", "")
    with node(tmp_path / "c", server.url):
        assert runtime.locate(request, SM90) is None  # rejected: a call would compile
        assert runtime.locate(fakes.request("never built"), SM90) is None
    assert (stats.remote_rejected, stats.remote_misses, echo.compiles) == (1, 2, 1)
    assert entry_dirs(tmp_path / "c") == []


def test_a_failed_compile_publishes_nothing_and_frees_the_fleet_lock(echo, server, tmp_path):
    """Only a compile that succeeds is shared; a failing one leaves no entry and no lock for the fleet to wait on."""
    client = server.client()
    with node(tmp_path / "a", server.url), pytest.raises(CompileError):
        runtime.get_kernel(fakes.request("#error broken"), SM90, 0)
    assert (stats.failed_compiles, stats.remote_publishes, stats.remote_publish_failures) == (1, 0, 0)
    assert client.keys("jitops:v1:entry:*") == [] and client.keys("jitops:v1:lock:*") == []
    with node(tmp_path / "b", server.url):  # the next node is not kept waiting: it compiles (and fails) at once
        started = time.perf_counter()
        with pytest.raises(CompileError):
            runtime.get_kernel(fakes.request("#error broken"), SM90, 0)
        assert time.perf_counter() - started < 1.0
    assert stats.failed_compiles == 2 and stats.remote_hits == 0


def test_a_remote_hit_hashes_each_file_once_and_stores_the_checked_sums(echo, server, tmp_path, monkeypatch):
    """The entry's sha256 is computed once on a remote hit (the check against the meta); the local copy's
    meta.json takes those checked sums instead of hashing the bytes again (1.5 ms for a 2.7 MB cubin)."""
    request = fakes.request("hashed once")
    with node(tmp_path / "a", server.url):
        runtime.get_kernel(request, SM90, 0)
    hashed: list[bytes] = []
    real = hashlib.sha256

    def counting(data=b"", *args, **kwargs):
        hashed.append(bytes(data))
        return real(data, *args, **kwargs)

    monkeypatch.setattr(hashlib, "sha256", counting)
    with node(tmp_path / "b", server.url):
        assert runtime.get_kernel(request, SM90, 0) == b"sm_90|hashed once" and stats.remote_hits == 1
    assert hashed.count(b"sm_90|hashed once") == 1
    [a], [b] = entry_dirs(tmp_path / "a"), entry_dirs(tmp_path / "b")
    assert json.loads((b / "meta.json").read_text())["files"] == json.loads((a / "meta.json").read_text())["files"]
    # Sums that do not describe exactly these bytes' names and sizes are not taken: the bytes are hashed.
    key, _ = runtime.key_for(request, SM90)
    wrong = {"files": {"payload.bin": {"sha256": "0" * 64, "size": 3}}}
    assert entry_meta(key, {"payload.bin": b"abcd"}, wrong, checked=True)["files"]["payload.bin"] == {
        "sha256": real(b"abcd").hexdigest(), "size": 4}
    extra = {"files": {"payload.bin": {"sha256": "0" * 64, "size": 4}, "other": {"sha256": "1" * 64, "size": 1}}}
    assert entry_meta(key, {"payload.bin": b"abcd"}, extra, checked=True)["files"]["payload.bin"]["sha256"] == \
        real(b"abcd").hexdigest()


def test_a_torn_copy_of_a_remote_entry_is_quarantined_and_fetched_again(echo, server, tmp_path, capsys):
    """A remote hit is stored without fsync (a crash may tear it): the checksums catch that, and the entry comes
    from the remote again, not from a compile."""
    request = fakes.request("torn")
    with node(tmp_path / "a", server.url):
        runtime.get_kernel(request, SM90, 0)
    with node(tmp_path / "b", server.url):
        runtime.get_kernel(request, SM90, 0)
        [entry] = entry_dirs(tmp_path / "b")
        (entry / "payload.bin").write_bytes(b"")  # what a crash before writeback can leave
        runtime.clear_memory()
        assert runtime.get_kernel(request, SM90, 0) == b"sm_90|torn"
    assert (stats.corrupt_entries, stats.remote_hits, echo.compiles) == (1, 2, 1)
    assert "is corrupt" in capsys.readouterr().err
    assert payloads(tmp_path / "b") == [b"sm_90|torn"]


def test_entries_carry_the_ttl_and_a_load_renews_it(echo, server, tmp_path):
    request = fakes.request("ttl")
    client = server.client()
    with node(tmp_path / "a", server.url, remote_ttl=100.0):
        runtime.get_kernel(request, SM90, 0)
    name = entry_key(client, request)
    assert 90_000 < client.pttl(name) <= 100_000
    client.pexpire(name, 5_000)
    with node(tmp_path / "b", server.url, remote_ttl=100.0):
        runtime.get_kernel(request, SM90, 0)
    assert client.pttl(name) > 90_000 and stats.remote_hits == 1
    with node(tmp_path / "c", server.url, remote_ttl=0.0):  # 0: no expiry
        runtime.get_kernel(fakes.request("forever"), SM90, 0)
    assert client.pttl(entry_key(client, fakes.request("forever"))) == -1


def test_a_node_without_the_compiler_takes_another_toolchains_build(echo, server, tmp_path):
    """The toolchain half of the key works as on disk: a node that can compile wants its own toolchain's build;
    one that cannot (a deployment image) takes any toolchain's build of the same request."""
    request = fakes.request("portable")
    with node(tmp_path / "builder", server.url):
        runtime.get_kernel(request, SM90, 0)
    echo.toolchain_identity = {"echo": "2.0"}  # another compiler release
    with node(tmp_path / "upgraded", server.url):
        runtime.get_kernel(request, SM90, 0)
    assert echo.compiles == 2 and stats.remote_hits == 0
    echo.toolchain_identity = None  # no compiler at all
    with node(tmp_path / "image", server.url):
        assert runtime.get_kernel(request, SM90, 0) == b"sm_90|portable"
    assert echo.compiles == 2 and stats.remote_hits == 1
    [entry] = entry_dirs(tmp_path / "image")
    assert json.loads((entry / "meta.json").read_text())["toolchain"] == {"echo": "2.0"}  # the newest build
    with node(tmp_path / "offline", server.url, offline=True):  # offline never compiles, but may fetch
        echo.toolchain_identity = {"echo": "1.0"}
        assert runtime.get_kernel(request, SM90, 0) == b"sm_90|portable"
    assert echo.compiles == 2 and stats.remote_hits == 2


def test_entry_size_limit_on_publish_and_on_fetch(echo, server, tmp_path, capsys):
    big = fakes.request("x" * 5000)
    with node(tmp_path / "a", server.url, remote_max_entry_size=1000):
        assert runtime.get_kernel(big, SM90, 0) == b"sm_90|" + b"x" * 5000
        runtime.get_kernel(fakes.request("small"), SM90, 0)
    assert (stats.remote_publish_failures, stats.remote_publishes) == (1, 1)
    assert "over JITOPS_REMOTE_MAX_ENTRY_SIZE" in capsys.readouterr().err
    assert not server.client().exists(remote.entry_name(runtime.key_for(big, SM90)[0].full))
    with node(tmp_path / "b", server.url, remote_max_entry_size=1000):
        runtime.get_kernel(fakes.request("small"), SM90, 0)
        assert stats.remote_hits == 1
    with node(tmp_path / "c", server.url, remote_max_entry_size=10):  # a node with a smaller limit
        runtime.get_kernel(fakes.request("small"), SM90, 0)  # does not download it
    assert stats.remote_rejected == 1 and echo.compiles == 3


# ---- tampered entries --------------------------------------------------------------------------------------------
def _tamper(client, name: str, how: str, other: str) -> None:
    if how == "bad checksum":
        data = bytearray(client.hget(name, "file:payload.bin"))
        data[-1] ^= 1
        client.hset(name, "file:payload.bin", bytes(data))
    elif how == "truncated file":
        client.hset(name, "file:payload.bin", client.hget(name, "file:payload.bin")[:-3])
    elif how == "missing file":
        client.hdel(name, "file:payload.bin")
    elif how == "rewritten meta":  # file and checksums replaced consistently: only the signature can tell
        meta = json.loads(client.hget(name, "meta"))
        evil = b"sm_90|evil code"
        meta["files"]["payload.bin"] = {"sha256": hashlib.sha256(evil).hexdigest(), "size": len(evil)}
        client.hset(name, mapping={"meta": json.dumps(meta).encode(), "file:payload.bin": evil})
    elif how == "wrong key":  # another kernel's complete, valid entry stored under this key
        client.delete(name)
        client.copy(other, name)
    elif how == "garbage meta":
        client.hset(name, "meta", b"{not json")
    else:
        raise AssertionError(how)


@pytest.mark.parametrize("how, secret", [
    ("bad checksum", None), ("truncated file", None), ("missing file", None), ("wrong key", None),
    ("garbage meta", None), ("rewritten meta", "fleet secret"),
])
def test_tampered_entries_are_rejected_counted_and_recompiled(echo, server, tmp_path, how, secret, capsys):
    request, other = fakes.request("genuine"), fakes.request("another kernel")
    client = server.client()
    with node(tmp_path / "a", server.url, remote_cache_key=secret):
        runtime.get_kernel(request, SM90, 0)
        runtime.get_kernel(other, SM90, 0)
    name = entry_key(client, request)
    _tamper(client, name, how, entry_key(client, other))
    jitops.reset_stats()
    with node(tmp_path / "b", server.url, remote_cache_key=secret):
        assert runtime.get_kernel(request, SM90, 0) == b"sm_90|genuine"
    assert (stats.remote_rejected, stats.remote_hits, stats.compiles) == (1, 0, 1)
    assert "rejected remote cache entry" in capsys.readouterr().err
    assert payloads(tmp_path / "b") == [b"sm_90|genuine"]  # nothing of the tampered entry reached the disk
    # The local compile replaced the bad entry: the next node gets a good one.
    with node(tmp_path / "c", server.url, remote_cache_key=secret):
        assert runtime.get_kernel(request, SM90, 0) == b"sm_90|genuine"
    assert (stats.remote_hits, stats.compiles) == (1, 1)


def test_signatures_from_another_secret_or_none_are_rejected(echo, server, tmp_path):
    request = fakes.request("signed")
    with node(tmp_path / "a", server.url, remote_cache_key="secret A"):
        runtime.get_kernel(request, SM90, 0)
    with node(tmp_path / "b", server.url, remote_cache_key="secret B"):
        runtime.get_kernel(request, SM90, 0)
    assert (stats.remote_rejected, stats.remote_hits, echo.compiles) == (1, 0, 2)
    with node(tmp_path / "c", server.url):  # unsigned, written by a node without any secret
        runtime.get_kernel(request, SM90, 0)  # (no secret here: it takes what B signed)
    with node(tmp_path / "d", server.url):
        runtime.get_kernel(fakes.request("planted"), SM90, 0)
    with node(tmp_path / "e", server.url, remote_cache_key="secret B"):
        runtime.get_kernel(request, SM90, 0)                 # B's signature: accepted
        runtime.get_kernel(fakes.request("planted"), SM90, 0)  # unsigned: rejected
    assert (stats.remote_hits, stats.remote_rejected, echo.compiles) == (2, 2, 4)


# ---- failures never break a call ---------------------------------------------------------------------------------
def test_redis_killed_mid_run_calls_keep_working_with_one_warning_and_it_is_retried_later(echo, server, tmp_path,
                                                                                          capsys):
    backoff = 2.0
    with node(tmp_path / "a", server.url, remote_backoff=backoff):
        runtime.get_kernel(fakes.request("before"), SM90, 0)
        assert stats.remote_publishes == 1
        server.kill()
        timings = []
        for index in range(5):
            started = time.perf_counter()
            assert runtime.get_kernel(fakes.request(f"after {index}"), SM90, 0) == f"sm_90|after {index}".encode()
            timings.append(time.perf_counter() - started)
        assert echo.compiles == 6 and stats.remote_errors == 1  # then left alone for the back-off
        warnings = [line for line in capsys.readouterr().err.splitlines() if "remote cache" in line]
        assert len(warnings) == 1 and "failed while looking up" in warnings[0], warnings
        assert max(timings) < 0.5, timings  # connection refused: about a millisecond
        time.sleep(backoff + 0.1)  # the back-off is over: still down, so another error, but no second warning
        runtime.get_kernel(fakes.request("still down"), SM90, 0)
        assert stats.remote_errors == 2 and "remote cache" not in capsys.readouterr().err
        restarted = RedisServer(tmp_path / "redis2", port=server.port).start()  # back, on the same address
        try:
            time.sleep(backoff + 0.1)
            runtime.get_kernel(fakes.request("after restart"), SM90, 0)
            assert stats.remote_publishes == 2 and restarted.client().hlen(remote.INDEX) == 1
        finally:
            restarted.stop()


def test_a_remote_that_never_answers_costs_one_timeout(echo, tmp_path, capsys):
    """A TCP listener that never replies: the kernel accepts the connection, every request times out."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
        with node(tmp_path / "a", url, remote_timeout=0.05):
            started = time.perf_counter()
            assert runtime.get_kernel(fakes.request("slow remote"), SM90, 0) == b"sm_90|slow remote"
            first = time.perf_counter() - started
            started = time.perf_counter()
            runtime.get_kernel(fakes.request("slow remote 2"), SM90, 0)
            second = time.perf_counter() - started
    assert stats.remote_errors == 1 and echo.compiles == 2
    assert 0.04 < first < 0.5 and second < 0.3, (first, second)
    assert 0.04 < stats.remote_seconds < 0.5  # one timeout, then nothing: the remote is left alone
    err = capsys.readouterr().err
    assert err.count("failed while") == 1 and "Timeout" in err


def test_a_full_remote_noeviction_refuses_publishes_without_breaking_calls(echo, server, tmp_path, capsys):
    client = server.client()
    with node(tmp_path / "a", server.url, remote_backoff=0.0):
        runtime.get_kernel(fakes.request("fits"), SM90, 0)
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", str(client.info("memory")["used_memory"] - 10_000))  # full now
        for index in range(4):
            body = f"{index}" + "y" * 30_000
            assert runtime.get_kernel(fakes.request(body), SM90, 0) == b"sm_90|" + body.encode()
    assert (stats.remote_publishes, stats.remote_publish_failures, stats.remote_errors) == (1, 4, 0)
    assert capsys.readouterr().err.count("is full") == 1
    assert len(list(client.scan_iter(match="jitops:v1:lock:*"))) == 0
    with node(tmp_path / "b", server.url):  # reads still work
        assert runtime.get_kernel(fakes.request("fits"), SM90, 0) == b"sm_90|fits"
    assert stats.remote_hits == 1


def test_an_evicting_remote_loses_entries_and_nodes_recompile_them(echo, server, tmp_path):
    client = server.client()
    client.config_set("maxmemory-policy", "allkeys-lru")
    # Room for about 12 of the 20 entries; the margin is for client buffers, which Redis cannot evict.
    client.config_set("maxmemory", str(client.info("memory")["used_memory"] + 3_000_000))
    bodies = [f"{index}" + "z" * 200_000 for index in range(20)]
    with node(tmp_path / "a", server.url):
        for body in bodies:
            runtime.get_kernel(fakes.request(body), SM90, 0)
    assert (stats.remote_publishes, stats.remote_publish_failures, stats.remote_errors) == (20, 0, 0)
    assert client.info("stats")["evicted_keys"] > 0
    jitops.reset_stats()
    with node(tmp_path / "b", server.url):
        for body in reversed(bodies):  # newest first: node b's own publishes evict the oldest
            assert runtime.get_kernel(fakes.request(body), SM90, 0) == b"sm_90|" + body.encode()
    assert 1 <= stats.remote_hits < 20 and stats.remote_hits + stats.compiles == 20
    assert (stats.remote_errors, stats.remote_rejected) == (0, 0)


# ---- disabled ----------------------------------------------------------------------------------------------------
PROBE = r"""
import json, os, sys
import jitops
from jitops.runtime import runtime
from jitops.specs import Target
import fakes
fakes.install()
assert runtime.get_kernel(fakes.request("probe"), Target.parse("sm_90"), 0) == b"sm_90|probe"
import threading
for thread in threading.enumerate():
    if thread.name == "jitops-redis-import":
        thread.join()
print(json.dumps(dict(jitops.stats.as_dict(), redis_imported="redis" in sys.modules)))
"""


def _probe(tmp_path: Path, **env: str) -> dict:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("JITOPS_REMOTE")}
    environ.update(JITOPS_CACHE_DIR=str(tmp_path / "probe"), PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'tests'}", **env)
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300, env=environ)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_remote_disabled_imports_nothing_and_changes_nothing(tmp_path, server):
    disabled = _probe(tmp_path)
    assert disabled["redis_imported"] is False
    assert {k: v for k, v in disabled.items() if k.startswith("remote_")} == dict.fromkeys(
        ("remote_hits", "remote_misses", "remote_rejected", "remote_errors", "remote_publishes",
         "remote_publish_failures", "remote_seconds"), 0)
    assert disabled["compiles"] == 1
    assert _probe(tmp_path)["disk_hits"] == 1  # the next process: the disk, as always
    # The same probe with a remote: the client is imported and the kernel published.
    enabled = _probe(tmp_path / "other", JITOPS_REMOTE_CACHE=server.url)
    assert enabled["redis_imported"] is True and enabled["remote_publishes"] == 1
    with config.scope(remote_cache=None):
        assert runtime.remote_cache() is None


def test_a_process_configured_for_the_remote_imports_the_client_and_the_idna_codec_at_import():
    """`import jitops` with JITOPS_REMOTE_CACHE set imports the redis client and the idna codec (the first
    connection's getaddrinfo() needs it: 0.9 ms) in a thread, before any lookup; without it, neither."""
    code = ("import sys, threading, jitops\n"
            "[t.join() for t in threading.enumerate() if t.name == 'jitops-redis-import']\n"
            "print('redis' in sys.modules, 'encodings.idna' in sys.modules)")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("JITOPS_REMOTE")}
    environ.update(PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'tests'}")
    for url, expected in ((None, "False False"), ("redis://127.0.0.1:1/0", "True True")):
        env = dict(environ, **({"JITOPS_REMOTE_CACHE": url} if url else {}))
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split("\n")[-2] == expected


def test_settings_are_typed_and_the_secret_is_never_shown(monkeypatch):
    monkeypatch.setenv("JITOPS_REMOTE_CACHE", "http://cache:6379")
    with pytest.raises(ConfigError, match="JITOPS_REMOTE_CACHE.*redis://host:port/db"):
        config.remote_cache
    monkeypatch.setenv("JITOPS_REMOTE_CACHE", "redis://:hunter2@cache:6379/1")
    monkeypatch.setenv("JITOPS_REMOTE_CACHE_KEY", "hunter2")
    monkeypatch.setenv("JITOPS_REMOTE_MAX_ENTRY_SIZE", "16M")
    assert config.remote_max_entry_size == 16 * 2**20
    described = {row[0]: row[1] for row in config.describe()}
    assert described["JITOPS_REMOTE_CACHE_KEY"] == "'<set>'"
    assert remote.redact(config.remote_cache) == "redis://***@cache:6379/1"
    monkeypatch.setenv("JITOPS_REMOTE_TIMEOUT", "0")
    with pytest.raises(ConfigError, match="JITOPS_REMOTE_TIMEOUT"):
        config.remote_timeout
    monkeypatch.setenv("JITOPS_REMOTE_MAX_ENTRY_SIZE", "lots")
    with pytest.raises(ConfigError, match="JITOPS_REMOTE_MAX_ENTRY_SIZE"):
        config.remote_max_entry_size


# ---- the fleet: processes on two nodes ---------------------------------------------------------------------------
RACER = r"""
import json, os, sys, time
from pathlib import Path
import torch, jitops
from jitops.runtime import runtime, stats
from jitops.specs import Target

ready, name = Path(os.environ["RACE_DIR"]), os.environ.get("RACE_NAME", "ready")
(ready / f"{name}.{os.getpid()}").touch()
while len(list(ready.glob(f"{name}.*"))) < int(os.environ["RACERS"]):  # start together, after the imports
    time.sleep(0.01)
started = time.monotonic()
if os.environ["RACE_KERNEL"] == "gelu":
    x = torch.linspace(-4, 4, 4097, dtype=torch.float64)
    y = jitops.gelu(x, "tanh")
    ok = bool(torch.allclose(y, torch.nn.functional.gelu(x, approximate="tanh"), rtol=1e-12, atol=1e-12))
else:
    import fakes
    backend = fakes.install()
    backend.delay = float(os.environ.get("ECHO_DELAY", "0"))
    compile = backend.compile
    def counted(*args):
        with open(ready / "compiles", "a") as log:
            log.write(f"{os.getpid()}\n")
        return compile(*args)
    backend.compile = counted
    ok = runtime.get_kernel(fakes.request("race"), Target.parse("sm_90"), 0) == b"sm_90|race"
print(json.dumps(dict(stats.as_dict(), ok=ok, seconds=time.monotonic() - started, finished=time.time())))
"""


def _racer_env(cache: Path, url: str, race: Path, racers: int, kernel: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ, JITOPS_CACHE_DIR=str(cache), JITOPS_REMOTE_CACHE=url, RACE_DIR=str(race),
               RACERS=str(racers), RACE_KERNEL=kernel, PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'tests'}")
    env.update(extra)
    return env


def _race(tmp_path: Path, url: str, kernel: str, **extra: str) -> tuple[list[dict], Path]:
    race = tmp_path / "race"
    race.mkdir()
    nodes = [tmp_path / "node-a", tmp_path / "node-b"]
    racers = [subprocess.Popen([sys.executable, "-c", RACER], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=_racer_env(nodes[i % 2], url, race, 8, kernel, **extra))
              for i in range(8)]
    results = []
    for racer in racers:
        out, err = racer.communicate(timeout=850)
        assert racer.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    for root in nodes:  # each node ends with the one entry on its disk, and nothing half-written
        assert len(list(root.glob("v1/*/*/*/meta.json"))) == 1
        assert list((root / "v1" / "tmp").iterdir()) == []
    return results, race


@pytest.mark.timeout(600)
def test_eight_processes_on_two_nodes_compile_a_cold_key_once(server, tmp_path):
    results, race = _race(tmp_path, server.url, "echo", ECHO_DELAY="2")
    assert all(r["ok"] for r in results)
    assert len((race / "compiles").read_text().splitlines()) == 1
    assert sum(r["compiles"] for r in results) == 1
    assert sum(r["disk_hits"] + r["remote_hits"] for r in results) == 7
    assert sum(r["remote_hits"] for r in results) >= 1  # the other node got it from the remote
    assert sum(r["remote_errors"] + r["remote_rejected"] for r in results) == 0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_eight_processes_on_two_nodes_real_cpu_kernel_end_to_end(server, tmp_path):
    """jitops.gelu's CPU kernel (a real C++ compile): one compile in the fleet, every result right, and a
    third node's first call is a remote hit."""
    results, _ = _race(tmp_path, server.url, "gelu")
    assert all(r["ok"] for r in results)
    assert sum(r["compiles"] for r in results) == 1
    assert sum(r["disk_hits"] + r["remote_hits"] for r in results) == 7
    out = subprocess.run([sys.executable, "-c", RACER], capture_output=True, text=True, timeout=300,
                         env=_racer_env(tmp_path / "node-c", server.url, tmp_path / "race", 1, "gelu"))
    assert out.returncode == 0, out.stderr
    third = json.loads(out.stdout.strip().splitlines()[-1])
    assert (third["ok"], third["remote_hits"], third["compiles"], third["disk_hits"]) == (True, 1, 0, 0)


def test_a_waiter_compiles_itself_when_the_lock_holder_outlasts_the_lock_timeout(echo, server, tmp_path, capsys):
    """A live holder (its lock renewed) that takes longer than JITOPS_LOCK_TIMEOUT: the waiter compiles too."""
    request = fakes.request("slow holder")
    client = server.client()
    lock = remote.lock_name(runtime.key_for(request, SM90)[0].full)
    client.set(lock, b"builder pid 1 token", px=60_000)  # held by another node for the next minute
    with node(tmp_path / "a", server.url, lock_timeout=0.5):
        started = time.perf_counter()
        assert runtime.get_kernel(request, SM90, 0) == b"sm_90|slow holder"
        waited = time.perf_counter() - started
    assert 0.5 <= waited < 3.0, waited
    assert (echo.compiles, stats.remote_publishes) == (1, 1)
    assert client.get(lock) == b"builder pid 1 token"  # the holder's lock is left alone
    err = capsys.readouterr().err
    assert err.count("waited 0.5 s for another node compiling") == 1, err


@pytest.mark.timeout(300)
def test_a_lock_holder_killed_with_sigkill_stalls_the_fleet_no_longer_than_the_lock_expiry(server, tmp_path):
    race = tmp_path / "race"
    race.mkdir()
    lock_seconds = 2.0
    env = dict(JITOPS_REMOTE_LOCK_SECONDS=str(lock_seconds), JITOPS_LOG_LEVEL="INFO")
    holder = subprocess.Popen([sys.executable, "-c", RACER], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=_racer_env(tmp_path / "node-a", server.url, race, 1, "echo", ECHO_DELAY="600",
                                             **env))
    waiter = None
    try:
        deadline = time.monotonic() + 120
        while not (race / "compiles").exists():  # the holder is compiling, under the fleet lock
            assert holder.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        (race / "compiles").unlink()
        waiter = subprocess.Popen([sys.executable, "-c", RACER], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=_racer_env(tmp_path / "node-b", server.url, race, 1, "echo",
                                                            RACE_NAME="waiter", **env))
        while "waiting for" not in waiter.stderr.readline():
            assert waiter.poll() is None and time.monotonic() < deadline
        client = server.client()
        assert f"pid {holder.pid} " in client.get(next(client.scan_iter("jitops:v1:lock:*"))).decode()
        time.sleep(2 * lock_seconds)  # the holder renews its lock: the waiter keeps waiting
        assert waiter.poll() is None and not (race / "compiles").exists()
        os.kill(holder.pid, signal.SIGKILL)
        killed = time.time()
        holder.wait()
        out, err = waiter.communicate(timeout=60)
        assert waiter.returncode == 0, err
        result = json.loads(out.strip().splitlines()[-1])
        assert result["ok"] and result["compiles"] == 1
        stalled = result["finished"] - killed
        assert stalled < lock_seconds + 1.0, stalled  # at most one expiry since the last renewal, a poll, the compile
    finally:
        for process in (holder, waiter):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()


# ---- cache_tools ------------------------------------------------------------------------------------------------
# The no-grad path only ("grad": false): one kernel, so the counts below are of one entry.
GELU = {"op": "gelu", "dtypes": ["bf16"], "shapes": [[[1024, 64]]], "kwargs": {"approximate": "tanh"}, "grad": False}


def test_push_pull_manifest_pull_all_and_info(server, tmp_path, capsys):
    manifest = write_manifest(tmp_path / "m.json", GELU, archs=["sm_90"])
    built, fresh, everything = tmp_path / "built", tmp_path / "fresh", tmp_path / "all"
    assert cli(capsys, "prewarm", "--manifest", manifest, "--cache-dir", built, "--no-progress")[0] == 0
    code, report = cli_json(capsys, "push", "--cache-dir", built, "--remote", server.url)
    assert code == 0 and len(report["pushed"]) == 1 and report["present"] == []
    code, report = cli_json(capsys, "push", "--cache-dir", built, "--remote", server.url)
    assert code == 0 and report["pushed"] == [] and len(report["present"]) == 1
    code, report = cli_json(capsys, "pull", "--manifest", manifest, "--cache-dir", fresh, "--remote", server.url)
    assert code == 0 and len(report["pulled"]) == 1 and report["missing"] == []
    code, out, _ = cli(capsys, "verify", "--manifest", manifest, "--cache-dir", fresh)
    assert code == 0 and "1 of 1 kernels cached" in out
    [pulled], [original] = entry_dirs(fresh), entry_dirs(built)
    assert (pulled / "kernel.cubin").read_bytes() == (original / "kernel.cubin").read_bytes()
    code, report = cli_json(capsys, "pull", "--all", "--cache-dir", everything, "--remote", server.url)
    assert code == 0 and len(report["pulled"]) == 1
    code, info = cli_json(capsys, "info", "--cache-dir", everything, "--remote", server.url)
    assert info["remote"]["reachable"] and info["remote"]["entries"] == 1 and "sm_90" in info["remote"]["by_arch"]
    code, out, _ = cli(capsys, "info", "--cache-dir", everything, "--remote", server.url)
    assert "remote tier redis://127.0.0.1" in out and "1 entries" in out


def test_pull_reports_what_the_remote_lacks_and_tools_say_when_it_is_down(server, tmp_path, capsys):
    manifest = write_manifest(tmp_path / "m.json", GELU, archs=["sm_90"])
    code, out, _ = cli(capsys, "pull", "--manifest", manifest, "--cache-dir", tmp_path / "c", "--remote", server.url,
                       "--arch", "sm_90")
    assert code == 1 and "MISSING" in out and "(op gelu" in out
    # the remedy repeats the flags in use: following it fills this cache and pushes to this remote
    assert (f"build them: jitops-cache prewarm --manifest {manifest} --cache-dir {tmp_path / 'c'} --arch sm_90, "
            f"then `jitops-cache push --cache-dir {tmp_path / 'c'} --remote {server.url}`") in out, out
    server.kill()
    code, _, err = cli(capsys, "push", "--cache-dir", tmp_path / "c", "--remote", server.url)
    assert code == 1 and "cannot reach the remote cache" in err
    code, out, _ = cli(capsys, "info", "--cache-dir", tmp_path / "c", "--remote", server.url)
    assert code == 0 and "UNREACHABLE" in out
    code, _, err = cli(capsys, "pull", "--all", "--cache-dir", tmp_path / "c", "--remote", "memcached://x")
    assert code == 2 and "not a Redis URL" in err
    code, _, err = cli(capsys, "push", "--cache-dir", tmp_path / "c")
    assert code == 2 and "JITOPS_REMOTE_CACHE" in err


def test_pull_rejects_a_tampered_entry(server, tmp_path, capsys):
    manifest = write_manifest(tmp_path / "m.json", GELU, archs=["sm_90"])
    cli(capsys, "prewarm", "--manifest", manifest, "--cache-dir", tmp_path / "built", "--no-progress")
    cli(capsys, "push", "--cache-dir", tmp_path / "built", "--remote", server.url)
    client = server.client()
    [name] = list(client.scan_iter("jitops:v1:entry:*"))
    cubin = bytearray(client.hget(name, "file:kernel.cubin"))
    cubin[100] ^= 0xFF
    client.hset(name, "file:kernel.cubin", bytes(cubin))
    code, report = cli_json(capsys, "pull", "--manifest", manifest, "--cache-dir", tmp_path / "c",
                            "--remote", server.url)
    assert code == 1 and report["rejected"] == 1 and len(report["missing"]) == 1
    assert entry_dirs(tmp_path / "c") == []
