"""jitops.rms_norm on the GPU: every dtype against torch's F.rms_norm in float64, forward and backward, over
hidden sizes that take every backward strategy (dweight in registers, in shared memory, in the column kernel,
few rows), non-contiguous inputs, gradcheck in float64, torch.compile; and on the C++ host path: the second call
runs in C++ with the Python path's bits, a LayerNorm of the same shape never replays an RMS recording, and the C++
path's forward and backward capture into a CUDA graph."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import jitops
from jitops import native
from jitops.testing import check_op
from native_helpers import check_cuda_graph_capture, loaded_host_path
from test_rms_norm import reference, samples_over

pytestmark = pytest.mark.gpu
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
# (x shape, normalized_shape): 1, 7, odd 1001, Llama's 1024 and 4096, rows too long for a block, two trailing
# dims, few rows, no rows.
CASES = [((3, 1), [1]), ((9, 7), [7]), ((33, 1001), [1001]), ((300, 1024), [1024]), ((70, 4096), [4096]),
         ((100, 65536), [65536]), ((2, 3, 4, 50), [4, 50]), ((40, 2048), [2048]), ((0, 64), [64])]


def samples(dtype, device):
    return samples_over(CASES, dtype, device)


def test_rms_norm_cuda_all_dtypes():
    report = check_op(jitops.rms_norm, reference, samples=samples, dtypes=DTYPES, device="cuda", opcheck=False)
    assert len(report.checked) > 100


def test_rms_norm_cuda_compile_and_ops_opcheck():
    def few(dtype, device):
        return [samples(dtype, device)[i] for i in (2, 1, 6)]

    check_op(jitops.rms_norm, reference, samples=few, dtypes=[torch.bfloat16], device="cuda", compile=True,
             opcheck=False, noncontiguous_inputs=False)
    x = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    torch.library.opcheck(jitops.layer_norm_forward.op.overload, (x, [1024], w, None, 1e-6, True))


@pytest.fixture(scope="module")
def host():
    return loaded_host_path()


def _step(fn, x, w, grad_out):
    x.grad = w.grad = None
    y = fn(x, w)
    y.backward(grad_out)
    return y.detach().clone(), x.grad.clone(), w.grad.clone()


@pytest.mark.parametrize("rows, n, dtype", [(4096, 1024, torch.bfloat16), (48, 768, torch.float32),
                                            (96, 24576, torch.bfloat16)])
def test_second_call_runs_in_cpp_with_the_same_bits(host, rows, n, dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(rows, n, generator=g).to("cuda", dtype).requires_grad_()
    w = (1 + 0.1 * torch.randn(n, generator=g)).to("cuda", dtype).requires_grad_()
    grad_out = torch.randn(rows, n, generator=g).to("cuda", dtype)
    rms = lambda x, w: jitops.rms_norm(x, [n], w, 1e-6)  # noqa: E731
    python = _step(rms, x, w, grad_out)
    before = native.counters()["native_calls"]
    cpp = _step(rms, x, w, grad_out)
    assert native.counters()["native_calls"] == before + 1
    for got, want in zip(cpp, python):
        assert torch.equal(got, want)
    torch.testing.assert_close(cpp[0].double(), F.rms_norm(x.detach().double(), [n], w.detach().double(), 1e-6),
                               atol=2e-2 if dtype != torch.float32 else 1e-5, rtol=2e-2)
    # Same shape, dtype, weight, no bias, same eps: a LayerNorm, recorded apart from the RMS norm.
    ln = lambda x, w: jitops.layer_norm(x, [n], w, None, 1e-6)  # noqa: E731
    for _ in range(2):
        y, dx, dw = _step(ln, x, w, grad_out)
        torch.testing.assert_close(y.double(), F.layer_norm(x.detach().double(), [n], w.detach().double(), None,
                                                            1e-6), atol=2e-2 if dtype != torch.float32 else 1e-5,
                                   rtol=2e-2)
    with torch.no_grad():
        before = native.counters()["native_calls"]
        first = jitops.rms_norm(x, [n], w, 1e-6)
        assert torch.equal(jitops.rms_norm(x, [n], w, 1e-6), first)
        assert native.counters()["native_calls"] >= before + 1
        assert torch.equal(first, python[0])


def test_cpp_path_captures_into_a_cuda_graph(host):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 64, 1024, generator=g).to("cuda", torch.bfloat16).requires_grad_()
    w = (1 + 0.1 * torch.randn(1024, generator=g)).to("cuda", torch.bfloat16).requires_grad_()
    grad_out = torch.randn(4, 64, 1024, generator=g).to("cuda", torch.bfloat16)
    check_cuda_graph_capture(lambda: jitops.rms_norm(x, (1024,), w, 1e-6), [x, w], grad_out)
