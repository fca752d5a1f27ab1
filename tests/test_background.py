"""JITOPS_COMPILE=background on the CPU, with a compile that takes a while (tests/fakes.py's echo backend): the
first call runs the op's torch fallback at once, the kernel compiles in the worker pool, later calls use it; a
failed compile keeps the fallback and warns once; jitops.wait() blocks until the pool is idle; offline mode
never compiles."""
from __future__ import annotations

import logging
import time

import pytest
import torch

import fakes
import jitops
from jitops import Impl

SOURCE = "kernel body of the background test"


@pytest.fixture
def echo():
    backend = fakes.install()
    backend.delay = 0.4
    yield backend


def _declare(name: str, source: str, ran: list[str], kernel: str | None = None):
    def kernels(cls, target):
        return {"k": fakes.request(text=source, kernel=kernel or f"bg_{name}", dtype=str(cls).removeprefix("torch."))}

    def run(k, x):
        assert k.k.startswith(b"cpu|")  # the echo backend's "binary"
        ran.append("kernel")
        return x * 2

    def fallback(k, x):
        ran.append("fallback")
        return x * 2

    return jitops.op(f"bgtest::{name}(Tensor x) -> Tensor", shape_class=lambda x: x.dtype,
                     cpu=Impl(kernels, run), fake=lambda x: torch.empty_like(x), fallback=fallback)


def test_first_call_runs_the_fallback_and_later_calls_the_compiled_kernel(echo, fresh_cache):
    ran: list[str] = []
    double = _declare("double", SOURCE, ran)
    x = torch.randn(5)
    jitops.reset_stats()
    with jitops.config.scope(compile_mode="background"):
        started = time.perf_counter()
        out = double(x)
        assert time.perf_counter() - started < echo.delay  # nothing waited for the compile
        torch.testing.assert_close(out, x * 2)
        assert ran == ["fallback"] and jitops.stats.fallbacks == 1 and jitops.stats.background_compiles == 1
        double(x)  # still compiling: the fallback again, and no second compile is queued
        assert jitops.stats.background_compiles == 1
        assert jitops.wait(timeout=30)
        torch.testing.assert_close(double(x), x * 2)
    assert ran[-1] == "kernel" and echo.compiles == 1
    assert jitops.stats.compiles == 1


def test_a_failed_compile_keeps_the_fallback_and_warns_once(echo, fresh_cache, caplog):
    ran: list[str] = []
    broken = _declare("broken", "#error this kernel does not compile", ran)
    x = torch.randn(3)
    with jitops.config.scope(compile_mode="background"), caplog.at_level(logging.WARNING, logger="jitops"):
        broken(x)
        assert jitops.wait(timeout=30)
        for _ in range(3):
            torch.testing.assert_close(broken(x), x * 2)
    assert ran == ["fallback"] * 4
    warnings = [r for r in caplog.records if "background compile" in r.getMessage()]
    assert len(warnings) == 1 and "keeps running torch's implementation" in warnings[0].getMessage()


def test_a_cached_kernel_loads_at_once_in_background_mode(echo, fresh_cache):
    ran: list[str] = []
    cached = _declare("cached", SOURCE + " (cached)", ran)
    x = torch.randn(4)
    cached(x)  # blocking mode: compiles and stores it
    jitops.clear_memory_cache()
    with jitops.config.scope(compile_mode="background"):
        cached(x)
    assert ran == ["kernel", "kernel"] and echo.compiles == 1


def test_only_compiles_are_announced(echo, fresh_cache, caplog):
    """A background submit of a kernel on disk (the C++ host path's, on every process's first CUDA call) loads it
    without a "compiling ... in the background" line; a missing one is announced."""
    from jitops.runtime import runtime
    from jitops.specs import Target

    on_disk, missing = fakes.request(text="announce: on disk"), fakes.request(text="announce: missing")
    assert runtime.prewarm(on_disk, Target("cpu")) == "compiled"
    jitops.clear_memory_cache()
    with caplog.at_level(logging.INFO, logger="jitops"):
        assert runtime.submit(on_disk, Target("cpu"), None).result(timeout=30) is not None
        assert runtime.submit(missing, Target("cpu"), None).result(timeout=30) is not None
    announced = [r.getMessage() for r in caplog.records if "in the background" in r.getMessage()]
    assert len(announced) == 1 and "echo_kernel" in announced[0] and echo.compiles == 2


