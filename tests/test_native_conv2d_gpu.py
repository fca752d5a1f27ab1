"""jitops.conv2d on the C++ host path (jitops/native.py, kernels/host/conv2d.h) on a real GPU: a first training
call on the Python path records and offers its fprop, dgrad and wgrad; the same call then runs in C++ and gives
the same bits (y, dx, dweight, dbias), on ResNet-50-sized layers (a 3x3 and a 1x1 with a split-K wgrad and its
reduction kernel); strided layers (ResNet-50's 3x3 and 1x1 downsampling) train in C++ too (the light dgrad runs
their phases in one launch) and run inference in C++ on tensors other than those recorded; the C++ path captures
into a CUDA graph."""
from __future__ import annotations

import pytest
import torch

import jitops
from jitops import native
from native_helpers import loaded_host_path
from test_conv2d import make_args

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def host():
    return loaded_host_path("jitops.conv2d's kernels are sm_90a")


def _leaves(case, dtype, bias, seed=0):
    x, w, b, *geometry = make_args(case, dtype, "cuda", bias=bias, channels_last=True, seed=seed)
    w = w.contiguous(memory_format=torch.channels_last)   # as in a channels_last model
    return [t.requires_grad_() if t is not None else None for t in (x, w, b)], geometry


def _step(leaves, geometry, grad_out):
    for t in leaves:
        if t is not None:
            t.grad = None
    y = jitops.conv2d(*leaves, *geometry)
    y.backward(grad_out)
    return y.detach().clone(), [t.grad.clone() for t in leaves if t is not None]


LAYERS = [  # (N, C, H, W), (K, R, S), stride, padding, dilation
    ((8, 128, 28, 28), (128, 3, 3), 1, 1, 1),
    ((8, 256, 56, 56), (64, 1, 1), 1, 0, 1),   # wgrad over 25088 rows: split-K slices and the reduction kernel
]


@pytest.mark.parametrize("case", LAYERS, ids=["3x3", "1x1"])
@pytest.mark.parametrize("dtype,bias", [(torch.bfloat16, False), (torch.float16, True)], ids=["bf16", "fp16-bias"])
def test_second_call_runs_in_cpp_with_the_same_bits(host, case, dtype, bias):
    _python_then_cpp(case, dtype, bias)


@pytest.mark.parametrize("case", LAYERS, ids=["3x3", "1x1"])
def test_light_kernels_run_in_cpp_with_the_same_bits(host, case):
    # JITOPS_CONV2D_SM90_KERNEL=light: fprop and dgrad are light kernels whose host side launches their Params
    # itself; the Recording keeps those launches (native._ParamsLaunch) and C++ replays them.
    jitops.clear_memory_cache()  # kernels loaded under the default setting must not answer
    try:
        with jitops.config.scope(conv2d_sm90_kernel="light"):
            _python_then_cpp(case, torch.bfloat16, True)
            (x, w, _), geometry = _leaves(case, torch.bfloat16, True)
            cls = jitops.find("conv2d").shape_class(x, w, None, *geometry)
            kernels = jitops.find("conv2d").loaded(x.get_device(), cls)
            assert isinstance(kernels.fprop, jitops.launch.CudaFunction)  # the light kernel, not a library
    finally:
        jitops.clear_memory_cache()


def _python_then_cpp(case, dtype, bias):
    leaves, geometry = _leaves(case, dtype, bias)
    with torch.no_grad():
        grad_out = torch.randn_like(jitops.conv2d(*leaves, *geometry))
    python_y, python_grads = _step(leaves, geometry, grad_out)   # records and offers fprop, dgrad, wgrad
    before = native.counters()["native_calls"]
    cpp_y, cpp_grads = _step(leaves, geometry, grad_out)
    assert native.counters()["native_calls"] == before + 1
    assert torch.equal(cpp_y, python_y) and cpp_y.is_contiguous(memory_format=torch.channels_last)
    for got, want in zip(cpp_grads, python_grads):
        assert got.shape == want.shape and got.stride() == want.stride() and torch.equal(got, want)


STRIDED = [((8, 256, 28, 28), (256, 3, 3), 2, 1, 1), ((8, 256, 28, 28), (512, 1, 1), 2, 0, 1),
           ((2, 64, 15, 17), (64, 3, 3), 3, 1, 1)]  # nine phases: three launches, replayed in turn


@pytest.mark.parametrize("case", STRIDED, ids=["3x3-stride2", "1x1-stride2", "3x3-stride3"])
def test_a_strided_conv_trains_in_cpp_with_the_same_bits(host, case):
    # The light dgrad runs a strided dgrad's phases (zeros included) in one launch a call: a pure launch, which
    # the Recording keeps, so the layer's training call runs in C++ like any other (it stayed in Python, whole,
    # while the phases ran on side streams with their taps copied and dx zeroed through torch).
    _python_then_cpp(case, torch.bfloat16, False)


@pytest.mark.parametrize("case", [((8, 256, 28, 28), (256, 3, 3), 2, 1, 1), ((8, 256, 28, 28), (512, 1, 1), 2, 0, 1)],
                         ids=["3x3-stride2", "1x1-stride2"])
def test_a_strided_layer_runs_in_cpp_in_inference_on_new_tensors(host, case):
    # Recorded on one set of tensors, replayed on another (new addresses and values): the Python path's bits on
    # the new tensors.
    recorded, geometry = _leaves(case, torch.bfloat16, False, seed=3)
    fresh, _ = _leaves(case, torch.bfloat16, False, seed=4)
    x, w = (t.detach() for t in fresh[:2])
    with torch.no_grad():
        jitops.conv2d(recorded[0].detach(), recorded[1].detach(), None, *geometry)  # offers the fprop
        before = native.counters()["native_calls"]
        cpp_y = jitops.conv2d(x, w, None, *geometry)
        assert native.counters()["native_calls"] == before + 1
        with jitops.config.scope(log_level=jitops.config.log_level):  # a new generation: the Python path
            python_y = jitops.conv2d(x, w, None, *geometry)
    assert torch.equal(cpp_y, python_y)


def test_inference_runs_in_cpp(host):
    leaves, geometry = _leaves(LAYERS[0], torch.bfloat16, False, seed=2)
    x, w, _ = (t.detach() if t is not None else None for t in leaves)
    with torch.no_grad():
        python_y = jitops.conv2d(x, w, None, *geometry)
        before = native.counters()["native_calls"]
        cpp_y = jitops.conv2d(x, w, None, *geometry)
    assert native.counters()["native_calls"] == before + 1
    assert torch.equal(cpp_y, python_y)


def test_cpp_path_captures_into_a_cuda_graph(host):
    leaves, geometry = _leaves(LAYERS[0], torch.bfloat16, False, seed=3)
    with torch.no_grad():
        grad_out = torch.randn_like(jitops.conv2d(*leaves, *geometry))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # the Python path offers; the C++ path runs
            eager_y, eager_grads = _step(leaves, geometry, grad_out)
    torch.cuda.current_stream().wait_stream(stream)
    for t in leaves[:2]:
        t.grad = None
    graph = torch.cuda.CUDAGraph()
    before = native.counters()["native_calls"]
    with torch.cuda.graph(graph):
        y = jitops.conv2d(*leaves, *geometry)
        y.backward(grad_out)
    assert native.counters()["native_calls"] == before + 1
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, eager_y)
    for got, want in zip((leaves[0].grad, leaves[1].grad), eager_grads):
        assert torch.equal(got, want)
