"""jitops.gemm(a, b, *, bias=None, activation=None | "relu" | "gelu" | "gelu_tanh", out_dtype=None)

    out = act(a @ b + bias)        a: (M, K), b: (K, N), bias: (N,), out: (M, N) row-major

bf16 and fp16 on CUDA, accumulating in fp32; out_dtype is the inputs' dtype (default) or float32.  The bias and
the activation run in the GEMM's epilogue ("gelu" is the exact erf form, torch's default; "gelu_tanh" is
F.gelu(approximate="tanh")).

Operands as torch.matmul takes them: 1-D (a vector: a row of a, a column of b, its dimension dropped from the
output), N-D with broadcast batch dimensions, empty dimensions; gradients as torch's, summed over broadcast
dimensions.  Which implementation runs a CUDA call (cuda_route):
- "kernel": bf16/fp16 operands that fold into one 2-D GEMM, i.e. b is 2-D (or 1-D, or its batch dimensions are
  all 1) and a is (..., K): jitops' 2-D kernels on a as (M = its leading sizes' product, K), the same shape
  classes and cache keys as a 2-D call; a is viewed, not copied, when its leading dimensions collapse (any
  contiguous a does).
- "cublas_batched": bf16/fp16 with batch dimensions on b (bmm, attention-style products): ATen's torch.matmul,
  i.e. cuBLAS's strided-batched GEMM, one launch for the whole batch (jitops' own batched kernel is future work;
  a loop over the 2-D kernel would pay one launch an item).
- "cublas_tf32" / "cublas_fp32": float32 operands, any shape: ATen's torch.matmul (cuBLAS), TF32 tensor cores
  when torch.backends.cuda.matmul.allow_tf32 (torch.set_float32_matmul_precision("high" or "medium")) allows
  them, full fp32 otherwise, as torch itself decides (jitops' own TF32/fp32 kernel is future work).

Layouts come from the strides: each operand may be row- or column-major (a transposed view such as `w.t()`
costs no copy), with any leading dimension.  Only a view with no unit stride (e.g. `x[::2, ::2]`) is copied.

Kernels (sources in kernels/gemm/):
- sm_90: CUTLASS 3 warp-specialized TMA + wgmma kernels, the kernel alone compiled by NVRTC for sm_90a with
  -DNDEBUG; its host side (TMA descriptors through cuTensorMapEncodeTiled, the tile scheduler's parameters, the
  cluster launch) is Python's, jitops/cutlass_host.py, checked byte for byte against CUTLASS's host code.  One
  configuration per translation unit.  TMA needs 16-byte aligned rows and addresses; other shapes take the
  sm_80 kernels below.
- sm_80, sm_86, sm_89 (and unaligned shapes on sm_90): CUTLASS 2 tensor-op kernels compiled by NVRTC in seconds;
  a __global__ wrapper builds CUTLASS 2's Params on the device, so there is no host code to compile.  An
  alignment class (8, 4, 2 or 1 elements) serves K or N that are not multiples of 8.

The shape class is (dtype, out dtype, the two operand majors, alignment class, size bucket, fused epilogue,
kernel family).  The size bucket picks the tile shape and schedule (SM90_CONFIGS, SM80_CONFIGS); the bias and
activation are run-time arguments of one "fused" kernel per configuration, so they add one build, not four.

Backward: dA = dC . B^T and dB = A^T . dC with the same kernels, the transposes being stride views (no copies);
only the gradients that are needed are computed.  relu's mask comes from the saved output.  For "gelu" with a
gradient needed, jitops.gemm runs the GEMM with the bias fused, keeps that pre-activation and applies
jitops.gelu: one extra elementwise pass in the forward instead of a second GEMM in the backward (the op itself,
reached directly through torch.ops, recomputes the pre-activation instead).  The first call that needs a
gradient also starts compiling the backward's kernels in background threads while the forward runs.

CPU: a reference path through ATen (torch.matmul in fp32, or fp64 for fp64 inputs), so CI exercises the op's
registration and autograd wiring without a GPU; it accepts fp64, fp32, bf16 and fp16.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import math
from collections.abc import Iterator
from typing import NamedTuple

import torch
import torch.nn.functional as F

from .. import light_gemm, shapes
from ..config import config as settings
from ..cutlass_host import GemmConfig, Sm90Gemm, epilogue_tile
from ..launch import CudaFunction, current_stream, ensure_context, sm_count
from ..op import Impl, op, public
from ..specs import CudaKernel, CudaLibrary, Source, Target
from .gelu import gelu, gelu_backward

log = logging.getLogger("jitops")

CUDA_DTYPES = (torch.bfloat16, torch.float16)  # jitops' own CUDA kernels
CUDA_ACCEPTED = (torch.float32, torch.bfloat16, torch.float16)  # float32 through cuBLAS (cuda_route)
CPU_DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)
ACTIVATIONS = {None: 0, "relu": 1, "gelu": 2, "gelu_tanh": 3}
# The approximation jitops.gelu applies for each GELU activation (the training path runs the GEMM with the
# bias fused, then jitops.gelu, which keeps the pre-activation its backward needs).
GELU_APPROXIMATE = {"gelu": "none", "gelu_tanh": "tanh"}
CUTLASS_TYPES = {torch.bfloat16: "cutlass::bfloat16_t", torch.float16: "cutlass::half_t", torch.float32: "float"}
INT32_MAX = 2**31 - 1


# ---- shape class ----------------------------------------------------------------------------------------------
class GemmClass(NamedTuple):
    dtype: torch.dtype
    out_dtype: torch.dtype
    a_kmajor: bool    # a is row-major (K contiguous); else column-major
    b_kmajor: bool    # b is column-major (K contiguous); else row-major
    align: int        # elements every row start, leading dimension and contiguous extent is a multiple of
    bucket: str       # picks the tile configuration (SM90_CONFIGS' keys); empty and cpu: none
    fused: bool       # bias and/or activation in the epilogue
    family: str       # "auto": by the device's arch; "sm80": the CUTLASS 2 kernels on any arch (tests)


_family = "auto"


@contextlib.contextmanager
def force_family(family: str) -> Iterator[None]:
    """Run jitops.gemm with one kernel family on every arch: force_family("sm80") runs the CUTLASS 2 kernels on
    an sm_90 GPU too (mma.sync runs on Hopper), which is how the GPU tests check that path on an H100."""
    global _family
    if family not in ("auto", "sm80"):
        raise ValueError(f"jitops.gemm: unknown kernel family {family!r}; use 'auto' or 'sm80'")
    previous, _family = _family, family
    try:
        yield
    finally:
        _family = previous


def _layout(t: torch.Tensor, rows: int, cols: int) -> tuple[bool, int] | None:
    """(row_major, leading dimension) of a 2-D operand that a kernel can read in place, or None when it must be
    copied."""
    s0, s1 = t.stride()
    return layout_of(s0, s1, rows, cols)


def layout_of(s0: int, s1: int, rows: int, cols: int) -> tuple[bool, int] | None:
    """_layout from the strides of a (rows, cols) view.  A dimension of size 1 has no meaningful stride, so
    either layout may fit; the leading dimension is then chosen 16-byte friendly."""
    if rows > 1 and cols > 1:
        if s1 == 1 and s0 >= cols:
            return True, s0
        if s0 == 1 and s1 >= rows:
            return False, s1
        return None
    if rows <= 1 and cols <= 1:
        return True, 8
    if rows <= 1:  # one row: row-major if its elements are adjacent, else a column-major "matrix" of ld s1
        return (True, -(-cols // 8) * 8) if s1 == 1 else ((False, s1) if s1 >= 1 else None)
    # one column
    return (False, -(-rows // 8) * 8) if s0 == 1 else ((True, s0) if s0 >= 1 else None)


def _address_units(t: torch.Tensor) -> int:
    """The start address in elements' worth of alignment: 8 when 16-byte aligned (for 16-bit types)."""
    return shapes.byte_alignment(t) // t.element_size()


