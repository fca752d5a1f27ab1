"""The runtime's pipeline and the disk cache's safety rules, on a microsecond 'echo' compiler."""
from __future__ import annotations

import errno
import hashlib
import json
import os
from pathlib import Path

import pytest

import jitops
from jitops.errors import CacheMissError, CompileError, ToolchainError
from jitops.runtime import MissContext, runtime, stats
from jitops.specs import Target

import fakes

CPU = Target("cpu")
SM90 = Target.parse("sm_90")


@pytest.fixture
def echo(fresh_cache):
    backend = fakes.install()
    jitops.reset_stats()
    return backend


def entries(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.glob("v1/*/*/*/meta.json"))


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() + f"@{p.stat().st_mtime_ns}"
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_compile_once_then_memory_then_disk(echo, fresh_cache):
    request = fakes.request("body 1")
    assert runtime.get_kernel(request, SM90, 0) == b"sm_90|body 1"
    assert (echo.compiles, stats.compiles, stats.disk_hits) == (1, 1, 0)
    assert runtime.get_kernel(request, SM90, 0) == b"sm_90|body 1"  # memory: no disk access, no compile
    assert echo.compiles == 1
    runtime.clear_memory()
    assert runtime.get_kernel(request, SM90, 0) == b"sm_90|body 1"
    assert (echo.compiles, stats.disk_hits) == (1, 1)
    [entry] = entries(fresh_cache)
    assert entry.parent.name == "fp32" and entry.parent.parent.name == "sm_90"
    meta = json.loads((entry / "meta.json").read_text())
    assert meta["files"]["payload.bin"]["sha256"] == hashlib.sha256(b"sm_90|body 1").hexdigest()
    assert meta["request"]["kernel"] == "echo_kernel" and meta["toolchain"] == {"echo": "1.0"}
    assert (entry / "last_used").exists() and (entry / "compile.log").read_text() == "echo: fine"


def test_cache_root_is_created_private(echo, fresh_cache):
    runtime.get_kernel(fakes.request(), SM90, 0)
    assert oct(fresh_cache.stat().st_mode & 0o777) == "0o700"


@pytest.mark.parametrize("damage", ["corrupt", "truncated", "missing binary", "missing meta", "garbage meta"])
def test_damaged_entries_are_detected_quarantined_and_rebuilt(echo, fresh_cache, damage, capsys):
    request = fakes.request("payload")
    runtime.get_kernel(request, SM90, 0)
    [entry] = entries(fresh_cache)
    payload = entry / "payload.bin"
    if damage == "corrupt":
        payload.write_bytes(b"sm_90|paylXad")  # same size, other bytes
    elif damage == "truncated":
        payload.write_bytes(payload.read_bytes()[:5])
    elif damage == "missing binary":
        payload.unlink()
    elif damage == "missing meta":
        (entry / "meta.json").unlink()
    else:
        (entry / "meta.json").write_text("{not json")
    runtime.clear_memory()
    assert runtime.get_kernel(request, SM90, 0) == b"sm_90|payload"  # never the damaged bytes
    assert echo.compiles == 2 and stats.corrupt_entries == 1
    assert "is corrupt" in capsys.readouterr().err
    quarantined = list((fresh_cache / "v1" / "quarantine").iterdir())
    assert len(quarantined) == 1 and quarantined[0].name.startswith(entry.name)
    [rebuilt] = entries(fresh_cache)
    assert (rebuilt / "payload.bin").read_bytes() == b"sm_90|payload"


def test_readers_never_see_half_an_entry(echo, fresh_cache, monkeypatch):
    """A publish that dies after writing the binary leaves nothing visible: the entry appears by one rename."""
    real_rename = os.rename

    def crash(src, dst):
        raise KeyboardInterrupt("killed mid-publish")

    monkeypatch.setattr(os, "rename", crash)
    with pytest.raises(KeyboardInterrupt):
        runtime.get_kernel(fakes.request(), SM90, 0)
    monkeypatch.setattr(os, "rename", real_rename)
    assert entries(fresh_cache) == []
    runtime.clear_memory()
    assert runtime.get_kernel(fakes.request(), SM90, 0) == b"sm_90|kernel body"


