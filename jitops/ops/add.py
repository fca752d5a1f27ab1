"""jitops.add(a, b): elementwise a + b.

The smallest op on the runtime, and the one the hot-call benchmark measures.  No broadcasting: a and b have
one shape and one dtype.  Non-contiguous inputs are copied to contiguous ones first; the output is
contiguous.  CUDA: fp32, fp16, bf16, fp64 through NVRTC.  CPU: fp32, fp64 through load_inline.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .. import shapes
from ..launch import UNCAPPED_GRID, elementwise_grid
from ..op import Impl, op
from ..specs import CppExtension, CudaKernel, Source, Target

CUDA_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
CPU_DTYPES = (torch.float32, torch.float64)
BLOCK = 256


class AddClass(NamedTuple):
    dtype: torch.dtype
    vec: int  # elements per access: 16 bytes when both inputs are 16-byte aligned
    contiguous: bool  # both inputs: run_cuda copies neither (the kernel is the same either way)


_CLASSES: dict[tuple[torch.dtype, int, bool], AddClass] = {}
_WIDEST = {dtype: 16 // size for dtype, size in shapes.CUDA_ITEMSIZE.items()}
_Tensor = torch.Tensor


def shape_class(a: torch.Tensor, b: torch.Tensor) -> AddClass:
    # Runs on every call: plain comparisons first, the helpers (which build the messages) only on failure.
    dtype = a.dtype
    if dtype is not b.dtype:
        shapes.check_same_dtype("add", ("a", a), ("b", b))
    if a.shape != b.shape:
        shapes.check_same_shape("add", ("a", a), ("b", b))
    if a.is_cpu:
        if dtype not in CPU_DTYPES:
            shapes.check_dtype("add", "a", a, CPU_DTYPES)
        vec = _WIDEST[dtype]
    else:
        vec = _WIDEST.get(dtype)  # one lookup is the CUDA dtype check
        if vec is None:
            shapes.check_dtype("add", "a", a, CUDA_DTYPES)
    # Non-contiguous inputs are copied, and the copies are fresh 16-byte aligned allocations.
    contiguous = a.is_contiguous() and b.is_contiguous()
    if contiguous and (type(a) is not _Tensor or type(b) is not _Tensor or a.is_meta
                       or (a.data_ptr() | b.data_ptr()) & 15):
        vec = shapes.pair_vector_width(a, b)  # the uncommon cases: offset views, fake or meta tensors
    key = (dtype, vec, contiguous)
    cls = _CLASSES.get(key)  # a NamedTuple costs 0.3 us to build, a lookup 0.1 us
    if cls is None:
        cls = _CLASSES[key] = AddClass(dtype, vec, contiguous)
    return cls


# ---- CUDA -------------------------------------------------------------------------------------------------------
ADD_CUDA = CudaKernel("add_forward", Source.file("add.cu"), "jitops::add_forward<{T}, {VEC}>", "ptr ptr ptr i64")


def cuda_kernels(cls: AddClass, target: Target):
    return {"forward": ADD_CUDA.bind(shapes.dtype_name(cls.dtype), T=shapes.CUDA_TYPES[cls.dtype], VEC=cls.vec)}


def run_cuda(k, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    cls = k.shape_class
    if not cls.contiguous:
        a, b = a.contiguous(), b.contiguous()
    out = torch.empty_like(a)
    n = a.numel()
    if n:
        grid = (n // cls.vec + BLOCK - 1) // BLOCK or 1
        if grid > UNCAPPED_GRID:
            grid = elementwise_grid(n // cls.vec or 1, BLOCK, a.get_device())
        k.forward.launch(grid, BLOCK, a, b, out, n)
    return out


# ---- CPU --------------------------------------------------------------------------------------------------------
ADD_CPU = CppExtension("add_cpu", Source.file("cpu/add.cpp"), functions=("add_forward",))


def cpu_kernels(cls: AddClass, target: Target):
    return {"forward": ADD_CPU.bind(shapes.dtype_name(cls.dtype), SCALAR_T=shapes.CPU_TYPES[cls.dtype])}


def run_cpu(k, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a, b = a.contiguous(), b.contiguous()
    out = torch.empty_like(a)
    k.forward.add_forward(a, b, out)
    return out


# Common shape classes, for `python -m jitops` and `cache_tools prewarm --all-builtin` (manifest items).
PREWARM = [{"op": "add", "dtypes": ["fp32", "fp16", "bf16"], "shapes": [[[4096, 4096], [4096, 4096]]], "kwargs": {}}]


# ---- autograd ---------------------------------------------------------------------------------------------------
def setup_context(ctx, inputs, output) -> None:
    pass


def backward(ctx, grad: torch.Tensor):
    return grad, grad


add = op(
    "jitops::add(Tensor a, Tensor b) -> Tensor",
    shape_class=shape_class,
    cuda=Impl(cuda_kernels, run_cuda),
    cpu=Impl(cpu_kernels, run_cpu),
    fake=lambda a, b: torch.empty_like(a, memory_format=torch.contiguous_format),
    setup_context=setup_context,
    backward=backward,
    doc=__doc__,
    fallback=lambda k, a, b: torch.add(a, b),
)