# The wave model that picks a tile for the shapes no special bucket claims.  A persistent kernel runs its tiles
# in waves of one tile an SM; a problem costs about (waves) x (one tile's time), one tile's time being its area
# over its relative speed.  Speeds fitted on the lent H100's survey sweep (19:52 UTC; docs/benchmarks.md, gemm,
# "Beyond the goal's six shapes"): per output element of a wave, on the seven shapes of 512 rows or more with
# K >= 4096, a 128x128 tile took 1.02-1.16x (median 1.07) the time of a 128x256 and a 128x64 1.43-1.75x (median
# 1.57), leaving out one 128x256 point far off its other runs: speeds 0.93 and 0.66 (0.64 picks the same tile for
# every shape of the survey, the goal and the tests).  The SM count is the H100 SXM's 132, a constant rather than
# the device's, so that a cache prewarmed without a GPU holds the kernels the device picks (an H100 PCIe, 114
# SMs, gets the same choices, slightly off its own optimum).
WAVE_SMS = 132
# A decode step streams b through few tiles, one an SM, each bound by its SM's bandwidth and its K loop: the
# lent H100's decode sweep (2026-11-22 20:13 UTC, rows 1-64) ran N = 14336 best on 64x128 tiles (112 of them;
# x0.97-1.01 of torch.matmul, 64x64 x0.88-0.94) and N = 8192 on 64x64 (128 tiles; x0.89-0.98, 64x128
# x0.77-0.87).  64x32 tiles won nowhere.
DECODE_WIDE_TILES = 99  # 3/4 of WAVE_SMS
WAVE_TILES = {"large": (128, 256, 1.0), "medium": (128, 128, 0.93), "small": (128, 64, 0.66)}