def test_offline_mode_never_compiles_even_in_background_mode(echo, fresh_cache):
    ran: list[str] = []
    offline = _declare("offline", SOURCE + " (offline)", ran)
    with jitops.config.scope(compile_mode="background", offline=True):
        with pytest.raises(jitops.CacheMissError):
            offline(torch.randn(2))
    assert echo.compiles == 0 and ran == []


def test_blocking_mode_waits_for_the_kernel(echo, fresh_cache):
    ran: list[str] = []
    blocking = _declare("blocking", SOURCE + " (blocking)", ran)
    started = time.perf_counter()
    blocking(torch.randn(2))
    assert time.perf_counter() - started >= echo.delay and ran == ["kernel"]


def test_wait_with_nothing_queued_returns_at_once():
    started = time.perf_counter()
    assert jitops.wait()
    assert time.perf_counter() - started < 1


def test_compile_mode_is_validated():
    with pytest.raises(jitops.ConfigError, match="JITOPS_COMPILE"):
        import os

        os.environ["JITOPS_COMPILE"] = "lazy"
        try:
            jitops.config.compile_mode
        finally:
            del os.environ["JITOPS_COMPILE"]


@pytest.mark.parametrize("case", ["gemm", "linear", "layer_norm", "rms_norm", "rms_norm_inference", "gelu"])
def test_builtin_fallbacks_match_the_ops(case):
    """Each built-in op's fallback computes what the op computes (fp64 on the CPU, where both are exact)."""
    from jitops.op import Kernels

    torch.manual_seed(0)
    x = torch.randn(6, 8, dtype=torch.float64)
    w = torch.randn(8, 8, dtype=torch.float64)
    b = torch.randn(8, dtype=torch.float64)
    if case == "gemm":
        op, args = jitops.gemm.op, (x, w, b, "gelu_tanh", None)
    elif case == "linear":
        op, args = jitops.linear.op, (x, w, b, "relu")
    elif case == "layer_norm":
        op, args = jitops.layer_norm_forward.op, (x, [8], w[0], b, 1e-5)
    elif case == "rms_norm":
        op, args = jitops.layer_norm_forward.op, (x, [8], w[0], None, 1e-6, True)
    elif case == "rms_norm_inference":
        op, args = jitops.layer_norm_inference.op, (x, [8], w[0], None, 1e-6, True)
    else:
        op, args = jitops.gelu.op, (x, "tanh")
    expected = op.overload(*args)  # positional, as the schema lists them
    got = op.fallback(Kernels({}, op.shape_class(*args)), *args)
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("rms", [False, True], ids=["layer_norm", "rms_norm"])
def test_layer_norm_backward_fallback_matches_the_kernel(rms):
    from jitops.op import Kernels

    torch.manual_seed(0)
    x = torch.randn(5, 7, dtype=torch.float64)
    w, g = torch.randn(7, dtype=torch.float64), torch.randn(5, 7, dtype=torch.float64)
    _, stats = jitops.layer_norm_forward(x, [7], w, None, 1e-5, rms)
    op = jitops.layer_norm_backward.op
    args = (g, x, stats, w, [7], True, True, not rms, rms)
    expected = op.function(*args)
    got = op.fallback(Kernels({}, op.shape_class(*args)), *args)
    for a, e in zip(got, expected):
        torch.testing.assert_close(a, e)


def test_two_ops_sharing_a_kernel_do_not_wait_for_its_background_compile(echo, fresh_cache):
    """A second op (a backward) asking for a kernel that a worker is compiling runs its fallback at once
    instead of waiting on the worker's lock."""
    ran: list[str] = []
    first = _declare("shared_a", SOURCE + " (shared)", ran, kernel="bg_shared")
    second = _declare("shared_b", SOURCE + " (shared)", ran, kernel="bg_shared")  # the same build request
    echo.delay = 1.5
    x = torch.randn(3)
    with jitops.config.scope(compile_mode="background"):
        first(x)
        started = time.perf_counter()
        second(x)
        assert time.perf_counter() - started < 1.0
        assert jitops.wait(timeout=30)
        first(x)
        second(x)
    assert ran == ["fallback", "fallback", "kernel", "kernel"] and echo.compiles == 1
