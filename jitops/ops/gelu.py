"""jitops.gelu(x, approximate="none" | "tanh"), forward and backward.

    gelu(x) = x/2 (1 + erf(x / sqrt 2))                                  approximate="none"
    gelu(x) = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))               approximate="tanh"

Memory-bound: one read and one write per element forward, two reads and one write backward.  The shape class
is (dtype, vector width from the alignment, approximation, index width).  Each thread issues 2 to 4 16-byte
loads before it computes (kernels/gelu.cu): at 2^28 elements both directions run at the device's copy
bandwidth.  Non-contiguous inputs are copied to contiguous ones first; outputs are contiguous.  CUDA: fp32,
fp16, bf16, fp64 (NVRTC), arithmetic in fp32 (fp64 for fp64).  CPU: the same dtypes through the host C++
compiler (cxx), fp16 and bf16 by the fp32 kernel on fp32 copies (one rounding at the end, as torch's CPU gelu
computes them).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .. import native, shapes
from ..config import config
from ..launch import sm_count
from ..op import Impl, op, public
from ..specs import CppLibrary, CudaKernel, Source, Target
from .gelu_plan import BLOCK, PLANNED, GeluTuning, tuning

CUDA_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
CPU_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
CPU_COMPUTE = shapes.CPU_COMPUTE
APPROXIMATIONS = {"none": 0, "tanh": 1}
# 32-bit indices below 2**30 elements: then every tile offset plus one grid stride stays below 2**31.
INT32_LIMIT = 2**30


class GeluClass(NamedTuple):
    dtype: torch.dtype
    vec: int
    approximate: str
    index: str  # "int" or "long long"


def _check_approximate(approximate: str) -> None:
    if approximate not in APPROXIMATIONS:
        raise ValueError(f"jitops.gelu: argument 'approximate' is {approximate!r}; use 'none' or 'tanh'")


def _class_for(op_name: str, tensors: list[tuple[str, torch.Tensor]], approximate: str) -> GeluClass:
    # Runs on every call: plain comparisons first, the helpers (which build the messages) only on failure.
    if approximate not in APPROXIMATIONS:
        _check_approximate(approximate)
    first_name, first = tensors[0]
    for name, t in tensors[1:]:
        if t.dtype != first.dtype:
            shapes.check_same_dtype(op_name, (first_name, first), (name, t))
        if t.shape != first.shape:
            shapes.check_same_shape(op_name, (first_name, first), (name, t))
    allowed = CPU_DTYPES if first.is_cpu else CUDA_DTYPES
    if first.dtype not in allowed:
        shapes.check_dtype(op_name, first_name, first, allowed)
    if all(t.is_contiguous() for _, t in tensors):
        vec = shapes.vector_width([t for _, t in tensors])
    else:  # the contiguous copies are fresh allocations: 16-byte aligned
        vec = 16 // first.element_size()
    index = "int" if first.numel() < INT32_LIMIT else "long long"
    return GeluClass(first.dtype, vec, approximate, index)


_ITEMSIZE = shapes.CUDA_ITEMSIZE
_CLASSES: dict[tuple, GeluClass] = {}
_Tensor = torch.Tensor


def _remembered(dtype: torch.dtype, itemsize: int, address: int, approximate: str, numel: int) -> GeluClass:
    """The class of contiguous tensors starting at `address` (several: their addresses or-ed), as _class_for
    gives it, built once."""
    width = 16 // itemsize
    while width > 1 and address % (width * itemsize):
        width >>= 1
    key = (dtype, width, approximate, numel < INT32_LIMIT)
    cls = _CLASSES.get(key)
    if cls is None:
        cls = _CLASSES[key] = GeluClass(dtype, width, approximate, "int" if key[3] else "long long")
    return cls


# The kernels' template defaults are the planned values (gelu_plan.PLANNED); other values (a config scope's
# gelu_tuning: tuning sweeps) name them explicitly.
GELU_FORWARD = CudaKernel("gelu_forward", Source.file("gelu.cu"),
                          "jitops::gelu_forward<{T}, {VEC}, {APPROX}, {I}>", "ptr ptr i64")
GELU_BACKWARD = CudaKernel("gelu_backward", Source.file("gelu.cu"),
                           "jitops::gelu_backward<{T}, {VEC}, {APPROX}, {I}>", "ptr ptr ptr i64")
_EXPLICIT = {
    GELU_FORWARD: (PLANNED.unroll_forward, CudaKernel("gelu_forward", Source.file("gelu.cu"),
                                 "jitops::gelu_forward<{T}, {VEC}, {APPROX}, {I}, {UNROLL}, {FAST}>", "ptr ptr i64")),
    GELU_BACKWARD: (PLANNED.unroll_backward, CudaKernel("gelu_backward", Source.file("gelu.cu"),
                                  "jitops::gelu_backward<{T}, {VEC}, {APPROX}, {I}, {UNROLL}, {FAST}>",
                                  "ptr ptr ptr i64")),
}
GELU_CPU = CppLibrary("gelu_cpu", Source.file("cpu/gelu.cpp"), functions={
    "gelu_forward": (("ptr", "ptr", "i64", "i32"), "void"),
    "gelu_backward": (("ptr", "ptr", "ptr", "i64", "i32"), "void")})


def _bind_cuda(kernel: CudaKernel, cls: GeluClass):
    chosen = tuning()
    fast = int(chosen.fast_tanh and cls.approximate == "tanh" and cls.dtype in (torch.float16, torch.bfloat16))
    unroll = chosen.unroll_backward if kernel is GELU_BACKWARD else chosen.unroll_forward
    params = dict(T=shapes.CUDA_TYPES[cls.dtype], VEC=cls.vec, APPROX=APPROXIMATIONS[cls.approximate], I=cls.index)
    default_unroll, explicit = _EXPLICIT[kernel]
    if unroll != default_unroll or fast:
        return explicit.bind(shapes.dtype_name(cls.dtype), **params, UNROLL=unroll, FAST=fast)
    return kernel.bind(shapes.dtype_name(cls.dtype), **params)


def _cpu_kernels(cls: GeluClass, target: Target):
    compute = CPU_COMPUTE[cls.dtype]
    return {"cpu": GELU_CPU.bind(shapes.dtype_name(compute), SCALAR_T=shapes.CPU_TYPES[compute])}


def grid(vec: int, n: int, unroll: int, blocks_per_sm: int, x: torch.Tensor) -> int:
    """Blocks for n elements of x in vectors of `vec`, `unroll` vectors a thread: one block a tile, or at most
    blocks_per_sm a SM when set."""
    tiles = -(-(n // vec or 1) // (BLOCK * unroll))
    return min(tiles, sm_count(x.get_device()) * blocks_per_sm) if blocks_per_sm else tiles


def _tuning_of(k) -> GeluTuning:
    """The tuning k's kernels were built with: the scope of the call that first runs them, the one that built
    them (a sweep clears the op's memo inside each scope)."""
    chosen = k.__dict__.get("tuning")
    if chosen is None:
        chosen = k.tuning = tuning()
    return chosen


# ---- jitops::gelu_backward: dx = dy * gelu'(x) -----------------------------------------------------------------
def backward_shape_class(grad: torch.Tensor, x: torch.Tensor, approximate: str) -> GeluClass:
    # The short path of shape_class below, for two tensors of one dtype and shape.
    if type(grad) is _Tensor and type(x) is _Tensor and (x.is_cuda or x.is_cpu) and grad.dtype is x.dtype and \
            grad.shape == x.shape and grad.is_contiguous() and x.is_contiguous():
        itemsize = _ITEMSIZE.get(x.dtype)
        if itemsize is not None and approximate in APPROXIMATIONS:
            return _remembered(x.dtype, itemsize, grad.data_ptr() | x.data_ptr(), approximate, grad.numel())
    return _class_for("gelu_backward", [("grad", grad), ("x", x)], approximate)


def backward_cuda_kernels(cls: GeluClass, target: Target):
    return {"backward": _bind_cuda(GELU_BACKWARD, cls)}


def run_backward_cuda(k, grad: torch.Tensor, x: torch.Tensor, approximate: str) -> torch.Tensor:
    grad, x = grad.contiguous(), x.contiguous()
    dx = torch.empty_like(x)
    n = x.numel()
    if n:
        chosen = _tuning_of(k)
        k.backward.launch(grid(k.shape_class.vec, n, chosen.unroll_backward, chosen.blocks_per_sm, x), BLOCK, grad,
                          x, dx, n)
        if k.__dict__.get("native_offered") != config.generation:  # for jitops.linear's C++ host path
            native.offer_gelu(k, k.backward, k.shape_class, x.get_device(), True, BLOCK * chosen.unroll_backward,
                              BLOCK)
    return dx


def _cpu_operand(t: torch.Tensor, compute: torch.dtype) -> torch.Tensor:
    """t as the CPU kernel reads it: contiguous, in the compute dtype.  Asked first: a no-op .to() still costs
    0.9 us a call on the dev box."""
    if not t.is_contiguous():
        t = t.contiguous()
    return t if t.dtype is compute else t.to(compute)


def run_backward_cpu(k, grad: torch.Tensor, x: torch.Tensor, approximate: str) -> torch.Tensor:
    dtype, compute = x.dtype, CPU_COMPUTE[x.dtype]
    grad, x = _cpu_operand(grad, compute), _cpu_operand(x, compute)
    dx = torch.empty_like(x)
    k.cpu.gelu_backward(grad, x, dx, dx.numel(), APPROXIMATIONS[approximate])
    return dx if dtype is compute else dx.to(dtype)


gelu_backward = op(
    "jitops::gelu_backward(Tensor grad, Tensor x, str approximate='none') -> Tensor",
    shape_class=backward_shape_class,
    cuda=Impl(backward_cuda_kernels, run_backward_cuda),
    cpu=Impl(_cpu_kernels, run_backward_cpu),
    fake=lambda grad, x, approximate: torch.empty_like(x, memory_format=torch.contiguous_format),
    doc="Gradient of jitops.gelu: grad * gelu'(x).",
    fallback=lambda k, grad, x, approximate: torch.ops.aten.gelu_backward(grad.contiguous(), x.contiguous(),
                                                                         approximate=approximate),
)


# ---- jitops::gelu ----------------------------------------------------------------------------------------------
def shape_class(x: torch.Tensor, approximate: str) -> GeluClass:
    """Runs on every call: a contiguous CUDA or CPU tensor takes a short path (a few tensor queries and one
    lookup of a remembered class: building a NamedTuple costs 0.3 us, _class_for 1.9 us on the dev box);
    anything else, bad inputs included, takes _class_for, which gives the same class or the error."""
    if type(x) is _Tensor and (x.is_cuda or x.is_cpu) and x.is_contiguous():
        itemsize = _ITEMSIZE.get(x.dtype)  # the CPU's dtypes are the GPU's (CPU_DTYPES)
        if itemsize is not None and approximate in APPROXIMATIONS:
            return _remembered(x.dtype, itemsize, x.data_ptr(), approximate, x.numel())
    return _class_for("gelu", [("x", x)], approximate)


def cuda_kernels(cls: GeluClass, target: Target):
    return {"forward": _bind_cuda(GELU_FORWARD, cls)}


def run_cuda(k, x: torch.Tensor, approximate: str) -> torch.Tensor:
    x = x.contiguous()
    y = torch.empty_like(x)
    n = x.numel()
    if n:
        chosen = _tuning_of(k)
        k.forward.launch(grid(k.shape_class.vec, n, chosen.unroll_forward, chosen.blocks_per_sm, x), BLOCK, x, y, n)
        if k.__dict__.get("native_offered") != config.generation:  # for jitops.linear's C++ host path
            native.offer_gelu(k, k.forward, k.shape_class, x.get_device(), False, BLOCK * chosen.unroll_forward,
                              BLOCK)
    return y


def run_cpu(k, x: torch.Tensor, approximate: str) -> torch.Tensor:
    dtype, compute = x.dtype, CPU_COMPUTE[x.dtype]
    x = _cpu_operand(x, compute)
    y = torch.empty_like(x)
    k.cpu.gelu_forward(x, y, y.numel(), APPROXIMATIONS[approximate])
    return y if dtype is compute else y.to(dtype)


def setup_context(ctx, inputs, output) -> None:
    x, approximate = inputs
    ctx.save_for_backward(x)
    ctx.approximate = approximate


def backward(ctx, grad: torch.Tensor):
    (x,) = ctx.saved_tensors
    return (gelu_backward(grad, x, ctx.approximate),)


def companions(x, approximate, *, needs):
    """The backward's call, for manifests and prefetching: dy like y (contiguous)."""
    return [(gelu_backward, (shapes.placeholder(x, x.shape), x, approximate))] if needs[0] else []


# Common shape classes, for `cache_tools prewarm --all-builtin` (manifest items; each builds the forward and the
# backward).
PREWARM = [
    {"op": "gelu", "dtypes": ["fp32", "fp16", "bf16"], "shapes": [[[4096, 8192]]],
     "kwargs": {"approximate": approximate}}
    for approximate in ("none", "tanh")
]

gelu = op(
    "jitops::gelu(Tensor x, str approximate='none') -> Tensor",
    shape_class=shape_class,
    cuda=Impl(cuda_kernels, run_cuda),
    cpu=Impl(_cpu_kernels, run_cpu),
    fake=lambda x, approximate: torch.empty_like(x, memory_format=torch.contiguous_format),
    setup_context=setup_context,
    backward=backward,
    companions=companions,
    doc=__doc__,
    fallback=lambda k, x, approximate: torch.nn.functional.gelu(x.contiguous(), approximate=approximate),
)
public("gelu", gelu, entries=(gelu,), parts=(gelu_backward,))