def test_read_only_root_is_used_and_never_written(echo, tmp_path):
    image = tmp_path / "image-cache"
    with jitops.config.scope(cache_dir=image):
        runtime.get_kernel(fakes.request("shipped"), SM90, 0)
        runtime.get_kernel(fakes.request("also shipped"), SM90, 0)
    [first, second] = entries(image)
    (first / "payload.bin").write_bytes(b"rotten bytes!!")  # a bad entry in the image must be skipped, not moved
    before = snapshot(image)
    runtime.clear_memory()
    echo.compiles = 0
    writable = tmp_path / "user-cache"
    with jitops.config.scope(cache_dir=writable, cache_path=(image,)):
        # mtimes are part of the snapshot: a last-used stamp in the image would show up
        results = {runtime.get_kernel(fakes.request(t), SM90, 0) for t in ("shipped", "also shipped")}
    assert results == {b"sm_90|shipped", b"sm_90|also shipped"}
    assert snapshot(image) == before
    assert echo.compiles == 1  # only the rotten one was rebuilt, into the writable root
    assert len(entries(writable)) == 1


def test_offline_mode_raises_on_a_miss_and_names_the_prewarm_command(echo, fresh_cache):
    context = MissContext("myop", ("bf16", 8), {"op": "myop", "dtypes": ["bf16"], "shapes": [[[4, 4]]],
                                                 "kwargs": {}})
    with jitops.config.scope(offline=True):
        with pytest.raises(CacheMissError) as info:
            runtime.get_kernel(fakes.request(), SM90, 0, context)
    message = str(info.value)
    for part in ("myop", "('bf16', 8)", "sm_90", "python -m cache_tools prewarm", '"op": "myop"'):
        assert part in message
    assert echo.compiles == 0


def test_offline_mode_uses_what_was_prewarmed_even_by_another_toolchain(echo, fresh_cache):
    assert runtime.prewarm(fakes.request(), SM90) == "compiled"
    assert runtime.prewarm(fakes.request(), SM90) == "cached"
    echo.toolchain_identity = {"echo": "9.9"}  # the image carries another compiler version...
    with jitops.config.scope(offline=True):
        assert runtime.get_kernel(fakes.request(), SM90, 0) == b"sm_90|kernel body"
    assert echo.compiles == 1


def test_machine_without_compiler_finds_any_toolchains_build(echo, fresh_cache):
    runtime.prewarm(fakes.request(), SM90)
    runtime.clear_memory()
    echo.toolchain_identity = None  # no compiler here at all
    assert runtime.get_kernel(fakes.request(), SM90, 0) == b"sm_90|kernel body"
    with pytest.raises(ToolchainError, match="no echo compiler"):
        runtime.get_kernel(fakes.request("never built"), SM90, 0)


def test_a_new_toolchain_recompiles_when_a_compiler_is_present(echo, fresh_cache):
    runtime.get_kernel(fakes.request(), SM90, 0)
    runtime.clear_memory()
    echo.toolchain_identity = {"echo": "2.0"}
    runtime.get_kernel(fakes.request(), SM90, 0)
    assert echo.compiles == 2 and len(entries(fresh_cache)) == 2


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS])
def test_store_failure_keeps_kernel_in_memory_and_warns_once(echo, fresh_cache, monkeypatch, code, capsys):
    runtime.get_kernel(fakes.request("existing"), SM90, 0)
    before = snapshot(fresh_cache)
    real_open = open

    def failing_open(path, mode="r", *args, **kwargs):
        if "w" in mode and "/tmp/" in str(path) and str(fresh_cache) in str(path):
            raise OSError(code, os.strerror(code))
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr("builtins.open", failing_open)
    capsys.readouterr()
    assert runtime.get_kernel(fakes.request("new 1"), SM90, 0) == b"sm_90|new 1"
    assert runtime.get_kernel(fakes.request("new 2"), SM90, 0) == b"sm_90|new 2"
    assert capsys.readouterr().err.count("cannot write the kernel cache") == 1
    monkeypatch.setattr("builtins.open", real_open)
    assert [p for p in snapshot(fresh_cache) if "tmp" in p] == []  # no debris
    def entries_only(snap):  # lock files are empty and harmless; stamps move on every use
        return {k: v for k, v in snap.items() if "last_used" not in k and "/locks/" not in k}

    assert entries_only(snapshot(fresh_cache)) == entries_only(before)
    runtime.clear_memory()  # the private build survives for this process
    assert runtime.get_kernel(fakes.request("new 1"), SM90, 0) == b"sm_90|new 1"
    assert echo.compiles == 3


