"""The CUDA hot paths' Python, without a GPU: the short-path shape classes of gelu and layer_norm (a stand-in
tensor type that reports is_cuda) and the small-grid arithmetic of add's and layer_norm's CUDA run functions (CPU
tensors, a kernel that records its launch).  The GPU tests check the same paths against the general ones."""
from __future__ import annotations

import math

import pytest
import torch

from jitops.ops import gelu as gelu_module
from jitops.ops import layer_norm as ln
from jitops.ops import layer_norm_plan as ln_plan
from jitops.ops import layer_norm_run as ln_run
from jitops.ops import add as add_module
from jitops.launch import UNCAPPED_GRID  # noqa: E402


class CudaLike:
    """What the short paths read of a contiguous CUDA tensor, and nothing else."""

    is_cuda = True

    def __init__(self, shape, dtype, address):
        self.shape, self.dtype, self._address = torch.Size(shape), dtype, address

    def is_contiguous(self):
        return True

    def data_ptr(self):
        return self._address

    def numel(self):
        return math.prod(self.shape)


@pytest.mark.parametrize("address, vec", [(0x1000, 8), (0x1008, 4), (0x1004, 2), (0x1002, 1)])
def test_gelu_short_path_class(monkeypatch, address, vec):
    monkeypatch.setattr(gelu_module, "_Tensor", CudaLike)
    cls = gelu_module.shape_class(CudaLike((3, 5), torch.bfloat16, address), "tanh")
    assert cls == gelu_module.GeluClass(torch.bfloat16, vec, "tanh", "int")
    assert cls is gelu_module.shape_class(CudaLike((7,), torch.bfloat16, address), "tanh")  # remembered


@pytest.mark.parametrize("n, w_address, vec", [(1024, 0x2000, 8), (1024, 0x2004, 2), (1000, 0x2000, 8),
                                               (7, 0x2000, 1)])
def test_layer_norm_short_path_class(monkeypatch, n, w_address, vec):
    monkeypatch.setattr(ln, "_Tensor", CudaLike)
    x = CudaLike((4, n), torch.bfloat16, 0x1000)
    w, b = CudaLike((n,), torch.bfloat16, w_address), CudaLike((n,), torch.bfloat16, 0x3000)
    expected = ln_plan.forward_class(torch.bfloat16, n, vec, 4, "int")
    assert ln.shape_class(x, [n], w, b, 1e-5) == expected
    assert ln.shape_class(x, [n], None, None, 1e-5) == ln_plan.forward_class(torch.bfloat16, n, 8 if n % 8 == 0 else
                                                                        (1 if n % 2 else 2), 4, "int")


class Recorder:
    def __init__(self):
        self.calls = []

    def launch(self, grid, block, *args, shared_mem=0):
        self.calls.append((grid, block, args))


class FakeKernels:
    def __init__(self, shape_class, **names):
        self.shape_class = shape_class
        self.__dict__.update(names)


@pytest.mark.parametrize("n, grid", [(1, 1), (8, 1), (4 * 256 + 3, 1), (4 * 257, 2),
                                     (4 * 256 * UNCAPPED_GRID, UNCAPPED_GRID)])
def test_add_small_grids_skip_the_device_query(n, grid):
    """One block per 256 vectors (the kernel's grid-stride scalar loop takes the tail), launched as computed up to
    UNCAPPED_GRID blocks: no SM-count query, which on CPU tensors would fail."""
    forward = Recorder()
    a, b = torch.ones(n), torch.ones(n)
    out = add_module.run_cuda(FakeKernels(add_module.AddClass(torch.float32, 4, True), forward=forward), a, b)
    assert forward.calls[0][0] == grid and forward.calls[0][1] == add_module.BLOCK
    assert forward.calls[0][2][2] is out and forward.calls[0][2][3] == n


