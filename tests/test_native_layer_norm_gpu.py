"""jitops.layer_norm on the C++ host path (jitops/native.py, kernels/host/layer_norm.h) on a real GPU: a first call
on the Python path records and offers its launches; the same call then runs in C++ and gives the same bits,
forward, backward and without gradients, over every backward kernel sequence (rows in registers, few rows, one
row, rows too long for a block), with and without weight and bias, frozen parameters, unaligned pointers; it
captures into a CUDA graph; and calls it does not cover go back to Python."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import jitops
from jitops import native
from native_helpers import check_cuda_graph_capture, loaded_host_path

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def host():
    return loaded_host_path()


def _leaves(lead, n, dtype, weight, bias, seed=0, grads=(True, True, True), offset=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    rows = 1
    for size in lead:
        rows *= size
    # `offset` elements into a flat buffer: a pointer off 16-byte alignment (another vector width)
    x = torch.randn(rows * n + offset, generator=g)[offset:].view(*lead, n).to("cuda", dtype)
    if offset:
        flat = torch.empty(rows * n + offset, device="cuda", dtype=dtype)
        x = flat[offset:].view(*lead, n).copy_(x)
    x.requires_grad_(grads[0])
    w = (1 + 0.1 * torch.randn(n, generator=g)).to("cuda", dtype).requires_grad_(grads[1]) if weight else None
    b = (0.1 * torch.randn(n, generator=g)).to("cuda", dtype).requires_grad_(grads[2]) if bias else None
    return x, w, b


def _step(x, w, b, grad_out):
    leaves = [t for t in (x, w, b) if t is not None and t.requires_grad]
    for t in leaves:
        t.grad = None
    y = jitops.layer_norm(x, (x.shape[-1],), w, b, 1e-5)
    y.backward(grad_out)
    return y.detach().clone(), [t.grad.clone() for t in leaves]


CASES = [  # lead, n, dtype, weight, bias: one per kind of backward launch sequence
    ((4, 96), 768, torch.bfloat16, True, True),      # many rows, dweight/dbias from registers
    ((8, 512), 1024, torch.float16, True, True),
    ((48,), 768, torch.float32, True, True),         # few rows: the column-sum kernel
    ((1,), 1024, torch.bfloat16, True, True),        # one row: one block writes dweight/dbias itself
    ((96,), 24576, torch.bfloat16, True, True),      # rows too long for a block: the column kernel
    ((16, 33), 1001, torch.float32, True, False),    # odd n: 1-element vectors
    ((2, 64), 256, torch.float64, False, False),     # no parameters
]


@pytest.mark.parametrize("lead,n,dtype,weight,bias", CASES)
def test_second_call_runs_in_cpp_with_the_same_bits(host, lead, n, dtype, weight, bias):
    x, w, b = _leaves(lead, n, dtype, weight, bias)
    grad_out = torch.randn(*lead, n, device="cuda", dtype=dtype)
    python_y, python_grads = _step(x, w, b, grad_out)   # records and offers the forward and the backward
    before = native.counters()["native_calls"]
    cpp_y, cpp_grads = _step(x, w, b, grad_out)
    assert native.counters()["native_calls"] == before + 1
    assert torch.equal(cpp_y, python_y)
    for got, want in zip(cpp_grads, python_grads):
        assert got.shape == want.shape and torch.equal(got, want)
    reference = F.layer_norm(x.detach().double(), (n,), w.detach().double() if w is not None else None,
                             b.detach().double() if b is not None else None, 1e-5)
    tolerance = {torch.float64: 1e-10, torch.float32: 1e-5}.get(dtype, 2e-2)
    torch.testing.assert_close(cpp_y.double(), reference, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("grads", [(True, False, False), (False, True, True), (True, True, False)])
def test_frozen_inputs_get_no_gradient(host, grads):
    x, w, b = _leaves((64,), 768, torch.bfloat16, True, True, seed=1, grads=grads)
    grad_out = torch.randn(64, 768, device="cuda", dtype=torch.bfloat16)
    python_y, python_grads = _step(x, w, b, grad_out)
    before = native.counters()["native_calls"]
    cpp_y, cpp_grads = _step(x, w, b, grad_out)
    assert native.counters()["native_calls"] == before + 1
    assert torch.equal(cpp_y, python_y)
    assert len(cpp_grads) == sum(grads)
    for got, want in zip(cpp_grads, python_grads):
        assert torch.equal(got, want)
    for t, wanted in zip((x, w, b), grads):
        assert (t.grad is not None) == wanted


def test_an_unaligned_input_is_its_own_problem(host):
    aligned = _leaves((32,), 1024, torch.bfloat16, True, True, seed=2)
    shifted = _leaves((32,), 1024, torch.bfloat16, True, True, seed=2, offset=1)   # 2 bytes off: 1-element vectors
    grad_out = torch.randn(32, 1024, device="cuda", dtype=torch.bfloat16)
    _step(*aligned, grad_out)
    python_y, python_grads = _step(*shifted, grad_out)
    before = native.counters()["native_calls"]
    cpp_y, cpp_grads = _step(*shifted, grad_out)
    assert native.counters()["native_calls"] == before + 1
    assert torch.equal(cpp_y, python_y)
    for got, want in zip(cpp_grads, python_grads):
        assert torch.equal(got, want)


def test_inference_runs_in_cpp(host):
    x, w, b = (t.detach() for t in _leaves((8, 197), 768, torch.bfloat16, True, True, seed=3))
    with torch.no_grad():
        python_y = jitops.layer_norm(x, (768,), w, b)
        before = native.counters()["native_calls"]
        cpp_y = jitops.layer_norm(x, (768,), w, b)
    assert native.counters()["native_calls"] == before + 1
    assert torch.equal(cpp_y, python_y)


def test_calls_it_does_not_cover_take_the_python_path(host):
    x, w, b = (t.detach() for t in _leaves((16, 64), 256, torch.bfloat16, True, True, seed=4))
    jitops.layer_norm(x, (256,), w, b)
    jitops.layer_norm(x, (256,), w, b)
    before = native.counters()
    strided = x.transpose(0, 1)                         # not contiguous
    torch.testing.assert_close(jitops.layer_norm(strided, (256,), w, b), F.layer_norm(strided, (256,), w, b),
                               atol=2e-2, rtol=2e-2)
    two_dims = jitops.layer_norm(x, (64, 256))          # two normalized dimensions: never asked
    torch.testing.assert_close(two_dims, F.layer_norm(x, (64, 256)), atol=2e-2, rtol=2e-2)
    with jitops.config.scope(progress_seconds=5.0):     # another config generation: Python, then offered again
        jitops.layer_norm(x, (256,), w, b)
    after = native.counters()
    assert after["native_calls"] == before["native_calls"]
    assert after["native_misses"] >= before["native_misses"] + 2


def test_cpp_path_captures_into_a_cuda_graph(host):
    x, w, b = _leaves((4, 64), 768, torch.bfloat16, True, True, seed=5)
    grad_out = torch.randn(4, 64, 768, device="cuda", dtype=torch.bfloat16)
    check_cuda_graph_capture(lambda: jitops.layer_norm(x, (768,), w, b), [x, w, b], grad_out)


def test_patched_layer_norm_steps_run_in_cpp(host):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.LayerNorm(256), torch.nn.Linear(256, 256), torch.nn.LayerNorm(256))
    model = model.to("cuda", torch.bfloat16)
    jitops.patch(model, ops=("layer_norm",))
    x = torch.randn(32, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    model(x).float().square().mean().backward()
    before = native.counters()["native_calls"]
    model(x).float().square().mean().backward()
    assert native.counters()["native_calls"] == before + 2
