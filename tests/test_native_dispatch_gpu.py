"""jitops' ops through torch's dispatcher on the C++ host path (kernels/host/dispatch.h) on a real GPU: a first
call through torch.ops runs the Python implementation, which offers its problem; the same call then runs in C++
(counted) and gives the same bits.  Covers gemm over operand layouts, bias and activations; linear; gelu and its
backward; layer_norm's forward, inference and backward; conv2d's three operators; a torch.compile'd patched block,
forward and backward, whose second step runs every jitops call in C++, and a compiled patched conv net; calls
under a new config scope, which go back to Python; and calls the tables do not hold (float32, unaligned, CPU),
which pass on."""
from __future__ import annotations

import copy

import pytest
import torch

import jitops
from jitops import native
from native_helpers import loaded_host_path

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def host():
    return loaded_host_path("the light GEMM kernel is sm_90a")


def _twice(call):
    """call() on the Python path (which offers), then again: (first result, second result, C++ calls made by the
    second)."""
    first = call()
    torch.cuda.synchronize()
    before = native.counters()["native_calls"]
    second = call()
    torch.cuda.synchronize()
    return first, second, native.counters()["native_calls"] - before


def _same(first, second):
    if isinstance(first, torch.Tensor):
        first, second = (first,), (second,)
    for a, b in zip(first, second):
        assert a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype
        assert torch.equal(a, b)


