"""jitops.linear's C++ host path (jitops/native.py, kernels/host/host_path.cpp) on a real GPU: after a first
call on the Python path offers its problems, the same calls run in C++ and give the same bits, forward and
backward, for nn.Linear and Conv1D-style weights; a config scope sends calls back to Python until they are
offered again; the C++ path captures into a CUDA graph."""
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
    return loaded_host_path("the light GEMM kernel is sm_90a")


def _leaves(lead, k, n, dtype, bias, transposed, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(*lead, k, generator=g).to("cuda", dtype).requires_grad_()
    stored = (torch.randn(k, n, generator=g) / k ** 0.5).to("cuda", dtype)
    w = stored if transposed else stored.t().contiguous()
    w.requires_grad_()
    b = torch.randn(n, generator=g).to("cuda", dtype).requires_grad_() if bias else None
    return x, w, b


def _step(x, w, b, transposed, grad_out):
    for t in (x, w, b):
        if t is not None:
            t.grad = None
    y = jitops.linear(x, w.t() if transposed else w, b)
    y.backward(grad_out)
    return y.detach().clone(), [t.grad.clone() for t in (x, w, b) if t is not None]


def _python_then_cpp(step):
    """step() twice: the first call runs on the Python path, which offers its problems; the second runs in C++
    (one native call) and gives the same bits, output and gradients.  The second's output."""
    python_y, python_grads = step()
    before = native.counters()["native_calls"]
    cpp_y, cpp_grads = step()
    assert native.counters()["native_calls"] == before + 1
    assert torch.equal(cpp_y, python_y)
    for got, want in zip(cpp_grads, python_grads):
        assert got.shape == want.shape and torch.equal(got, want)
    return cpp_y


@pytest.mark.parametrize("lead,k,n,dtype,bias,transposed", [
    ((4, 96), 256, 512, torch.bfloat16, True, False),
    ((384,), 256, 512, torch.float16, False, False),
    ((8, 64), 256, 768, torch.bfloat16, True, True),     # transformers' Conv1D: weight stored (K, N)
    ((1,), 256, 512, torch.bfloat16, True, False),       # one row
])
def test_second_call_runs_in_cpp_with_the_same_bits(host, lead, k, n, dtype, bias, transposed):
    x, w, b = _leaves(lead, k, n, dtype, bias, transposed)
    grad_out = torch.randn(*lead, n, device="cuda", dtype=dtype)
    cpp_y = _python_then_cpp(lambda: _step(x, w, b, transposed, grad_out))  # offers forward, dx and dweight
    if transposed:  # the gradient in the parameter's own (K, N) layout, no copy into place
        assert w.grad.is_contiguous()
    reference = F.linear(x.detach().float(), (w.t() if transposed else w).detach().float(),
                         b.detach().float() if b is not None else None)
    torch.testing.assert_close(cpp_y.float(), reference, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("lead,n,dtype,bias", [
    ((4, 96), 1001, torch.bfloat16, False),   # a width that is not a multiple of 8: GPT-2's 50257-wide head
    ((200,), 250, torch.float16, True),
])
def test_an_unaligned_width_runs_in_cpp_with_the_same_bits(host, lead, n, dtype, bias):
    """A Linear of N % 8 != 0 runs padded (the weight's N rows read as N8, dy padded to N8 columns, the output's
    first N columns copied out): the C++ node makes the Python path's padded operands (its copies through the
    driver) around the same offered GEMMs, so the same bits; a call without a gradient too.  The first step loads
    the input gradient's kernel for the unpadded weight (Op.load), so the second runs in C++."""
    x, w, b = _leaves(lead, 256, n, dtype, bias, False)
    grad_out = torch.randn(*lead, n, device="cuda", dtype=dtype)
    cpp_y = _python_then_cpp(lambda: _step(x, w, b, False, grad_out))
    reference = F.linear(x.detach().float(), w.detach().float(), b.detach().float() if b is not None else None)
    torch.testing.assert_close(cpp_y.float(), reference, atol=2e-2, rtol=2e-2)
    with torch.no_grad():
        before = native.counters()["native_calls"]
        y = jitops.linear(x, w, b)
        assert native.counters()["native_calls"] == before + 1 and torch.equal(y, cpp_y)


@pytest.mark.parametrize("transposed", [False, True])
def test_a_strided_row_view_runs_in_cpp_with_the_same_bits(host, transposed):
    """A classifier's input x[:, 0] (the class token of each sequence, timm's ViT head: rows 197 * 768 apart) is
    read in place with its row stride, on the Python path and in C++ alike; it was the patched ViT-B/16 step's one
    call a step that C++ handed back to Python.  Forward and backward, the same bits."""
    g = torch.Generator(device="cpu").manual_seed(3)
    tokens = torch.randn(32, 197, 768, generator=g).to("cuda", torch.bfloat16).requires_grad_()
    stored = (torch.randn(768, 1000, generator=g) / 768 ** 0.5).to("cuda", torch.bfloat16)
    w = (stored if transposed else stored.t().contiguous()).requires_grad_()
    b = torch.randn(1000, generator=g).to("cuda", torch.bfloat16).requires_grad_()
    grad_out = torch.randn(32, 1000, device="cuda", dtype=torch.bfloat16)

    def step():
        for t in (tokens, w, b):
            t.grad = None
        x = tokens[:, 0]
        assert not x.is_contiguous() and x.stride() == (197 * 768, 1)
        y = jitops.linear(x, w.t() if transposed else w, b)
        y.backward(grad_out)
        return y.detach().clone(), [t.grad.clone() for t in (tokens, w, b)]

    cpp_y = _python_then_cpp(step)  # offers the forward, dx and dweight at x's row stride
    reference = F.linear(tokens[:, 0].detach().float(), (w.t() if transposed else w).detach().float(),
                         b.detach().float())
    torch.testing.assert_close(cpp_y.float(), reference, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("activation,bias", [("gelu", True), ("gelu_tanh", True), ("gelu_tanh", False)])
def test_training_linear_with_its_gelu_runs_in_cpp_with_the_same_bits(host, activation, bias):
    x, w, b = _leaves((4, 64), 256, 768, torch.bfloat16, bias, False, seed=4)
    grad_out = torch.randn(4, 64, 768, device="cuda", dtype=torch.bfloat16)

    def step():
        for t in (x, w, b):
            if t is not None:
                t.grad = None
        y = jitops.linear(x, w, b, activation=activation)
        y.backward(grad_out)
        return y.detach().clone(), [t.grad.clone() for t in (x, w, b) if t is not None]

    cpp_y = _python_then_cpp(step)  # the GEMM, then jitops.gelu: each offers its kernels
    approximate = "tanh" if activation == "gelu_tanh" else "none"
    reference = F.gelu(F.linear(x.detach().float(), w.detach().float(), b.detach().float() if bias else None),
                       approximate=approximate)
    torch.testing.assert_close(cpp_y.float(), reference, atol=3e-2, rtol=2e-2)


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "relu"])
def test_inference_with_a_fused_activation(host, activation):
    x, w, b = (t.detach() for t in _leaves((2, 128), 256, 512, torch.bfloat16, True, False, seed=1))
    with torch.no_grad():
        python_y = jitops.linear(x, w, b, activation=activation)
        before = native.counters()["native_calls"]
        cpp_y = jitops.linear(x, w, b, activation=activation)
        assert native.counters()["native_calls"] == before + 1
        assert torch.equal(cpp_y, python_y)
        cpp_no_bias = jitops.linear(x, w, None, activation=activation)   # the same fused kernel, no bias
        with jitops.config.scope(native_host=False):
            python_no_bias = jitops.linear(x, w, None, activation=activation)
    assert torch.equal(cpp_no_bias, python_no_bias)


def test_a_config_scope_sends_calls_back_to_python_until_offered_again(host):
    x, w, b = (t.detach() for t in _leaves((64,), 128, 256, torch.bfloat16, True, False, seed=2))
    jitops.linear(x, w, b)
    before = native.counters()
    with jitops.config.scope(progress_seconds=5.0):   # any scope: another config generation
        jitops.linear(x, w, b)                        # Python, offered again under this generation
        jitops.linear(x, w, b)                        # C++
    after = native.counters()
    assert after["native_misses"] >= before["native_misses"] + 1
    assert after["native_calls"] == before["native_calls"] + 1


@pytest.mark.parametrize("n,bias", [(512, True), (1001, False), (250, True)])
def test_cpp_path_captures_into_a_cuda_graph(host, n, bias):
    """An unaligned width (1001, 250) too: the padded node's output copy and dy's pad are driver calls
    (cuMemcpy2DAsync, cuMemsetD2D16Async), captured with its GEMMs."""
    x, w, b = _leaves((4, 64), 256, n, torch.bfloat16, bias, False, seed=3)
    grad_out = torch.randn(4, 64, n, device="cuda", dtype=torch.bfloat16)
    check_cuda_graph_capture(lambda: jitops.linear(x, w, b), [t for t in (x, w, b) if t is not None], grad_out)


def test_patched_module_steps_run_in_cpp(host):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
    model = model.to("cuda", torch.bfloat16)
    jitops.patch(model, ops=("linear",))
    x = torch.randn(32, 256, device="cuda", dtype=torch.bfloat16)
    model(x).float().square().mean().backward()
    before = native.counters()["native_calls"]
    model(x).float().square().mean().backward()
    assert native.counters()["native_calls"] == before + 2


@pytest.mark.parametrize("native_host", [False, True], ids=["python path", "cpp path"])
def test_split_graphs_replayed_at_once_keep_their_own_counters(host, native_host):
    """Two CUDA graphs of split GEMMs (16 x 4096 x 4096: 32 tiles, each split four ways), both captured on
    torch.cuda.graph's one capture stream, replayed at the same time on two streams, 20 rounds: each graph counts
    its splits on counters of its own, zeroed on every replay, so every output gets the eager bits.  (With one
    counter buffer a capture stream, the graphs' splits counted on the same counters, and a tile could be summed
    before its slices were written, or never.)"""
    launches = 12
    g = torch.Generator(device="cpu").manual_seed(5)
    xs = [torch.randn(16, 4096, generator=g).to("cuda", torch.bfloat16) for _ in range(2)]
    w = (torch.randn(4096, 4096, generator=g) / 64).to("cuda", torch.bfloat16)
    with jitops.config.scope(native_host=native_host):
        want = [jitops.linear(x, w) for x in xs]  # the Python path, which offers the problem
        assert all(torch.equal(jitops.linear(x, w), y) for x, y in zip(xs, want))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm the capture stream's allocator state, as torch's docs advise
            jitops.linear(xs[0], w)
        torch.cuda.current_stream().wait_stream(side)
        graphs, outs = [], []
        before = native.counters()["native_calls"]
        for x in xs:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outs.append([jitops.linear(x, w) for _ in range(launches)])
            graphs.append(graph)
        assert native.counters()["native_calls"] - before == (2 * launches if native_host else 0)
    streams = [torch.cuda.Stream() for _ in graphs]
    for _ in range(20):
        for ys in outs:  # a tile the replay leaves unwritten must not keep the last round's bits
            for y in ys:
                y.zero_()
        for graph, stream in zip(graphs, streams):
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                graph.replay()
        for stream in streams:
            torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        for ys, expected in zip(outs, want):
            assert all(torch.equal(y, expected) for y in ys)
