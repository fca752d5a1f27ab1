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
]


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
    with pytest.raises(ValueError, match="jitops.add: arguments 'a' of shape .* more than 6 separate groups"):
        add_module.shape_class(meta(*(2, 1) * 4), meta(*(1, 2) * 4), 1)  # 8 groups broadcast in turn
    # the common call keeps its class: one shape, one dtype, alpha == 1 (alpha 1.0 and True included)
    for alpha in (1, 1.0, True):
        assert isinstance(add_module.shape_class(meta(3, 5), meta(3, 5), alpha), add_module.AddClass)
