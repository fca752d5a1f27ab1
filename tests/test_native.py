"""jitops.linear's C++ host path on a machine without a GPU: the extension builds through the runtime (cached,
a second process imports it), answers None for what it does not cover (CPU tensors, a stale config
generation), leaves jitops.linear's results to the Python path, and stays off with JITOPS_NATIVE_HOST=0.  Its
launches are tested on the GPU (tests/test_native_gpu.py)."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import jitops
from jitops import native


@pytest.fixture(scope="module")
def module():
    built = native.wait()
    assert built is not None, "the C++ host path did not build (see the jitops log)"
    return built


def test_cpu_tensors_are_left_to_the_python_path(module):
    x, w, b = torch.randn(4, 16), torch.randn(8, 16), torch.randn(8)
    before = native.counters()
    assert module.linear(x, w, b, 0, jitops.config.generation) is None
    assert native.counters()["native_misses"] == before["native_misses"] + 1
    torch.testing.assert_close(jitops.linear(x, w, b), torch.nn.functional.linear(x, w, b))
    assert native.counters()["native_calls"] == before["native_calls"]


def test_not_tensors_get_the_python_path_error(module):
    with pytest.raises((TypeError, ValueError), match="linear"):
        jitops.linear([1.0, 2.0], torch.randn(8, 2))


def test_an_offer_with_params_of_the_wrong_size_is_refused(module):
    with pytest.raises(RuntimeError, match="Params of 10 bytes, expected 448"):
        module.offer(0, True, False, True, True, 64, 64, 64, 64, 64, 64, 0, False, jitops.config.generation,
                     0, (1, 1, 1), 384, 1024, (0, 128, 256), 384, b"0" * 10)


def test_a_problem_offered_under_another_generation_is_not_used(module):
    # Offered under generation g, asked under g + 1: a miss before any check of the tensors.
    generation = jitops.config.generation
    module.offer(0, True, False, True, True, 64, 64, 64, 64, 64, 64, 0, False, generation, 0, (1, 1, 1), 384,
                 1024, (0, 128, 256), 384, bytes(448))
    assert native.counters()["native_problems"] >= 1
    before = native.counters()["native_misses"]
    assert module.linear(torch.randn(64, 64), torch.randn(64, 64), None, 0, generation + 1) is None
    assert native.counters()["native_misses"] == before + 1


def test_native_host_off_builds_nothing():
    host = native._Host()
    host.runtime = jitops.runtime
    with jitops.config.scope(native_host=False):
        host.start()
        assert host.wait() is None
    assert host.module is None and host._future is None


def test_a_second_process_imports_the_cached_build(module):
    code = ("import jitops, time; from jitops import native; t = time.perf_counter(); m = native.wait(); "
            "print(m is not None, jitops.stats.compiles, round(time.perf_counter() - t, 3))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    loaded, compiles, seconds = out.stdout.split()
    assert loaded == "True" and compiles == "0", out.stdout + out.stderr


def _plan(op: str, shapes, archs=("sm_90a",)):
    from cache_tools import manifest

    item = {"op": op, "dtypes": ["bf16"], "shapes": [shapes], "grad": True}
    return manifest.plan(manifest.parse_item(item, list(archs), "test"))


def test_prewarm_plans_the_host_path_beside_the_light_gemm():
    linear = [[512, 1024], [1024, 1024], [1024]]
    kernels = {job.request.kernel for job in _plan("linear", linear).jobs}
    assert {"gemm_sm90_light", "linear_host"} <= kernels
    with jitops.config.scope(native_host=False):
        assert "linear_host" not in {job.request.kernel for job in _plan("linear", linear).jobs}
    assert "linear_host" not in {job.request.kernel for job in _plan("gelu", [[512, 1024]]).jobs}
    assert "linear_host" not in {job.request.kernel for job in _plan("linear", linear, ("sm_80",)).jobs}


def test_gelu_kernels_launched_before_the_extension_loads_are_offered_later(monkeypatch):
    """A GELU launched while the extension still builds is offered at a later launch, not marked as done."""
    from types import SimpleNamespace

    offered = []
    fake = SimpleNamespace(offer_gelu=lambda *args: offered.append(args))
    kernels = SimpleNamespace()
    cls = SimpleNamespace(dtype=torch.bfloat16, approximate="tanh", vec=8, index="int")
    function = SimpleNamespace(handle=1234)
    monkeypatch.setattr(native.host, "module", None)
    native.offer_gelu(kernels, function, cls, 0, False, 1024, 256)
    assert getattr(kernels, "native_offered", None) != jitops.config.generation and not offered
    monkeypatch.setattr(native.host, "module", fake)
    native.offer_gelu(kernels, function, cls, 0, False, 1024, 256)
    assert kernels.native_offered == jitops.config.generation and len(offered) == 1
    assert offered[0][:6] == (0, True, True, 8, True, False) and offered[0][7:] == (1234, 256, 1024)