def _matrix(rows, cols, dtype, column_major=False, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    if column_major:
        return torch.randn(cols, rows, generator=g).to("cuda", dtype).t()
    return torch.randn(rows, cols, generator=g).to("cuda", dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("a_col,b_col", [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize("bias,activation", [(False, None), (True, None), (True, "gelu_tanh"), (False, "relu")])
def test_gemm_runs_in_cpp_with_the_same_bits(host, dtype, a_col, b_col, bias, activation):
    a = _matrix(256, 192, dtype, a_col, 1)
    b = _matrix(192, 320, dtype, b_col, 2)
    c = _matrix(1, 320, dtype, seed=3).view(320) if bias else None
    first, second, calls = _twice(lambda: torch.ops.jitops.gemm(a, b, c, activation))
    _same(first, second)
    assert calls == 1


def test_linear_runs_in_cpp_with_the_same_bits(host):
    x = _matrix(2 * 96, 256, torch.bfloat16, seed=4).view(2, 96, 256)
    w = _matrix(512, 256, torch.bfloat16, seed=5)
    conv1d_w = _matrix(256, 512, torch.bfloat16, seed=6).t()  # transformers' Conv1D weight, read transposed
    b = _matrix(1, 512, torch.bfloat16, seed=7).view(512)
    for weight in (w, conv1d_w):
        first, second, calls = _twice(lambda: torch.ops.jitops.linear(x, weight, b))
        _same(first, second)
        assert calls == 1


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("offset", [0, 2])
def test_gelu_and_its_backward_run_in_cpp_with_the_same_bits(host, approximate, offset):
    flat = _matrix(1, 4096 * 8 + offset, torch.float16, seed=8).view(-1)
    x = flat[offset:].view(4096, 8)  # offset 2: 4-byte alignment, narrower vectors
    grad = _matrix(4096, 8, torch.float16, seed=9)
    first, second, calls = _twice(lambda: torch.ops.jitops.gelu(x, approximate))
    _same(first, second)
    assert calls == 1
    first, second, calls = _twice(lambda: torch.ops.jitops.gelu_backward(grad, x, approximate))
    _same(first, second)
    assert calls == 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("params", [True, False])
def test_layer_norm_stages_run_in_cpp_with_the_same_bits(host, dtype, params):
    x = _matrix(8 * 128, 768, dtype, seed=10).view(8, 128, 768)
    w = (1 + 0.1 * _matrix(1, 768, dtype, seed=11)).view(768) if params else None
    b = (0.1 * _matrix(1, 768, dtype, seed=12)).view(768) if params else None
    grad = _matrix(8 * 128, 768, dtype, seed=13).view(8, 128, 768)
    first, second, calls = _twice(lambda: torch.ops.jitops.layer_norm_forward(x, [768], w, b, 1e-5))
    _same(first, second)
    assert calls == 1
    stats = first[1]
    first, second, calls = _twice(lambda: torch.ops.jitops.layer_norm_inference(x, [768], w, b, 1e-5))
    _same(first, second)
    assert calls == 1
    for needs in ((True, params, params), (False, params, params), (True, False, False)):
        first, second, calls = _twice(lambda: torch.ops.jitops.layer_norm_backward(grad, x, stats, w, [768], *needs))
        _same(first, second)
        assert calls == 1


def test_calls_the_tables_do_not_hold_pass_on_to_python(host):
    a32, b32 = _matrix(64, 64, torch.float32), _matrix(64, 64, torch.float32, seed=1)
    flat = _matrix(1, 64 * 64 + 1, torch.bfloat16).view(-1)
    unaligned = flat[1:].view(64, 64)  # 2-byte aligned: not the offered problem's kernel
    aligned = _matrix(64, 64, torch.bfloat16, seed=2)
    cases = [
        (lambda: torch.ops.jitops.gemm(a32, b32), lambda: a32 @ b32),
        (lambda: torch.ops.jitops.gemm(unaligned, aligned), lambda: (unaligned.float() @ aligned.float())),
        (lambda: torch.ops.jitops.gemm(a32.cpu(), b32.cpu()), lambda: a32.cpu() @ b32.cpu()),
    ]
    torch.ops.jitops.gemm(aligned, aligned)  # offered: (64, 64, 64) row-major
    for call, reference in cases:
        before = native.counters()["native_calls"]
        for _ in range(2):
            got = call()
        assert native.counters()["native_calls"] == before
        torch.testing.assert_close(got.float(), reference().float(), atol=0.1, rtol=0.02)


def test_a_new_config_scope_sends_calls_back_to_python_until_offered_again(host):
    a, b = _matrix(128, 128, torch.bfloat16), _matrix(128, 128, torch.bfloat16, seed=1)
    _twice(lambda: torch.ops.jitops.gemm(a, b))
    with jitops.config.scope(log_level=jitops.config.log_level):  # any scope: a new generation
        before = native.counters()
        torch.ops.jitops.gemm(a, b)
        after = native.counters()
        assert after["native_calls"] == before["native_calls"]  # stale tables: Python, which offers again
        assert after["native_misses"] == before["native_misses"] + 1
        _, _, calls = _twice(lambda: torch.ops.jitops.gemm(a, b))
        assert calls == 1


class _Block(torch.nn.Module):
    """A GPT-2 MLP block: LayerNorm, Linear, GELU (tanh), Linear, residual."""

    def __init__(self, width):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.act = torch.nn.GELU(approximate="tanh")
        self.down = torch.nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(self.act(self.up(self.norm(x))))


def _training_step(model, x, grad, parameters):
    """One forward and backward of `model` from the leaf x with this output gradient: the output, then x's and
    `parameters`' gradients, cloned."""
    for p in (x, *parameters):
        p.grad = None
    y = model(x)
    y.backward(grad)
    torch.cuda.synchronize()
    return [y.detach().clone(), x.grad.clone(), *(p.grad.clone() for p in parameters)]


def test_a_compiled_patched_block_runs_every_jitops_call_in_cpp(host):
    torch.manual_seed(0)
    block = _Block(256).to("cuda", torch.bfloat16)
    jitops.patch(block)
    compiled = torch.compile(block, fullgraph=True)
    x = torch.randn(4, 64, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(4, 64, 256, device="cuda", dtype=torch.bfloat16)

    parameters = list(block.parameters())
    first = _training_step(compiled, x, grad, parameters)  # compiles the graph; the Python path offers every problem
    before = native.counters()
    second = _training_step(compiled, x, grad, parameters)
    after = native.counters()
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    # Forward: LayerNorm, Linear, GELU, Linear; backward: two GEMMs per Linear, GELU's and LayerNorm's.
    assert after["native_calls"] - before["native_calls"] >= 8
    assert after["native_misses"] == before["native_misses"]


def _channels_last(*size, scale=1.0, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    t = (torch.randn(*size, generator=g) * scale).to("cuda", torch.bfloat16)
    return t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t


def test_conv2d_operators_run_in_cpp_with_the_same_bits(host):
    x, w, b = _channels_last(4, 64, 14, 14), _channels_last(128, 64, 3, 3, scale=0.1, seed=1), _channels_last(128)
    geometry = ([1, 1], [1, 1], [1, 1])
    first, second, calls = _twice(lambda: torch.ops.jitops.conv2d(x, w, b, *geometry))
    _same(first, second)
    assert calls == 1
    dy = _channels_last(*first.shape, seed=2)
    for call in (lambda: torch.ops.jitops.conv2d_input_grad(dy, w, list(x.shape), *geometry),
                 lambda: torch.ops.jitops.conv2d_weight_grad(dy, x, list(w.shape), *geometry)):
        first, second, calls = _twice(call)
        _same(first, second)
        assert calls == 1
    # the recipes were recorded with channels_last operands: an NCHW x passes on to Python
    before = native.counters()
    torch.ops.jitops.conv2d(x.contiguous(), w, b, *geometry)
    after = native.counters()
    assert after["native_calls"] == before["native_calls"] and after["native_misses"] == before["native_misses"] + 1


# (N, C, H, W), (K, R, S), stride, padding, and which of fprop, dgrad, wgrad the Python path offers: a strided
# dgrad is one launch of the light kernel (its phases in the kernel), the stem's wgrad unfolds its slices into dw
# in one kernel (kernels/conv/wgrad_unfold.cu), its dgrad copies through torch (padded channels).
REPLAYED = {"3x3": (((4, 64, 14, 14), (128, 3, 3), 1, 1), (1, 1, 1)),
            "3x3-stride2": (((8, 64, 28, 28), (128, 3, 3), 2, 1), (1, 1, 1)),
            "1x1-stride2": (((32, 256, 56, 56), (512, 1, 1), 2, 0), (1, 1, 1)),  # ResNet-50's first downsample
            "stem": (((8, 3, 64, 64), (64, 7, 7), 2, 3), (1, 0, 1))}            # 3 channels: im2col matrix


@pytest.mark.parametrize("name", list(REPLAYED))
def test_conv2d_operators_replay_on_new_tensors(host, name):
    """Each operator recorded on one set of tensors and served in C++ on another (new addresses and values) gives
    the Python path's bits on the new ones.  The stem's fprop once read an uninitialised im2col matrix in every
    replay (a workspace passed through two views; native.encode), which trained a compiled ResNet-50 on garbage."""
    ((n, c, h, w), (k, r, s), stride, pad), offered = REPLAYED[name]
    geometry = ([stride] * 2, [pad] * 2, [1, 1])
    p, q = (h + 2 * pad - r) // stride + 1, (w + 2 * pad - s) // stride + 1

    def operands(seed):
        return (_channels_last(n, c, h, w, seed=seed), _channels_last(k, c, r, s, scale=0.1, seed=seed + 1),
                _channels_last(n, k, p, q, seed=seed + 2))

    calls = [lambda x, wt, dy: torch.ops.jitops.conv2d(x, wt, None, *geometry),
             lambda x, wt, dy: torch.ops.jitops.conv2d_input_grad(dy, wt, list(x.shape), *geometry),
             lambda x, wt, dy: torch.ops.jitops.conv2d_weight_grad(dy, x, list(wt.shape), *geometry)]
    recorded, fresh = operands(0), operands(10)  # both alive: the new tensors cannot reuse the recorded addresses
    for operator, call, expected in zip(("fprop", "dgrad", "wgrad"), calls, offered):
        call(*recorded)  # the Python path offers the operator's run
        before = native.counters()["native_calls"]
        got = call(*fresh)
        assert native.counters()["native_calls"] - before == expected, operator
        with jitops.config.scope(log_level=jitops.config.log_level):  # a new generation: the Python path
            want = call(*fresh)
        _same(got, want)


def test_a_compiled_patched_conv_net_trains_as_eager(host):
    """torch.compile'd conv layers, strided and not: once offered, every operator runs in C++ through the
    dispatcher, and the step's output and gradients stay those of the unpatched eager model."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.Conv2d(64, 128, 3, stride=2, padding=1, bias=False), torch.nn.ReLU(),
                              torch.nn.Conv2d(128, 128, 1)).to("cuda", torch.bfloat16)
    net = net.to(memory_format=torch.channels_last)
    reference = copy.deepcopy(net)
    jitops.patch(net)
    compiled = torch.compile(net)
    x = _channels_last(8, 64, 28, 28, seed=3).requires_grad_(True)
    grad = _channels_last(8, 128, 14, 14, seed=4)

    parameters = list(net.parameters())
    first = _training_step(compiled, x, grad, parameters)  # compiles; the Python path offers the operators
    before = native.counters()["native_calls"]
    got = _training_step(compiled, x, grad, parameters)
    assert native.counters()["native_calls"] - before >= 9  # 3 fprops, 3 wgrads, 3 dgrads (the strided one too)
    for have, python in zip(got, first):  # the same kernels replayed: the same bits
        assert torch.equal(have, python)
    # against cuDNN in eager mode: bf16 sums in another order (bench_models' check of a compiled ResNet-50, with
    # or without jitops: gradients within 3.5e-2)
    for have, want in zip(got, _training_step(reference, x, grad, list(reference.parameters()))):
        error = ((have.float() - want.float()).norm() / want.float().norm()).item()
        assert error < 5e-2, error


def test_profiled_calls_run_in_cpp(host):
    a, b = _matrix(128, 256, torch.bfloat16), _matrix(256, 128, torch.bfloat16, seed=1)
    want = jitops.gemm(a, b)
    before = native.counters()["native_calls"]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        got = jitops.gemm(a, b)  # the profiler routes the call through the dispatcher
    assert native.counters()["native_calls"] == before + 1
    assert torch.equal(got, want)
    assert any(e.name == "jitops::gemm" for e in profile.events())


def test_a_cuda_graph_captures_dispatched_calls(host):
    a, b = _matrix(256, 256, torch.bfloat16), _matrix(256, 256, torch.bfloat16, seed=1)
    call = lambda: torch.ops.jitops.layer_norm_inference(torch.ops.jitops.gemm(a, b), [256], None, None, 1e-5)  # noqa: E731
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            want = call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    before = native.counters()["native_calls"]
    with torch.cuda.graph(graph):
        got = call()
    assert native.counters()["native_calls"] == before + 2
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(got, want)