def test_compile_error_is_not_cached(echo, fresh_cache):
    with pytest.raises(CompileError) as info:
        runtime.get_kernel(fakes.request("#error nope"), SM90, 0)
    assert "echo_kernel.cu(1): error" in str(info.value)
    assert entries(fresh_cache) == [] and stats.failed_compiles == 1


def test_record_appends_one_json_line_per_miss(echo, fresh_cache, tmp_path):
    record = tmp_path / "misses.jsonl"
    item = {"op": "myop", "dtypes": ["fp16"], "shapes": [[[8, 8]]], "kwargs": {"k": 1}}
    with jitops.config.scope(record=record):
        runtime.get_kernel(fakes.request("a"), SM90, 0, MissContext("myop", ("fp16",), item))
        runtime.get_kernel(fakes.request("a"), SM90, 0, MissContext("myop", ("fp16",), item))  # memory hit
        runtime.clear_memory()
        runtime.get_kernel(fakes.request("a"), SM90, 0, MissContext("myop", ("fp16",), item))  # disk hit
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    assert lines == [dict(item, archs=["sm_90"])]


def test_progress_is_logged_for_slow_compiles(echo, fresh_cache, capsys):
    echo.delay = 0.3
    with jitops.config.scope(progress_seconds=0.1):
        runtime.get_kernel(fakes.request("slow"), SM90, 0, MissContext("slowop", "cls"))
    err = capsys.readouterr().err
    assert "[jitops] compiling echo_kernel[] for sm_90 (echo), op slowop ..." in err
    assert "[jitops] compiled echo_kernel[] for sm_90 (echo), op slowop in 0." in err


def test_config_rejects_bad_values_by_name(monkeypatch):
    monkeypatch.setenv("JITOPS_OFFLINE", "maybe")
    with pytest.raises(jitops.ConfigError, match="JITOPS_OFFLINE='maybe'"):
        jitops.config.offline
    monkeypatch.setenv("JITOPS_PROGRESS_SECONDS", "-1")
    with pytest.raises(jitops.ConfigError, match="JITOPS_PROGRESS_SECONDS"):
        jitops.config.progress_seconds
    with pytest.raises(jitops.ConfigError, match="unknown setting"):
        with jitops.config.scope(ofline=True):
            pass


def test_tuning_knobs_are_typed_scoped_and_nested():
    """The ops' plan overrides (conv2d tiles, grouped_gemm configurations...) are config knobs: a scope sets
    them, a nested scope overrides and restores them, and a bad value names the knob."""
    config = jitops.config
    assert config.conv2d_tile == {} and config.conv2d_wgrad_direct is True and config.grouped_gemm_schedule is None
    with config.scope(conv2d_tile={"wgrad": "64x64", "fprop": None}, grouped_gemm_schedule=[1, 4]):
        assert config.conv2d_tile == {"wgrad": "64x64"}          # None entries: the plan's choice
        assert config.grouped_gemm_schedule == (1, 4)
        with config.scope(conv2d_wgrad_direct=False):
            assert config.conv2d_wgrad_direct is False and config.conv2d_tile == {"wgrad": "64x64"}
        assert config.conv2d_wgrad_direct is True
    assert config.conv2d_tile == {} and config.grouped_gemm_schedule is None
    seen = [config.generation]  # what memos of knob-derived values key on: new at every scope change
    with config.scope(conv2d_fold=0):
        seen.append(config.generation)
    seen.append(config.generation)
    assert len(set(seen)) == 3
    for knob, bad, message in (("conv2d_fold", -1, "conv2d_fold=-1"), ("conv2d_wgrad_direct", 1, "True or False"),
                               ("grouped_gemm_schedule", (2, 1), "raster 0"), ("grouped_gemm_config", 3, "str"),
                               ("conv2d_splits", {"dgrad": 1.5}, r"conv2d_splits\['dgrad'\]"),
                               ("gemm_family", "sm90", "gemm_family='sm90'.*'auto'")):
        with pytest.raises(jitops.ConfigError, match=message):
            with config.scope(**{knob: bad}):
                pass
    from jitops.config import tuning_knobs  # (jitops.config is the Config object; this is its module)

    assert {"conv2d_tile", "grouped_gemm_config", "gemm_family"} <= set(tuning_knobs())


