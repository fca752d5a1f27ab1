"""The CUDA hot paths' Python, without a GPU: the short-path shape classes of gelu and layer_norm (a stand-in
tensor type that reports is_cuda) and the small-grid arithmetic of add's and layer_norm's CUDA run functions (CPU
tensors, a kernel that records its launch).  The GPU tests check the same paths against the general ones."""
from __future__ import annotations

import importlib
import math

import pytest
import torch

gelu_module = importlib.import_module("jitops.ops.gelu")
ln = importlib.import_module("jitops.ops.layer_norm")
add_module = importlib.import_module("jitops.ops.add")
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
    expected = ln.forward_class(torch.bfloat16, n, vec, 4, "int")
    assert ln.shape_class(x, [n], w, b, 1e-5) == expected
    assert ln.shape_class(x, [n], None, None, 1e-5) == ln.forward_class(torch.bfloat16, n, 8 if n % 8 == 0 else
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
    cls = ln.forward_class(torch.float32, 64, 4, 6, "int")
    forward = Recorder()
    kernels = FakeKernels(cls, forward=forward)
    y, stats = ln.run_cuda(kernels, x, [64], w, None, 1e-5)
    assert stats.shape == (2, 6) and y.shape == x.shape
    threads = max(cls.tpr, 128)
    assert forward.calls[0][:2] == (-(-6 // (threads // cls.tpr)), threads)
    y2 = ln.run_inference_cuda(kernels, x, [64], w, None, 1e-5)
    assert y2.shape == x.shape and forward.calls[1][2][4] is None  # no statistics pointer: the kernel skips them