def test_layer_norm_run_launches_with_and_without_statistics():
    x, w = torch.randn(6, 64), torch.randn(64)
    cls = ln_plan.forward_class(torch.float32, 64, 4, 6, "int")
    forward = Recorder()
    kernels = FakeKernels(cls, forward=forward)
    y, stats = ln_run.run_cuda(kernels, x, [64], w, None, 1e-5)
    assert stats.shape == (2, 6) and y.shape == x.shape
    threads = max(cls.tpr, 128)
    assert forward.calls[0][:2] == (-(-6 // (threads // cls.tpr)), threads)
    y2 = ln.run_inference_cuda(kernels, x, [64], w, None, 1e-5)
    assert y2.shape == x.shape and forward.calls[1][2][4] is None  # no statistics pointer: the kernel skips them


# ---- jitops.add's general path: the shape class and run_cuda's launch, against a CPU emulation of the kernel -------
class BroadcastEmulator:
    """kernels/add_broadcast.cu in torch: each input read through the (size, stride) dimensions of the launch
    (from its own storage offset), widened to the result's accumulation type, out = a + alpha * b."""

    def __init__(self, cls):
        self.cls, self.calls = cls, []

    def launch(self, grid, block, a, b, out, n, alpha, *geometry, shared_mem=0):
        self.calls.append((grid, block, n, geometry))
        dims = self.cls.dims
        sizes, strides_a, strides_b = geometry[:dims], geometry[6:6 + dims], geometry[12:12 + dims]
        assert not any(geometry[dims:6] + geometry[6 + dims:12] + geometry[12 + dims:]), "unused triples are 0"
        assert (a.dtype, b.dtype, out.dtype) == (self.cls.a_dtype, self.cls.b_dtype, self.cls.dtype)
        acc = torch.float64 if out.dtype == torch.float64 else torch.float32
        va = a.as_strided(sizes, strides_a).to(acc)
        vb = b.as_strided(sizes, strides_b).to(acc)
        assert out.is_contiguous() and out.numel() == n
        out.view(-1).copy_((va + alpha * vb).reshape(-1))


def _meta_like(t):
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")  # meta stands for the GPU


f16, f32, f64 = torch.float16, torch.float32, torch.float64
GENERAL = [  # (a, b, alpha, dims the kernel gets, inputs copied first)
    (lambda: torch.randn(5, 1), lambda: torch.randn(5), 1, 2, False),
    (lambda: torch.randn(10, 1, 5), lambda: torch.randn(1, 10, 5), 2, 3, False),
    (lambda: torch.randn(6, 8)[:, ::2], lambda: torch.randn(4), -3.125, 2, False),
    (lambda: torch.randn(5, 7).t(), lambda: torch.randn(7, 5), 0.5, 2, False),
    (lambda: torch.randn(4, 6), lambda: torch.randn(4, 6), 2, 1, False),            # alpha alone: merged to 1-D
    (lambda: torch.randn(3, 4, dtype=f16), lambda: torch.randn(4), 1, 2, False),   # fp16 read in the kernel
    (lambda: torch.randn(2, 3), lambda: torch.tensor(0.1, dtype=f64), 1, 1, False),  # fp64 0-d rounded first
    (lambda: torch.randn(()), lambda: torch.randn(()), 2, 1, False),
    (lambda: torch.randn(2, 2, 2, 2, 2, 2, 2).permute(6, 5, 4, 3, 2, 1, 0), lambda: torch.randn(2, 2, 2, 2, 2, 2, 2),
     2, 1, True),                                                                  # 7 unmergeable strides: copies
    (lambda: torch.randn(2, 3, 1, 4, 1, 5, 1), lambda: torch.randn(3, 7, 1, 6, 5, 2), 2, 1, True),  # 7 groups:
]                                                                                  # both copied to the result's shape


@pytest.mark.parametrize("case", range(len(GENERAL)))
def test_add_general_cuda_path_on_a_cpu_stand_in(case):
    make_a, make_b, alpha, dims, copy = GENERAL[case]
    a, b = make_a(), make_b()
    cls = add_module.shape_class(_meta_like(a), _meta_like(b), alpha)
    assert isinstance(cls, add_module.BroadcastClass) and (cls.dims, cls.copy, cls.index) == (dims, copy, "unsigned")
    emulator = BroadcastEmulator(cls)
    out = add_module.run_cuda(FakeKernels(cls, broadcast=emulator), a, b, alpha)
    want = torch.add(a, b, alpha=alpha)
    assert out.dtype == want.dtype and out.is_contiguous() and len(emulator.calls) == 1
    torch.testing.assert_close(out, want)
    grid, block, n, _ = emulator.calls[0]
    assert block == add_module.BLOCK and grid == -(-n // block)


def test_add_general_class_limits():
    meta = lambda *shape, dtype=f32: torch.empty(shape, dtype=dtype, device="meta")  # noqa: E731
    big = add_module.shape_class(meta(2**16, 2**15 + 1), meta(2**15 + 1), 1)
    assert big.index == "long long" and big.dims == 2  # 2^31 + 2^16 elements: 64-bit index math
    # 8 groups broadcast in turn, more than the kernel's 6 even contiguous: both are copied out to the result
    alternating = add_module.shape_class(meta(*(2, 1) * 4), meta(*(1, 2) * 4), 1)
    assert (alternating.dims, alternating.copy, alternating.expand) == (1, True, True)
    # the common call keeps its class: one shape, one dtype, alpha == 1 (alpha 1.0 and True included)
    for alpha in (1, 1.0, True):
        assert isinstance(add_module.shape_class(meta(3, 5), meta(3, 5), alpha), add_module.AddClass)


# ---- the generated public function's branches (jitops/op.py: Op._hot_path_body) ---------------------------------
def _declare(name: str, ran: list):
    """An op with CPU and CUDA implementations that compile nothing: y = x * alpha (+ z), its run functions
    recording which ran with which kernels."""
    import jitops

    def run(device):
        def run_(k, x, alpha, z):
            ran.append((device, k))
            return x * alpha + (z if z is not None else 0)
        return run_

    def setup_context(ctx, inputs, output):
        ctx.alpha = inputs[1]

    def backward(ctx, grad):
        return grad * ctx.alpha, grad

    return jitops.op(f"hotpathtest::{name}(Tensor x, float alpha, Tensor? z=None) -> Tensor",
                     shape_class=lambda x, alpha, z: ("class", x.dtype), fake=lambda x, alpha, z: torch.empty_like(x),
                     cpu=jitops.Impl(lambda cls, target: {}, run("cpu")),
                     cuda=jitops.Impl(lambda cls, target: {}, run("cuda")),
                     setup_context=setup_context, backward=backward)


def _no_general_path(function):
    def refuse(*args, **kwargs):
        raise AssertionError("the call took the general path")
    function.op._hot_globals["__run_device"] = refuse


def test_cpu_calls_take_the_generated_memo_path():
    import jitops

    ran: list = []
    fn = _declare("cpu_memo", ran)
    x, z = torch.randn(3, 4), torch.randn(3, 4)
    torch.testing.assert_close(fn(x, 2.0, z), x * 2 + z)  # the first call loads the class's (empty) kernels
    loaded = fn.op._memo[(-1, ("class", torch.float32))]
    _no_general_path(fn)
    hits = jitops.stats.memory_hits
    torch.testing.assert_close(fn(x, 3.0), x * 3)
    torch.testing.assert_close(fn(x, 1.0, z), x + z)
    assert ran[-2:] == [("cpu", loaded)] * 2 and jitops.stats.memory_hits == hits + 2


def test_cpu_calls_with_a_gradient_hand_the_kernels_to_the_forward():
    from jitops.op import _kernels_slot

    ran: list = []
    fn = _declare("cpu_grad", ran)
    x, z = torch.randn(3, 4, requires_grad=True), torch.randn(3, 4)
    fn(x.detach(), 2.0, z)
    loaded = fn.op._memo[(-1, ("class", torch.float32))]
    _no_general_path(fn)
    y = fn(x, 2.5, z)
    assert ran[-1] == ("cpu", loaded) and type(y.grad_fn).__name__ == "jitops_cpu_gradBackward"
    assert _kernels_slot.kernels is None  # taken by the forward
    y.backward(torch.ones_like(y))
    torch.testing.assert_close(x.grad, torch.full_like(x, 2.5))


def test_the_generated_backward_maps_gradients_to_schema_positions():
    ran: list = []
    fn = _declare("backward_positions", ran)
    x, z = torch.randn(2, 3, requires_grad=True), torch.randn(2, 3, requires_grad=True)
    (fn(x, 3.0, z) * torch.arange(6.0).view(2, 3)).sum().backward()
    torch.testing.assert_close(x.grad, 3.0 * torch.arange(6.0).view(2, 3))
    torch.testing.assert_close(z.grad, torch.arange(6.0).view(2, 3))
    x.grad = None
    fn(x, 3.0, z.detach()).sum().backward()  # z needs none: its gradient is dropped, not an error
    torch.testing.assert_close(x.grad, torch.full_like(x, 3.0))
    fn.op.backward = lambda ctx, grad: [grad, None]  # a list is taken as a tuple
    x.grad = None
    fn(x, 3.0, z).sum().backward()
    torch.testing.assert_close(x.grad, torch.ones_like(x))
    fn.op.backward = lambda ctx, grad: grad  # one gradient for two tensor arguments
    with pytest.raises(RuntimeError, match=r"jitops.backward_positions: backward returned 1 gradients for 2"):
        fn(x, 3.0, z).sum().backward()


def test_cpu_calls_the_generated_path_does_not_take():
    ran: list = []
    fn = _declare("cpu_general", ran)
    x = torch.randn(3, 4)
    fn(x, 1.0)
    meta = torch.empty(3, 4, device="meta")
    assert fn(meta, 1.0).device.type == "meta" and ran[-1][0] == "cpu"  # meta: the fake, nothing runs
    with pytest.raises(ValueError, match="argument 'z' is on meta but 'x' is on cpu"):
        fn(x, 1.0, meta)
    with pytest.raises(TypeError, match="argument 'x' has layout torch.sparse_coo"):
        fn(x.to_sparse(), 1.0)


class CudaTensorLike:
    """What the generated CUDA branch reads of a dense tensor on GPU 0."""

    layout = torch.strided

    def __init__(self, requires_grad=False):
        self.requires_grad = requires_grad

    def get_device(self):
        return 0


def test_the_generated_cuda_branch_on_stand_ins():
    """The CUDA branch, with a stand-in tensor type: a memo hit runs the CUDA implementation with the remembered
    kernels; with a gradient, the kernels and that run function go to the forward through the slot."""
    from jitops.op import Kernels, _kernels_slot

    ran: list = []
    fn = _declare("cuda_branch", ran)
    hot = fn.op._hot_globals
    hot.update({"__Tensor": CudaTensorLike, "__current_device": lambda: 0, "__several": True,
                "__shape_class": lambda x, alpha, z: "cuda class"})
    _no_general_path(fn)
    kernels = fn.op._memo[(0, "cuda class")] = Kernels({}, "cuda class")
    hot["__run"] = lambda k, x, alpha, z: ran.append(("cuda", k)) or "out"
    assert fn(CudaTensorLike(), 2.0, CudaTensorLike()) == "out" and ran[-1] == ("cuda", kernels)
    applied = []
    hot["__capply"] = lambda *args: applied.append((_kernels_slot.kernels, _kernels_slot.run, args)) or "grad out"
    hot["__functorch"] = lambda: False
    x = CudaTensorLike(requires_grad=True)
    assert fn(x, 2.0, None) == "grad out"
    assert applied == [(kernels, hot["__run"], (x, 2.0, None))]
    _kernels_slot.kernels = _kernels_slot.run = None
    hot["__current_device"] = lambda: 1  # another GPU is current: the general path
    with pytest.raises(AssertionError, match="general path"):
        fn(CudaTensorLike(), 2.0, None)


# ---- the short-path shape classes on the CPU, against the general paths ---------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("offset", [0, 1, 2, 3])
def test_gelu_cpu_short_path_classes(dtype, offset):
    x = torch.randn(70, dtype=dtype)[offset:offset + 60]  # offset views: every vector width
    for approximate in ("none", "tanh"):
        assert gelu_module.shape_class(x, approximate) == gelu_module._class_for("gelu", [("x", x)], approximate)
        grad = torch.randn(61, dtype=dtype)[1:]
        assert gelu_module.backward_shape_class(grad, x, approximate) == \
            gelu_module._class_for("gelu_backward", [("grad", grad), ("x", x)], approximate)
    strided = torch.randn(60, 2, dtype=dtype)[:, 0]
    assert gelu_module.shape_class(strided, "none") == gelu_module._class_for("gelu", [("x", strided)], "none")
    with pytest.raises(ValueError, match="jitops.gelu_backward: .*shape"):
        gelu_module.backward_shape_class(torch.randn(59, dtype=dtype), x, "none")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_layer_norm_cpu_short_path_classes(dtype):
    x = torch.randn(3, 5, 24, dtype=dtype)
    w, b = torch.nn.Parameter(torch.randn(24, dtype=dtype)), torch.randn(24, dtype=dtype)
    for weight, bias in ((w, b), (None, b), (w, None), (None, None), (w.detach()[None, :].expand(2, 24)[1], b)):
        assert ln.shape_class(x, [24], weight, bias, 1e-5) == ln._checked_shape_class(x, [24], weight, bias, 1e-5)
    assert ln.shape_class(x[:, :, :0], [0], None, None, 1e-5) == ln._checked_shape_class(x[:, :, :0], [0], None,
                                                                                           None, 1e-5)
    for bad in ([23], [5, 24]):  # the general path's checks (and their errors) still apply
        with pytest.raises(ValueError, match="normalized_shape"):
            ln.shape_class(x, bad, w, b, 1e-5)
    with pytest.raises(ValueError, match="argument 'bias' has shape"):
        ln.shape_class(x, [24], w, torch.randn(23, dtype=dtype), 1e-5)
    with pytest.raises(TypeError, match="'weight'"):
        ln.shape_class(x, [24], w.double() if dtype != torch.float64 else w.float(), b, 1e-5)


def test_layer_norm_short_path_takes_parameters(monkeypatch):
    """nn.LayerNorm's weight and bias are Parameters: the CUDA short path takes them (it had sent every model
    call to the general path)."""
    class ParameterLike(CudaLike):
        pass

    monkeypatch.setattr(ln, "_Tensor", CudaLike)
    monkeypatch.setattr(ln, "_Parameter", ParameterLike)
    monkeypatch.setattr(ln, "_checked_shape_class", lambda *args: pytest.fail("took the general path"))
    x = CudaLike((4, 1024), torch.bfloat16, 0x1000)
    w, b = ParameterLike((1024,), torch.bfloat16, 0x2004), ParameterLike((1024,), torch.bfloat16, 0x3000)
    assert ln.shape_class(x, [1024], w, b, 1e-5) == ln_plan.forward_class(torch.bfloat16, 1024, 2, 4, "int")


def test_ops_with_one_device_send_the_other_to_the_general_path():
    import jitops

    cuda_only = jitops.op("hotpathtest::cuda_only(Tensor x) -> Tensor", shape_class=lambda x: 1,
                          fake=lambda x: torch.empty_like(x), cuda=jitops.Impl(lambda cls, target: {}, lambda k, x: x))
    with pytest.raises(ValueError, match=r"jitops.cuda_only: inputs are on cpu, but this op runs on cuda only"):
        cuda_only(torch.randn(3))
    ran: list = []
    cpu_only = jitops.op("hotpathtest::cpu_only(Tensor x) -> Tensor", shape_class=lambda x: 1,
                         fake=lambda x: torch.empty_like(x),
                         cpu=jitops.Impl(lambda cls, target: {}, lambda k, x: ran.append(k) or x * 2))
    x = torch.randn(3)
    cpu_only(x)
    _no_general_path(cpu_only)
    torch.testing.assert_close(cpu_only(x), x * 2)  # the CPU branch, from the memo
    assert ran[-1] is cpu_only.op._memo[(-1, 1)]
    cpu_only.op._hot_globals["__Tensor"] = CudaTensorLike  # a GPU tensor: no CUDA branch, the general path
    with pytest.raises(AssertionError, match="general path"):
        cpu_only(CudaTensorLike())


def test_a_gradient_call_that_misses_the_memo_prefetches_the_backward(monkeypatch):
    """The autograd.Function's forward starts the backward's kernels when the hot path found no kernels (a first
    call); jitops.gemm itself no longer asks on every call (7.2 us of repeated work a call)."""
    import jitops
    from jitops.ops import gemm as G

    op = G._op.op
    asked = []
    monkeypatch.setattr(type(op), "prefetch", lambda self, *args: asked.append((self.name, args)) or [])
    a = torch.empty(64, 32, device="meta", dtype=torch.bfloat16, requires_grad=True)
    b = torch.empty(32, 16, device="meta", dtype=torch.bfloat16, requires_grad=True)
    G._op(a, b)  # the op itself, not jitops.gemm's wrapper: the shared mechanism asks
    assert [name for name, _ in asked] == ["gemm"] and asked[0][1][:2] == (a, b)
    asked.clear()
    jitops.gemm(a, b)  # the wrapper adds no second request
    assert [name for name, _ in asked] == ["gemm"]
    asked.clear()
    jitops.gemm(a.detach(), b.detach())  # no gradient: nothing to prefetch
    assert asked == []