def test_read_only_root_builds_by_another_toolchain_are_used_even_with_a_compiler(echo, tmp_path):
    """A cache prewarmed on a build box (another host compiler or NVRTC release) and shipped read-only is used
    as is; only the writable root insists on this machine's exact toolchain."""
    shipped = tmp_path / "shipped"
    with jitops.config.scope(cache_dir=shipped):
        runtime.prewarm(fakes.request("built elsewhere"), SM90)
    runtime.clear_memory()
    echo.toolchain_identity = {"echo": "local-2.0"}
    echo.compiles = 0
    with jitops.config.scope(cache_dir=tmp_path / "mine", cache_path=(shipped,)):
        assert runtime.get_kernel(fakes.request("built elsewhere"), SM90, 0) == b"sm_90|built elsewhere"
    assert echo.compiles == 0


def ship(echo, root: Path, body: str, built_by: dict, here: dict | None) -> None:
    """A read-only root prewarmed with `body`'s kernel by toolchain `built_by`, then this machine's toolchain
    `here` (None: no compiler), nothing compiled here yet."""
    echo.toolchain_identity = built_by
    with jitops.config.scope(cache_dir=root):
        runtime.prewarm(fakes.request(body), SM90)
    runtime.clear_memory()
    echo.toolchain_identity = here
    echo.compiles = 0


def test_other_toolchains_builds_that_cannot_load_here_are_passed_over(echo, tmp_path, monkeypatch, caplog):
    """A host library linked against another torch (the C++ host path prewarmed on a box with another torch) is
    not a candidate: it is compiled here, with no 'bad cache entry' warning, and the shipped build stays for the
    machines it suits; a build by another compiler against the same torch is used."""
    monkeypatch.setattr(echo, "loads_builds_by", lambda toolchain: toolchain.get("links") == "torch-B")
    shipped = tmp_path / "shipped"
    ship(echo, shipped, "host library", {"echo": "1.0", "links": "torch-A"}, {"echo": "2.0", "links": "torch-B"})
    with jitops.config.scope(cache_dir=tmp_path / "mine", cache_path=(shipped,)), caplog.at_level("WARNING"):
        assert runtime.get_kernel(fakes.request("host library"), SM90, 0) == b"sm_90|host library"
        assert echo.compiles == 1 and "bad cache entry" not in caplog.text
        assert stats.corrupt_entries == 0 and len(entries(shipped)) == 1
    runtime.clear_memory()
    echo.toolchain_identity = None  # no compiler here: still not a candidate, so the miss says why
    with jitops.config.scope(cache_dir=tmp_path / "empty", cache_path=(shipped,)):
        with pytest.raises(ToolchainError, match="no echo compiler"):
            runtime.get_kernel(fakes.request("host library"), SM90, 0)

    same_torch = tmp_path / "same-torch"
    ship(echo, same_torch, "host library 2", {"echo": "3.0", "links": "torch-B"}, {"echo": "2.0", "links": "torch-B"})
    with jitops.config.scope(cache_dir=tmp_path / "mine2", cache_path=(same_torch,)):
        assert runtime.get_kernel(fakes.request("host library 2"), SM90, 0) == b"sm_90|host library 2"
    assert echo.compiles == 0