def _wave_cost(bucket: str, m: int, n: int) -> float:
    tile_m, tile_n, speed = WAVE_TILES[bucket]
    tiles = -(-m // tile_m) * -(-n // tile_n)
    return -(-tiles // WAVE_SMS) * tile_m * tile_n / speed


def _bucket(m: int, n: int, k: int) -> str:
    """Which tile configuration (measured on the lent H100: docs/benchmarks.md, gemm).  Shapes repeat, so the
    answer is memoized (the shape class runs on every call), but not for torch.compile's symbolic sizes, which
    cannot be hashed."""
    if type(m) is int and type(n) is int and type(k) is int:
        return _memoized_bucket(m, n, k)
    return _choose_bucket(m, n, k)


def _choose_bucket(m: int, n: int, k: int) -> str:
    if m <= 64 and n >= 4096:  # one to 64 rows against a wide matrix (a decode step): 64-row tiles, 128 wide
        # where that still gives 3/4 of the SMs a tile, else 64 wide (bench_gemm.py --sweep-decode)
        return "decode" if -(-n // 128) >= DECODE_WIDE_TILES else "decode_narrow"
    if m <= 256 and n >= 4096:  # a few rows against a wide matrix: streaming b is the cost
        return "skinny"
    tiles = -(-m // 128) * -(-n // 256)
    if tiles >= 2 * WAVE_SMS and k <= 1024:  # two full waves of 128x256 tiles or more, and a short K
        return "large_short_k"
    return min(WAVE_TILES, key=lambda bucket: _wave_cost(bucket, m, n))


_memoized_bucket = functools.lru_cache(maxsize=4096)(_choose_bucket)


# ---- which implementation runs a CUDA call -------------------------------------------------------------------
KERNEL = "kernel"                  # jitops' 2-D kernels
CUBLAS_BATCHED = "cublas_batched"  # 16-bit operands with batch dimensions on b: torch.matmul
CUBLAS_TF32 = "cublas_tf32"        # float32, TF32 allowed: torch.matmul (cuBLAS) on TF32 tensor cores
CUBLAS_FP32 = "cublas_fp32"        # float32, TF32 not allowed: torch.matmul (cuBLAS) in full fp32


def cuda_route(dtype: torch.dtype, batched: bool, allow_tf32: bool) -> str | None:
    """Which implementation runs a CUDA gemm or linear in `dtype` (None: a dtype jitops rejects on CUDA).
    `batched`: b has batch dimensions that are not all 1, so the call does not fold into one 2-D GEMM.
    `allow_tf32`: torch.backends.cuda.matmul.allow_tf32 at the call.  float32 always runs through cuBLAS for now;
    the route names which precision torch.matmul will use (it reads the same flag), and lands in the shape
    class, so explain and manifests say which."""
    if dtype is torch.float32:
        return CUBLAS_TF32 if allow_tf32 else CUBLAS_FP32
    if dtype is torch.bfloat16 or dtype is torch.float16:
        return CUBLAS_BATCHED if batched else KERNEL
    return None


def aten_class(dtype: torch.dtype, out: torch.dtype, route: str, fused: bool) -> GemmClass:
    """The class of a CUDA call that runs through ATen (cuBLAS): no kernels to build."""
    return GemmClass(dtype, out, True, True, 1, route, fused, "aten")


def _allow_tf32() -> bool:
    """torch.backends.cuda.matmul.allow_tf32, read the way that costs 0.2 us (the attribute costs 1.5 us on the
    dev box): "high" and "medium" are the precisions that set it."""
    return torch.get_float32_matmul_precision() != "highest"


def batch_shape(a: torch.Tensor, b: torch.Tensor) -> tuple[int, ...] | None:
    """The broadcast batch dimensions of a matmul of a and b, None where they do not broadcast.  In Python:
    torch.broadcast_shapes costs 20 us a call on the dev box."""
    x, y = tuple(a.shape[:-2]), tuple(b.shape[:-2])
    if not y or x == y:
        return x
    if not x:
        return y
    if len(x) < len(y):
        x, y = y, x
    y = (1,) * (len(x) - len(y)) + y
    out = []
    for p, q in zip(x, y):
        if p != q and p != 1 and q != 1:
            return None
        out.append(q if p == 1 else p)
    return tuple(out)


def out_shape(a: torch.Tensor, b: torch.Tensor) -> tuple[int, ...]:
    """torch.matmul's output shape: the broadcast batch dimensions, then a's rows and b's columns (none for a
    1-D operand)."""
    if a.dim() == 2 and b.dim() == 2:
        return (a.shape[0], b.shape[1])
    batch = batch_shape(a, b)
    if batch is None:
        raise ValueError(f"jitops.gemm: the batch dimensions of argument 'a' {tuple(a.shape[:-2])} and 'b' "
                         f"{tuple(b.shape[:-2])} do not broadcast (shapes {tuple(a.shape)} and {tuple(b.shape)})")
    return (*batch, *a.shape[-2:-1], *(b.shape[-1:] if b.dim() > 1 else ()))


def _folds(b: torch.Tensor) -> bool:
    """Whether a call with this b is one 2-D GEMM: b 1-D, 2-D, or with batch dimensions that are all 1."""
    return b.dim() <= 2 or all(s == 1 for s in b.shape[:-2])


def fold_a(a: torch.Tensor, k: int) -> torch.Tensor:
    """a (..., K) as the GEMM's (M, K) operand: a view where the leading dimensions collapse (any contiguous a),
    else a copy (reshape)."""
    if a.dim() == 2:
        return a
    if a.dim() == 1:
        return a.unsqueeze(0)
    return a.reshape(math.prod(a.shape[:-1]), k)


def _folded_layout(a: torch.Tensor, m: int, k: int) -> tuple[bool, int] | None:
    """_layout of fold_a(a), read from a's strides without making the view (3 us); None where fold_a copies
    because a's leading dimensions do not collapse into one (each stride the next one's times its size, sizes of
    1 aside: as torch's view decides)."""
    if a.dim() == 2:
        return _layout(a, m, k)
    strides = a.stride()
    if a.dim() == 1:  # a row: unsqueeze(0)'s strides
        return layout_of(k * strides[0], strides[0], 1, k)
    row = expected = None
    for size, stride in zip(reversed(a.shape[:-1]), reversed(strides[:-1])):
        if size == 1:
            continue
        if expected is not None and stride != expected:
            return None
        row = stride if row is None else row
        expected = stride * size
    return layout_of(k if row is None else row, strides[-1], m, k)


def fold_b(b: torch.Tensor) -> torch.Tensor:
    """b as the GEMM's (K, N) operand: a 1-D b is a column; batch dimensions of size 1 are dropped (a view)."""
    if b.dim() == 1:
        return b.unsqueeze(-1)
    return b if b.dim() == 2 else b.view(b.shape[-2], b.shape[-1])


def _check(a, b, bias, activation, out_dtype) -> None:
    """The slow path of the shape class: say exactly what is wrong, naming the argument."""
    shapes.check_tensor("gemm", "a", a)
    shapes.check_tensor("gemm", "b", b)
    if bias is not None:
        shapes.check_tensor("gemm", "bias", bias)
    if activation not in ACTIVATIONS:
        raise ValueError(f"jitops.gemm: argument 'activation' is {activation!r}; use None, 'relu', 'gelu' or "
                         "'gelu_tanh'")
    for name, t in (("a", a), ("b", b)):
        if t.dim() == 0:
            raise ValueError(f"jitops.gemm: argument '{name}' is a 0-d tensor; like torch.matmul, jitops.gemm takes "
                             "operands of one dimension or more (multiply by a scalar with *)")
    k, kb = a.shape[-1], b.shape[0] if b.dim() == 1 else b.shape[-2]
    if k != kb:
        raise ValueError(f"jitops.gemm: K mismatch: argument 'a' has shape {tuple(a.shape)} (K = {k}) but 'b' has "
                         f"shape {tuple(b.shape)} (K = {kb}); b must be (..., K, N) or (K,)")
    if batch_shape(a, b) is None:
        raise ValueError(f"jitops.gemm: the batch dimensions of argument 'a' {tuple(a.shape[:-2])} and 'b' "
                         f"{tuple(b.shape[:-2])} do not broadcast (shapes {tuple(a.shape)} and {tuple(b.shape)})")
    allowed = CPU_DTYPES if a.is_cpu else CUDA_ACCEPTED
    shapes.check_dtype("gemm", "a", a, allowed)
    shapes.check_same_dtype("gemm", ("a", a), ("b", b), ("bias", bias))
    if bias is not None and b.dim() == 1:
        raise ValueError("jitops.gemm: argument 'bias' is given but 'b' is 1-D (a vector): the output has no "
                         "column dimension to add a bias to; add it to the result instead")
    if bias is not None and tuple(bias.shape) != (b.shape[-1],):
        raise ValueError(f"jitops.gemm: argument 'bias' has shape {tuple(bias.shape)}, expected ({b.shape[-1]},): "
                         "one value per output column")
    if out_dtype is not None and out_dtype not in (a.dtype, torch.float32):
        raise TypeError(f"jitops.gemm: argument 'out_dtype' is {out_dtype}; use None (the inputs' dtype "
                        f"{a.dtype}) or torch.float32")
    m = math.prod(a.shape[:-1]) if _folds(b) else max(a.shape[-2:-1], default=1)
    if max(m, k, b.shape[-1]) > INT32_MAX:
        raise ValueError(f"jitops.gemm: M, N and K must each be below 2**31, got {tuple(a.shape)} x "
                         f"{tuple(b.shape)}")
    raise AssertionError("jitops.gemm: _check found nothing wrong")  # pragma: no cover - callers saw a problem


def shape_class(a, b, bias, activation, out_dtype) -> GemmClass:
    # Runs on every call: plain comparisons first, _check (which builds the messages) only on failure.
    if (type(a) is not torch.Tensor and not isinstance(a, torch.Tensor)) or \
            (type(b) is not torch.Tensor and not isinstance(b, torch.Tensor)) or \
            a.dim() != 2 or b.dim() != 2 or activation not in ACTIVATIONS:
        return _matmul_class(a, b, bias, activation, out_dtype)
    m, k = a.shape
    k2, n = b.shape
    dtype = a.dtype
    out = dtype if out_dtype is None else out_dtype
    if k != k2 or b.dtype != dtype or (bias is not None and (bias.dtype != dtype or bias.shape != (n,))) or \
            (out is not dtype and out is not torch.float32) or m > INT32_MAX or n > INT32_MAX or k > INT32_MAX:
        _check(a, b, bias, activation, out_dtype)
    fused = bias is not None or activation is not None
    if a.is_cpu:
        if dtype not in CPU_DTYPES:
            _check(a, b, bias, activation, out_dtype)
        return GemmClass(dtype, out, True, True, 1, "cpu", fused, "cpu")
    if dtype is not torch.bfloat16 and dtype is not torch.float16:
        return _matmul_class(a, b, bias, activation, out_dtype)
    if not (m and n and k):  # nothing to multiply: run_cuda needs no kernel
        return GemmClass(dtype, out, True, True, 8, "empty", fused, "auto")
    return class_from_layouts(dtype, out, m, n, k, a, _layout(a, m, k), b, _layout(b, k, n), bias, fused)


def _matmul_class(a, b, bias, activation, out_dtype) -> GemmClass:
    """The class of every call but a 2-D one in 16 bits (or on the CPU): torch.matmul's operand forms (1-D, N-D,
    broadcast batch dimensions), and float32 on CUDA.  A call that folds into one 2-D GEMM gets the class of that
    2-D problem, so it shares its kernels."""
    if (type(a) is not torch.Tensor and not isinstance(a, torch.Tensor)) or \
            (type(b) is not torch.Tensor and not isinstance(b, torch.Tensor)) or \
            a.dim() == 0 or b.dim() == 0 or activation not in ACTIVATIONS:
        _check(a, b, bias, activation, out_dtype)
    k = a.shape[-1]
    n = b.shape[-1] if b.dim() > 1 else 1
    dtype = a.dtype
    out = dtype if out_dtype is None else out_dtype
    if k != (b.shape[0] if b.dim() == 1 else b.shape[-2]) or b.dtype != dtype or \
            (bias is not None and (b.dim() == 1 or bias.dtype != dtype or bias.shape != (n,))) or \
            (out is not dtype and out is not torch.float32):
        _check(a, b, bias, activation, out_dtype)
    if batch_shape(a, b) is None:
        _check(a, b, bias, activation, out_dtype)
    fused = bias is not None or activation is not None
    if a.is_cpu:
        if dtype not in CPU_DTYPES:
            _check(a, b, bias, activation, out_dtype)
        return GemmClass(dtype, out, True, True, 1, "cpu", fused, "cpu")
    folds = _folds(b)
    route = cuda_route(dtype, not folds, dtype is torch.float32 and _allow_tf32())
    if route is None:
        _check(a, b, bias, activation, out_dtype)
    if route != KERNEL:
        return aten_class(dtype, out, route, fused)
    m = math.prod(a.shape[:-1])
    if m > INT32_MAX or n > INT32_MAX or k > INT32_MAX:
        _check(a, b, bias, activation, out_dtype)
    if not (m and n and k):
        return GemmClass(dtype, out, True, True, 8, "empty", fused, "auto")
    la = _folded_layout(a, m, k)  # None: run_cuda copies a to a contiguous (M, K)
    if b.dim() == 2:
        lb = _layout(b, k, n)
    else:  # a column (K, 1), or (..., K, N) with batch dimensions all 1: the last two dimensions' strides
        lb = layout_of(b.stride(-1), 1, k, 1) if b.dim() == 1 else layout_of(b.stride(-2), b.stride(-1), k, n)
    return class_from_layouts(dtype, out, m, n, k, a, la, b, lb, bias, fused)


def class_from_layouts(dtype: torch.dtype, out: torch.dtype, m: int, n: int, k: int, a: torch.Tensor,
                       la: tuple[bool, int] | None, b: torch.Tensor, lb: tuple[bool, int] | None, bias, fused: bool
                       ) -> GemmClass:
    """The class of a checked, non-empty CUDA problem whose operands start at a's and b's addresses with the
    layouts la and lb (None: copied to a contiguous matrix first).  jitops.linear computes its layouts from
    strides without making 2-D views, and lands on the same classes (and kernels) as jitops.gemm."""
    # Every row start, leading dimension and contiguous extent, in elements; the output is (M, N) contiguous.
    # An operand no kernel can read in place (None) is copied to a fresh contiguous (row-major) matrix.
    # a or b None: an operand the caller allocates itself (a fresh, aligned tensor).
    units = n | (la[1] | (_address_units(a) if a is not None else 8) if la is not None else k)
    units |= lb[1] | (_address_units(b) if b is not None else 8) if lb is not None else n
    a_kmajor = la is None or la[0]
    b_kmajor = lb is not None and not lb[0]
    units |= (k if a_kmajor else m) | (k if b_kmajor else n)
    if bias is not None:
        units |= _address_units(bias) if bias.stride(0) == 1 else 8
    align = 8 if units % 8 == 0 else 4 if units % 4 == 0 else 2 if units % 2 == 0 else 1
    return GemmClass(dtype, out, a_kmajor, b_kmajor, align, _bucket(m, n, k), fused, _family)


# ---- kernels --------------------------------------------------------------------------------------------------
class Sm90Config(NamedTuple):
    tile: tuple[int, int, int]
    cluster: tuple[int, int]
    pingpong: bool
    streamk: bool
    swizzle: int = 1  # run-time arguments of the tile scheduler (not part of the build): tile swizzle, and
    raster: int = 0   # the order tiles are visited in: 0 CUTLASS's heuristic (along the shorter side), 1 M, 2 N
    # Stream-K builds only (run-time too): 0 CUTLASS's heuristic, 1 data-parallel, 2 split-K into `splits`
    # slices of K, 3 stream-K.
    decomposition: int = 0
    splits: int = 1


class Sm80Config(NamedTuple):
    tile: tuple[int, int, int]
    warp: tuple[int, int, int]
    stages: int

    @property
    def threads(self) -> int:
        return (self.tile[0] // self.warp[0]) * (self.tile[1] // self.warp[1]) * 32

    def smem_bytes(self, element_size: int = 2) -> int:
        tm, tn, tk = self.tile
        return self.stages * (tm * tk + tk * tn) * element_size


# Size bucket -> configuration.  Measured on the lent H100: docs/benchmarks.md.
# bf16 on the lent H100, 2026-11-22, `bench_gemm.py --tune` (TFLOP/s; torch.matmul 630-695 in the same run):
#   4096^3: 128x256 cooperative 2x1, swizzle 8: 693 (swizzle 1: 662; 256x128 1x2: 680; 128x128 ping-pong: 635);
#   4000^3: 128x256 swizzle 8: 648 (swizzle 1: 613); 8192x8192x1024: 128x128 ping-pong 2x1: 651, 128x256: 602;
#   128x8192x8192: 128x64 cooperative 1x2 (A multicast): 332, 128x64 1x1: 329, 128x128 stream-K: 282.
# 16384x2048x4096 (8 tile columns) did better with swizzle 1 (607 in one run) than 8 (598 in the next): _swizzle.
# `bench_gemm.py --sweep-survey` (19:52 UTC; time against torch.matmul's): with 1 to 32 rows and N = 14336 the
# 64x128 ping-pong tile ran at 0.97-1.04x (the 128x64 cooperative 0.47-0.79x); squares of 256-1024 ran best on
# 128x64 tiles (0.70-0.78x; 128x128 stream-K, the small bucket before: 0.44-0.58x); 512- to 2048-row layers on
# 128x128 or 128x256 tiles by the wave model (0.94-1.09x; stream-K 0.75-0.87x).  Split-K and stream-K lost
# nearly everywhere to their fix-up (the partial tiles' reduction); the stream-K build stays for sweeps.
# `--sweep-skinny` (20:25): the skinny bucket's 128x64 tile without a cluster ran x0.90-0.97 of torch.matmul on
# 128-256 rows against 4096-14336 columns, with the 1x2 cluster (A multicast) x0.73-0.98 (x0.73 at 128x4096x4096);
# on the goal's 128x8192x8192 both x0.97.  The small bucket keeps the cluster: there it measured better (19:52).
SM90_CONFIGS = {
    "large": Sm90Config((128, 256, 64), (2, 1), pingpong=False, streamk=False, swizzle=8),
    "large_short_k": Sm90Config((128, 128, 64), (2, 1), pingpong=True, streamk=False),
    "medium": Sm90Config((128, 128, 64), (2, 1), pingpong=False, streamk=False),
    "small": Sm90Config((128, 64, 64), (1, 2), pingpong=False, streamk=False),
    "skinny": Sm90Config((128, 64, 64), (1, 1), pingpong=False, streamk=False),
    "decode": Sm90Config((64, 128, 64), (1, 1), pingpong=True, streamk=False),
    "decode_narrow": Sm90Config((64, 64, 64), (1, 1), pingpong=True, streamk=False),
}
# CUTLASS 2 (sm_80 family): two configurations; the buckets below large share the 128x128 one.
SM80_LARGE = Sm80Config((128, 256, 32), (64, 64, 32), 3)
SM80_SMALL = Sm80Config((128, 128, 32), (64, 64, 32), 4)
SM80_CONFIGS = {bucket: SM80_LARGE if bucket.startswith("large") else SM80_SMALL for bucket in SM90_CONFIGS}
# 2-byte alignment: cp.async copies 4, 8 or 16 bytes, so this class takes CUTLASS's two-stage register-staged
# mainloop, with smaller warp tiles (64x64 spilled at 255 registers).
SM80_ALIGN1 = Sm80Config((128, 128, 32), (64, 32, 32), 2)

# The sm_90a kernel, compiled by NVRTC (kernels/gemm/sm90_gemm_kernel.cu); its host side is Python's
# (jitops/cutlass_host.py): nvcc's host half (cudafe++ and gcc over CUTLASS's host code) was about a third of a
# 70 s build on 2 cores (docs/benchmarks.md, "CUTLASS 3 through NVRTC").
SM90_GEMM = CudaKernel(
    "gemm_sm90", Source.file("gemm/sm90_gemm_kernel.cu"), "cutlass::device_kernel<jitops_gemm::GemmKernel>", (),
    arch_specific=True, defines=True)
# The same kernel with CUTLASS's own host code, built by nvcc into a C library: the reference of the GPU test
# that compares the two bit for bit, and the stream-K scheduler of bench_gemm's sweeps (whose host logic the
# Python side does not mirror).
SM90_GEMM_REFERENCE = CudaLibrary(
    "gemm_sm90_reference", Source.file("gemm/sm90_gemm.cu"),
    functions={
        "jitops_gemm_run": (("ptr", "ptr", "ptr", "ptr", "i32", "i32", "i32", "i64", "i64", "i64", "i32", "i32",
                             "i32", "i32", "i32", "i32", "ptr", "ptr"), "i32"),
        "jitops_gemm_workspace": (("i32", "i32", "i32", "i32", "i32", "i32", "i32", "i32"), "i64"),
    },
    arch_specific=True)
SM80_GEMM = CudaKernel(
    "gemm_sm80", Source.file("gemm/sm80_gemm.cu"),
    "jitops_gemm::gemm_sm80<{T}, {OUT}, {A_KMAJOR}, {B_KMAJOR}, {TM}, {TN}, {TK}, {WM}, {WN}, {WK}, {STAGES}, "
    "{ALIGN}, {SMEM}>",
    "ptr ptr ptr ptr i32 i32 i32 i64 i64 i64 i32")


def _sm90_params(cls: GemmClass, config: Sm90Config) -> dict:
    (tm, tn, tk), (cm, cn) = config.tile, config.cluster
    return dict(
        GEMM_T=CUTLASS_TYPES[cls.dtype], GEMM_OUT=CUTLASS_TYPES[cls.out_dtype],
        GEMM_A_KMAJOR=int(cls.a_kmajor), GEMM_B_KMAJOR=int(cls.b_kmajor), GEMM_TILE_M=tm, GEMM_TILE_N=tn,
        GEMM_TILE_K=tk, GEMM_CLUSTER_M=cm, GEMM_CLUSTER_N=cn, GEMM_PINGPONG=int(config.pingpong),
        GEMM_STREAMK=int(config.streamk), GEMM_FUSED=int(cls.fused))


def sm90_request(cls: GemmClass, config: Sm90Config):
    """The NVRTC build; a stream-K configuration (bench_gemm's sweeps) gets the nvcc library, whose host code
    has CUTLASS's stream-K logic."""
    if config.streamk:
        return sm90_reference_request(cls, config)
    return SM90_GEMM.bind(shapes.dtype_name(cls.dtype), **_sm90_params(cls, config))


def sm90_reference_request(cls: GemmClass, config: Sm90Config):
    """The nvcc-built library of the same kernel with CUTLASS's host code (bit-for-bit reference)."""
    return SM90_GEMM_REFERENCE.bind(shapes.dtype_name(cls.dtype), **_sm90_params(cls, config))


def sm80_config(cls: GemmClass) -> Sm80Config:
    return SM80_ALIGN1 if cls.align == 1 else SM80_CONFIGS[cls.bucket]


def sm80_request(cls: GemmClass, config: Sm80Config):
    (tm, tn, tk), (wm, wn, wk) = config.tile, config.warp
    return SM80_GEMM.bind(
        shapes.dtype_name(cls.dtype), T=CUTLASS_TYPES[cls.dtype], OUT=CUTLASS_TYPES[cls.out_dtype],
        A_KMAJOR=str(cls.a_kmajor).lower(), B_KMAJOR=str(cls.b_kmajor).lower(), TM=tm, TN=tn, TK=tk, WM=wm,
        WN=wn, WK=wk, STAGES=config.stages, ALIGN=cls.align, SMEM=config.smem_bytes())


def uses_sm90(cls: GemmClass, target: Target) -> bool:
    return cls.family == "auto" and target.capability is not None and target.capability[0] == 9 and cls.align == 8


def cuda_kernels(cls: GemmClass, target: Target):
    if cls.bucket == "empty" or cls.family == "aten":  # nothing to multiply, or cuBLAS (cuda_route)
        return {}
    if uses_sm90(cls, target):
        if settings.gemm_sm90_kernel == "light" and light_gemm.unsupported(cls) is None:  # opt-in; else CUTLASS
            return {"sm90_light": light_gemm.request(cls)}
        return {"sm90": sm90_request(cls, SM90_CONFIGS[cls.bucket])}
    return {"sm80": sm80_request(cls, sm80_config(cls))}


# ---- running on the GPU ---------------------------------------------------------------------------------------
_STATUS = ["success", "misaligned operand", "invalid data type", "invalid layout", "invalid problem",
           "not supported", "workspace null", "internal error", "arch mismatch", "insufficient driver",
           "memory allocation", "invalid"]


def _operand(t: torch.Tensor, rows: int, cols: int) -> tuple[torch.Tensor, bool, int]:
    found = _layout(t, rows, cols)
    if found is None:
        t = t.contiguous()
        return t, True, cols
    return t, found[0], found[1]


@functools.lru_cache(maxsize=4096)  # run_sm90 asks on every call; shapes repeat
def _swizzle(config: Sm90Config, m: int, n: int) -> int:
    """The scheduler's tile swizzle: the configuration's, but 1 when there are fewer than 16 tile rows or columns,
    and halved until it divides both counts.  CUTLASS pads the swizzled side's tiles to a multiple of the swizzle
    with empty tiles: 512x14336x4096 (4 tile rows) ran at 194.6 us with swizzle 8 against 96.3 for torch.matmul
    (lent H100, 2026-11-22 20:04, the survey)."""
    tiles_m, tiles_n = -(-m // config.tile[0]), -(-n // config.tile[1])
    swizzle = config.swizzle if min(tiles_m, tiles_n) >= 16 else 1
    while swizzle > 1 and (tiles_m % swizzle or tiles_n % swizzle):
        swizzle //= 2
    return swizzle


def sm90_host(kernel: CudaFunction, cls: GemmClass, config: Sm90Config) -> Sm90Gemm:
    """The Python host side of an NVRTC-built sm_90a kernel (jitops/cutlass_host.py), made once per loaded
    kernel and kept on it."""
    host = kernel.__dict__.get("sm90_host")
    if host is None:
        facts = GemmConfig(cls.dtype.itemsize, cls.out_dtype, cls.a_kmajor, cls.b_kmajor, config.tile,
                           config.cluster, cls.fused, epilogue_tile(config.tile, config.pingpong, cls.out_dtype))
        host = kernel.__dict__.setdefault("sm90_host", Sm90Gemm(kernel, facts))
    return host


def run_sm90(kernel, cls: GemmClass, config: Sm90Config, a, b, out, bias, m, n, k, lda, ldb, activation: int,
             swizzle: int | None = None, raster: int | None = None, decomposition: int | None = None,
             splits: int | None = None) -> None:
    """One sm_90a GEMM: the NVRTC kernel through its Python host side, or (stream-K sweeps, the bit-for-bit
    reference) the nvcc library through CUTLASS's host code."""
    device = out.get_device()
    swizzle = swizzle or _swizzle(config, m, n)
    raster = config.raster if raster is None else raster
    if type(kernel) is CudaFunction:
        host = kernel.__dict__.get("sm90_host") or sm90_host(kernel, cls, config)
        host.run(a.data_ptr(), b.data_ptr(), out.data_ptr(), 0 if bias is None else bias.data_ptr(), m, n, k,
                 lda, ldb, n, activation, swizzle, raster, sm_count(device),
                 current_stream(device))
        return
    run_sm90_reference(kernel, cls, config, a, b, out, bias, m, n, k, lda, ldb, activation, swizzle, raster,
                       decomposition, splits)


def run_sm90_reference(lib, cls: GemmClass, config: Sm90Config, a, b, out, bias, m, n, k, lda, ldb,
                       activation: int, swizzle: int | None = None, raster: int | None = None,
                       decomposition: int | None = None, splits: int | None = None) -> None:
    """The nvcc-built library (SM90_GEMM_REFERENCE): CUTLASS's host code makes Params and launches."""
    device = out.get_device()
    ensure_context(device)  # autograd's backward thread may have none; CUTLASS's host code needs one
    swizzle = swizzle or _swizzle(config, m, n)
    raster = config.raster if raster is None else raster
    decomposition = config.decomposition if decomposition is None else decomposition
    splits = config.splits if splits is None else splits
    workspace = None
    sms = sm_count(device)
    if config.streamk:
        size = lib.jitops_gemm_workspace(m, n, k, swizzle, raster, decomposition, splits, sms)
        if size > 0:
            workspace = torch.empty(size, dtype=torch.uint8, device=out.device)
    status = lib.jitops_gemm_run(a, b, out, bias, m, n, k, lda, ldb, n, activation, swizzle, raster,
                                 decomposition, splits, sms, workspace, current_stream(device))
    if status:
        what = _STATUS[status] if status < len(_STATUS) else f"CUDA error {status - 1000}"
        raise RuntimeError(f"jitops.gemm: the sm_90 kernel {config} for {cls} failed on a ({m}, {k}) x ({k}, {n}) "
                           f"problem: {what} (status {status})")


def sm80_grid(m: int, n: int, config: Sm80Config) -> tuple[int, int, int]:
    """GemmIdentityThreadblockSwizzle<8>::get_grid_shape: tiles along M, interleaved by 2**log_tile along N."""
    tiles_m, tiles_n = -(-m // config.tile[0]), -(-n // config.tile[1])
    log_tile = 3 if tiles_n >= 6 else 2 if tiles_n >= 3 else 1 if tiles_n >= 2 else 0
    return tiles_m << log_tile, (tiles_n + (1 << log_tile) - 1) >> log_tile, 1


def run_sm80(kernel, cls: GemmClass, config: Sm80Config, a, b, out, bias, m, n, k, lda, ldb,
             activation: int) -> None:
    if bias is not None and bias.dtype != out.dtype:
        bias = bias.to(out.dtype)  # the bias is the epilogue's source operand, which has the output's type
    kernel.launch(sm80_grid(m, n, config), config.threads, a, b, out, bias, m, n, k, lda, ldb, n, activation,
                  shared_mem=config.smem_bytes())


def _epilogue_only(out: torch.Tensor, bias, activation) -> torch.Tensor:
    """K = 0: the product is zero and only the epilogue remains."""
    z = torch.zeros(out.shape, dtype=torch.float32, device=out.device)
    if bias is not None:
        z = z + bias.float()
    out.copy_(_activate(z, activation))
    return out


def run_cuda(kernels, a, b, bias, activation, out_dtype) -> torch.Tensor:
    cls = kernels.shape_class
    if cls.family == "aten":  # float32, or a batched product: cuBLAS (cuda_route)
        return torch_gemm(kernels, a, b, bias, activation, out_dtype)
    try:
        (m, k), (_, n) = a.shape, b.shape
    except ValueError:  # N-D or 1-D operands that fold into one 2-D GEMM
        return _run_folded(kernels, a, b, bias, activation)
    return _run_2d(cls, kernels, a, b, bias, activation, m, n, k)


def _run_2d(cls: GemmClass, kernels, a, b, bias, activation, m: int, n: int, k: int) -> torch.Tensor:
    out = torch.empty((m, n), dtype=cls.out_dtype, device=a.device)
    if m == 0 or n == 0:
        return out
    if k == 0:
        return _epilogue_only(out, bias, activation)
    a, _, lda = _operand(a, m, k)
    b, _, ldb = _operand(b, k, n)
    launch(kernels, a, b, out, bias, m, n, k, lda, ldb, ACTIVATIONS[activation])
    return out


def _run_folded(kernels, a, b, bias, activation) -> torch.Tensor:
    """A call whose b is 2-D (or 1-D, or with batch dimensions all 1) as the 2-D GEMM (M, K) x (K, N), M the
    product of a's leading sizes; the (M, N) result viewed as torch.matmul's output shape."""
    k = a.shape[-1]
    a2, b2 = fold_a(a, k), fold_b(b)
    out = _run_2d(kernels.shape_class, kernels, a2, b2, bias, activation, a2.shape[0], b2.shape[1], k)
    return out.view(out_shape(a, b))


def product_if_loaded(a: torch.Tensor, la: tuple[bool, int], b: torch.Tensor, lb: tuple[bool, int], m: int, n: int,
                      k: int, shape: tuple[int, ...]) -> torch.Tensor | None:
    """a . b as a new tensor of `shape` (M x N elements, row-major), launched straight on the kernels this
    process already loaded for the problem's class; None when they are not loaded (the caller then takes
    jitops.gemm, which loads them).  For backward passes on real CUDA tensors they made themselves: no views, no
    input checks, no routing (the linear backward's two GEMMs skip 4 tensor views and two public calls)."""
    cls = class_from_layouts(a.dtype, a.dtype, m, n, k, a, la, b, lb, None, False)
    kernels = _op.op.loaded(a.get_device(), cls)
    if kernels is None:
        return None
    out = a.new_empty(shape)
    launch(kernels, a, b, out, None, m, n, k, la[1], lb[1], 0)
    return out


def launch(kernels, a, b, out, bias, m: int, n: int, k: int, lda: int, ldb: int, activation: int) -> None:
    """out (M, N) = act(a . b + bias) with the loaded kernels of the class; a and b are read in place with the
    given leading dimensions (their layouts are the class's)."""
    cls = kernels.shape_class
    if bias is not None and bias.stride(0) != 1:
        bias = bias.contiguous()
    lib = kernels.__dict__.get("sm90")
    if lib is not None:
        run_sm90(lib, cls, SM90_CONFIGS[cls.bucket], a, b, out, bias, m, n, k, lda, ldb, activation)
    elif "sm90_light" in kernels.__dict__:
        device = out.get_device()
        light_gemm.run(kernels.sm90_light, a, b, out, bias, m, n, k, lda, ldb, activation, sm_count(device),
                       current_stream(device))
    else:
        run_sm80(kernels.sm80, cls, sm80_config(cls), a, b, out, bias, m, n, k, lda, ldb, activation)


# ---- CPU (ATen) -----------------------------------------------------------------------------------------------
def _activate(z: torch.Tensor, activation) -> torch.Tensor:
    if activation == "relu":
        return torch.relu(z)
    if activation in GELU_APPROXIMATE:
        return F.gelu(z, approximate=GELU_APPROXIMATE[activation])
    return z


def run_cpu(kernels, a, b, bias, activation, out_dtype) -> torch.Tensor:
    """The reference semantics through ATen: fp32 accumulation (fp64 for fp64), one rounding at the end."""
    cls = kernels.shape_class
    acc = torch.float64 if a.dtype == torch.float64 else torch.float32
    z = torch.matmul(a.to(acc), b.to(acc))
    if bias is not None:
        z = z + bias.to(acc)
    return _activate(z, activation).to(cls.out_dtype).contiguous()


def torch_gemm(kernels, a, b, bias, activation, out_dtype) -> torch.Tensor:
    """torch's matmul (cuBLAS on CUDA, which honours torch.backends.cuda.matmul.allow_tf32 for float32): the
    float32 and batched routes (cuda_route), and background mode's fallback.  fp32 outputs of 16-bit operands
    multiply in fp32."""
    if out_dtype is not None and out_dtype != a.dtype:
        z = torch.matmul(a.to(out_dtype), b.to(out_dtype))
        z = z + bias.to(out_dtype) if bias is not None else z
    elif a.dim() == 2 and b.dim() == 2:
        z = torch.addmm(bias, a, b) if bias is not None else torch.mm(a, b)
    else:
        z = torch.matmul(a, b)
        z = z + bias if bias is not None else z
    return _activate(z, activation).contiguous()


def cpu_kernels(cls: GemmClass, target: Target):
    return {}  # ATen: nothing to compile


def fake(a, b, bias, activation, out_dtype):
    return a.new_empty(out_shape(a, b), dtype=out_dtype or a.dtype)


# ---- autograd -------------------------------------------------------------------------------------------------
def setup_context(ctx, inputs, output) -> None:
    a, b, bias, activation, out_dtype = inputs
    ctx.activation = activation
    ctx.out_dtype = out_dtype
    ctx.bias_dtype = bias.dtype if bias is not None else None
    # dA needs B, dB needs A; relu's mask comes from the output; gelu recomputes its pre-activation.  (Only
    # tensors are saved: AOTAutograd drops saved Nones.)
    extra = output if activation == "relu" else bias if activation in GELU_APPROXIMATE and bias is not None else None
    ctx.save_for_backward(a, b, *([] if extra is None else [extra]))


def backward(ctx, grad: torch.Tensor):
    a, b, *extra = ctx.saved_tensors
    out = extra[0] if ctx.activation == "relu" else None
    bias = extra[0] if ctx.activation in GELU_APPROXIMATE and extra else None
    # Under AOTAutograd an omitted trailing bias is not an input at all: pad to (a, b, bias).
    need_a, need_b, need_bias = (tuple(ctx.needs_input_grad) + (False, False, False))[:3]
    if ctx.activation == "relu":
        grad = torch.where(out > 0, grad, torch.zeros((), dtype=grad.dtype, device=grad.device))
    elif ctx.activation in GELU_APPROXIMATE:  # through torch.ops only; jitops.gemm keeps the pre-activation
        z = _op(a, b, bias=bias, out_dtype=ctx.out_dtype)
        approximate = GELU_APPROXIMATE[ctx.activation]
        grad = torch.ops.aten.gelu_backward(grad, z, approximate=approximate) if grad.is_cpu else \
            gelu_backward(grad, z, approximate)
    grad_in = grad if grad.dtype == a.dtype else grad.to(a.dtype)
    if a.dim() == 2 and b.dim() == 2:
        grad_a = _op(grad_in, b.t()) if need_a else None    # (M, N) x (N, K): B^T is a stride view
        grad_b = _op(a.t(), grad_in) if need_b else None    # (K, M) x (M, N): A^T is a stride view
    else:
        grad_a, grad_b = _matmul_grads(grad_in, a, b, need_a, need_b)
    grad_bias = None
    if need_bias:  # summed over every dimension but the last (the output's columns)
        acc = torch.float32 if grad.dtype != torch.float64 else torch.float64
        grad_bias = grad.to(acc) if grad.dim() == 1 else grad.sum(tuple(range(grad.dim() - 1)), dtype=acc)
        grad_bias = grad_bias.to(ctx.bias_dtype)
    return grad_a, grad_b, grad_bias


def _as_matrices(grad, a, b):
    """torch.matmul's operands as (..., M, K) and (..., K, N), and the output gradient as (..., M, N): a 1-D a
    is a row, a 1-D b a column (their dimension is missing from the output)."""
    g = grad.unsqueeze(-1) if b.dim() == 1 else grad
    g = g.unsqueeze(-2) if a.dim() == 1 else g
    return g, (a.unsqueeze(0) if a.dim() == 1 else a), (b.unsqueeze(-1) if b.dim() == 1 else b)


def _matmul_grads(grad, a, b, need_a: bool, need_b: bool):
    """torch.matmul's gradients: dA = dC . B^T and dB = A^T . dC on the matrices, summed over the batch
    dimensions each operand was broadcast along.  Where the call folds into one 2-D GEMM, so do both products:
    dB is one (K, M) x (M, N) GEMM over all of a's rows (the sum over the batch inside the GEMM)."""
    g, a2, b2 = _as_matrices(grad, a, b)
    grad_a = grad_b = None
    if need_a:  # (..., M, N) x (N, K), b2^T a stride view
        grad_a = _summed_product(g, b2.mT, a2.shape).reshape(a.shape)
    if need_b:
        if _folds(b):  # a's rows, all batches at once: (K, rows) x (rows, N)
            k, n = a2.shape[-1], b2.shape[-1]
            rows = math.prod(a2.shape[:-1])
            grad_b = _op(a2.reshape(rows, k).t(), g.reshape(rows, n)).reshape(b.shape)
        else:  # (..., K, M) x (..., M, N), a2^T a stride view
            grad_b = _summed_product(a2.mT, g, b2.shape).reshape(b.shape)
    return grad_a, grad_b


def _wide_dtype(x, y, shape) -> torch.dtype | None:
    """The out_dtype of x . y in a gradient of `shape`: float32 where 16-bit products are summed over broadcast
    batch dimensions afterwards, so that the gradient is rounded once, as torch's (rounding each product first
    put 5 of 50 elements of a bf16 OpInfo sample outside one bf16 rounding of the float64 reference)."""
    if x.dtype in CUDA_DTYPES and math.prod(out_shape(x, y)) != math.prod(shape):  # a real sum, not a view
        return torch.float32
    return None


def _summed_product(x, y, shape) -> torch.Tensor:
    """x . y summed to `shape`: over the batch dimensions the operand of that shape was broadcast along."""
    wide = _wide_dtype(x, y, shape)
    return _op(x, y, out_dtype=wide).sum_to_size(shape).to(x.dtype)


# ---- the backward's calls, for manifests and for compiling them while the forward runs ---------------------------
def companions(a, b, bias, activation, out_dtype, *, needs):
    """The GEMMs (and gelu's backward) that backward() above runs, assuming a contiguous (M, N) output gradient."""
    need_a, need_b = needs[0], needs[1]
    calls = []
    shape = out_shape(a, b)
    if activation in GELU_APPROXIMATE and (need_a or need_b or needs[2]):  # the pre-activation, recomputed
        calls.append((_op, (a, b, bias, None, out_dtype)))
        if not a.is_cpu:
            z = shapes.placeholder(a, shape, dtype=out_dtype or a.dtype)
            calls.append((gelu_backward, (shapes.placeholder(z, shape), z, GELU_APPROXIMATE[activation])))
    grad = shapes.placeholder(a, shape)  # the gradient reaches the GEMMs in the inputs' dtype
    if a.dim() == 2 and b.dim() == 2:
        if need_a:
            calls.append((_op, (grad, b.detach().t(), None, None, None)))    # dA = dC . B^T
        if need_b:
            calls.append((_op, (a.detach().t(), grad, None, None, None)))    # dB = A^T . dC
        return calls
    g, a2, b2 = _as_matrices(grad, a.detach(), b.detach())  # as _matmul_grads calls them
    if need_a:
        calls.append((_op, (g, b2.mT, None, None, _wide_dtype(g, b2.mT, a2.shape))))
    if need_b:
        if _folds(b):
            rows = math.prod(a2.shape[:-1])
            calls.append((_op, (shapes.placeholder(a, (rows, a2.shape[-1])).t(),
                                shapes.placeholder(a, (rows, b2.shape[-1])), None, None, None)))
        else:
            calls.append((_op, (a2.mT, g, None, None, _wide_dtype(a2.mT, g, b2.shape))))
    return calls


# ---- declaration ----------------------------------------------------------------------------------------------
_op = op(
    "jitops::gemm(Tensor a, Tensor b, Tensor? bias=None, str? activation=None, ScalarType? out_dtype=None) -> Tensor",
    shape_class=shape_class,
    cuda=Impl(cuda_kernels, run_cuda),
    cpu=Impl(cpu_kernels, run_cpu),
    fake=fake,
    setup_context=setup_context,
    backward=backward,
    keyword_only=("bias", "activation", "out_dtype"),
    companions=companions,
    doc=__doc__,
    fallback=torch_gemm,
)


def gemm(a, b, *, bias=None, activation=None, out_dtype=None):
    try:
        needs_grad = torch.is_grad_enabled() and (a.requires_grad or b.requires_grad or
                                                  (bias is not None and bias.requires_grad))
    except AttributeError:  # not tensors: the op names the argument
        needs_grad = False
    if needs_grad and not a.is_cpu and not torch.compiler.is_compiling():
        _op.op.prefetch(a, b, bias, activation, out_dtype)  # the backward's kernels build while the forward's do
    if needs_grad and activation in GELU_APPROXIMATE and not a.is_cpu:
        return gelu(_op(a, b, bias=bias, out_dtype=out_dtype), GELU_APPROXIMATE[activation])
    return _op(a, b, bias=bias, activation=activation, out_dtype=out_dtype)


gemm.__doc__ = __doc__
gemm.op = _op.op  # type: ignore[attr-defined]


def _public_calls(entry, args, grad):
    """What gemm() above calls: with a gradient to record, "gelu" on a GPU runs the GEMM with the bias fused and
    then jitops.gelu on its output."""
    a, b, bias, activation, out_dtype = args
    if grad and activation in GELU_APPROXIMATE and not a.is_cpu:
        z = shapes.placeholder(a, out_shape(a, b), dtype=out_dtype or a.dtype)
        return [(_op, (a, b, bias, None, out_dtype)), (gelu, (z, GELU_APPROXIMATE[activation]))]
    return [(_op, args)]


public("gemm", gemm, entries=(_op,), calls=_public_calls)

# Common shape classes, for `cache_tools prewarm --all-builtin` (manifest items): a large bf16 layer's forward
# (x @ w), which also builds its backward's two GEMMs (dC @ w^T, x^T @ dC).  Each is one NVRTC build on
# sm_90a (about 50 s on 2 cores), so the list stays short; other classes compile on first use.
PREWARM = [
    {"op": "gemm", "dtypes": ["bf16"], "shapes": [[[8192, 4096], [4096, 4096], None]],
     "kwargs": {"activation": None, "out_dtype": None}},
]
