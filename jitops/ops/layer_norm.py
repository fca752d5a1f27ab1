"""jitops.layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5), forward and backward.

Like torch.nn.functional.layer_norm: each row of n = prod(normalized_shape) trailing elements is normalized by
its mean and biased variance, then scaled by weight and shifted by bias (both shaped normalized_shape).

Three ops carry it.  The public function calls the first when a gradient is to be recorded (and returns y),
else the third:
    jitops::layer_norm_forward(x, normalized_shape, weight, bias, eps) -> (y, stats)
    jitops::layer_norm_backward(grad, x, stats, weight, normalized_shape, need_dx, need_dweight, need_dbias)
        -> (dx, dweight, dbias)
    jitops::layer_norm_inference(x, normalized_shape, weight, bias, eps) -> y    (same kernel, no stats written)
stats is (2, rows): the mean and 1/sqrt(var + eps) of every row, in float32 (float64 for float64 inputs),
saved for the backward.  The backward computes only the gradients autograd asks for; the ones not asked for
come back as empty tensors.  dweight and dbias are deterministic: per-block partial sums go to a workspace and
a second kernel adds them in a fixed order (no floating-point atomics), so the same inputs on the same device
give the same bits.  Double backward is not supported.

Dtypes: CUDA fp32, fp16, bf16 (statistics and arithmetic in fp32) and fp64 (NVRTC); CPU the same through
load_inline (sums in double; fp16 and bf16 by the fp32 kernel on fp32 copies, rounded once at the end).  weight and bias must have x's dtype.  n may be anything from 1 up (1, 7,
4097, 65536...), rows anything from 0 up.

Non-contiguous inputs: x, weight, bias (and the gradient in the backward) that are not contiguous are copied
to contiguous tensors first (one extra read and write of that tensor); the outputs are always contiguous.
The vector width is then chosen from the copies' alignment, so a strided x costs one copy, never a slow path.

Shape class (what changes the compiled code): dtype; the vector width, 16 bytes when every pointer and n allow
it, else the widest that they do (odd n: 1 element); the hidden-size bucket - threads per row (a power of two,
1 to 1024: many rows per block for short rows, a warp per row, or a block per row) and vectors per thread, so
that each thread keeps a tile of its row in registers between the statistics and the output (forward 128 bytes,
or 64 when 128 would leave the GPU too few threads; backward 64; fewer than SMALL_ROWS rows: one 16-byte vector a
thread, for latency), rows longer than the largest block's tiles streaming twice (the second pass from L2); and
the index width (32-bit below 2^30 elements).  The backward adds where dweight/dbias are summed: registers (rows
that fit in one tile), shared memory, or a column kernel for rows too long for either (n above about 20000 in
fp32/bf16/fp16, 10000 in fp64); and from 2 to FEW_ROWS (64) rows, a kernel that sums them column by column
straight from dy and x (no partial sums to write and reduce).  The benchmark set's buckets were measured on the
lent H100: docs/benchmarks.md.  See kernels/layer_norm.cu.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .. import shapes
from ..launch import UNCAPPED_GRID, sm_count
from ..op import Impl, op, public
from ..specs import CppExtension, CudaKernel, Source, Target

CUDA_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
CPU_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
CPU_COMPUTE = shapes.CPU_COMPUTE
STATS_DTYPE = {torch.float32: torch.float32, torch.float16: torch.float32, torch.bfloat16: torch.float32,
               torch.float64: torch.float64}
INT32_LIMIT = 2**30  # 32-bit index math below this many elements (row and grid offsets never pass 2^31)

# Tuning (the hidden-size buckets; benchmarks/bench_layer_norm.py --sweep): bytes of its row each thread keeps
# in registers, and the most threads per row.  The backward also keeps dweight/dbias sums for its columns, hence
# at most 512 threads (<= 128 registers each).  Fewer than SMALL_ROWS rows leave the GPU mostly idle and the
# time is one row's latency: then a row is spread one 16-byte vector per thread when it fits in one block.
# Sweep on the lent H100 (2026-11-22, bench_layer_norm.py --sweep, us ours/torch): forward tiles of 128 bytes
# against 64: (65536, 1024) bf16 98.8 vs 104.5 (torch 154.6), (4096, 4097) bf16 61.6 vs 72.2 (torch 97.5), the
# headline (16384, 8192) bf16 equal (198); backward tiles of 32 bytes against 64: the headline 356 vs 294 (torch
# 672), so 64.  Capping the forward grid at 4 blocks an SM instead of 16 cost 3-10%.  But 128-byte forward tiles
# leave short rows too few threads (second run, graph-timed): (4096, 128) bf16 5.7 us against 3.8 with 64 bytes,
# (65536, 128) bf16 14.3 against 12.9, (4096, 1024) bf16 8.1 against 7.1, where (4096, 1024) fp32 (32 threads a
# row, 131072 in all) gained, 11.7 against 12.9: hence FORWARD_BUSY_THREADS and FORWARD_MIN_WIDE_TPR.
FORWARD_TILE_BYTES = 128
FORWARD_BUSY_THREADS = 2**17  # 128-byte tiles need this many threads (rows x threads per row) and at least
FORWARD_MIN_WIDE_TPR = 8      # this many threads per row; otherwise 64-byte tiles
BACKWARD_TILE_BYTES = 64
FORWARD_MAX_TPR = 1024
BACKWARD_MAX_TPR = 512
SMALL_ROWS = 256
# From 2 to FEW_ROWS rows the backward's dweight/dbias come from layer_norm_param_grads (reads dy and x again,
# column-wise) instead of per-block partial sums plus their reduction (writes and re-reads 2 x rows x n floats).
# The last H100 run before it: (64, 1024) fp16/bf16 backward 4.5-4.6 us against torch's 4.3, the only rows of
# the benchmark set slower than torch.  One row keeps its one-kernel path (the row kernel writes them itself).
FEW_ROWS = 64
# dweight/dbias sums in shared memory ([2][n] of float) up to this size; sm_80 allows 163 KB a block.
PARAMS_SMEM_LIMIT = 160 * 1024
FORWARD_BLOCKS_PER_SM = 16  # grid cap of the (grid-stride) forward, in blocks per SM
REDUCE_ROWS = 16            # kernels/layer_norm.cu: layer_norm_reduce_partials threads down a column
COLUMN_THREADS = 128        # kernels/layer_norm.cu: layer_norm_backward_columns block


class ForwardClass(NamedTuple):
    dtype: torch.dtype
    vec: int      # elements per access
    tpr: int      # threads per row
    iters: int    # vectors per thread per row tile
    index: str    # "int" or "long long"


class BackwardClass(NamedTuple):
    dtype: torch.dtype
    vec: int
    tpr: int
    iters: int
    index: str
    params: int   # where dweight/dbias are summed: 1 registers, 2 shared memory, 0 layer_norm_backward_columns
    #               (all three + layer_norm_reduce_partials), 3 layer_norm_param_grads (few rows)


def _threads(tpr: int) -> int:
    return max(tpr, 128)


def _bucket(n: int, vec: int, itemsize: int, tile_bytes: int, max_tpr: int, small: bool) -> tuple[int, int]:
    """(threads per row, vectors per thread) for rows of n elements: as few threads (a power of two) as hold the
    row in `tile_bytes` each, then just enough vectors per thread; rows longer than max_tpr tiles stream."""
    chunks = n // vec
    if small and chunks <= max_tpr:
        return shapes.next_pow2(chunks), 1
    if itemsize == 8:  # float64 (correctness, not speed): registers for 64 bytes at most
        tile_bytes = min(tile_bytes, 64)
    iters_max = max(1, tile_bytes // max(vec * itemsize, 4))  # a 16-bit element alone still takes a register
    tpr = min(max_tpr, shapes.next_pow2(-(-chunks // iters_max)))
    return tpr, max(1, min(iters_max, -(-chunks // tpr)))


_ITEMSIZE = shapes.CUDA_ITEMSIZE
_Tensor = torch.Tensor
_FORWARD_CLASSES: dict[tuple, tuple["ForwardClass", "ForwardClass"]] = {}
_BACKWARD_CLASSES: dict[tuple, "BackwardClass"] = {}


def forward_class(dtype: torch.dtype, n: int, vec: int, rows: int, index: str) -> ForwardClass:
    """The class for `rows` rows of n: fewer than SMALL_ROWS rows take the few-rows bucket; otherwise 128-byte
    tiles when that leaves enough threads (FORWARD_BUSY_THREADS, FORWARD_MIN_WIDE_TPR), else 64-byte tiles."""
    small = rows < SMALL_ROWS
    key = (dtype, n, vec, small, index)
    pair = _FORWARD_CLASSES.get(key)
    if pair is None:
        itemsize = _ITEMSIZE[dtype]
        pair = _FORWARD_CLASSES[key] = tuple(
            ForwardClass(dtype, vec, *_bucket(n, vec, itemsize, tile, FORWARD_MAX_TPR, small), index)
            for tile in (FORWARD_TILE_BYTES, FORWARD_TILE_BYTES // 2))
    wide = small or (pair[0].tpr >= FORWARD_MIN_WIDE_TPR and rows * pair[0].tpr >= FORWARD_BUSY_THREADS)
    return pair[0] if wide else pair[1]


def backward_class(dtype: torch.dtype, n: int, vec: int, small: bool, index: str, few: bool = False) -> BackwardClass:
    key = (dtype, n, vec, small, index, few)
    cls = _BACKWARD_CLASSES.get(key)
    if cls is None:
        tpr, iters = _bucket(n, vec, _ITEMSIZE[dtype], BACKWARD_TILE_BYTES, BACKWARD_MAX_TPR, small)
        acc_size = 8 if dtype == torch.float64 else 4
        if few:
            params = 3
        elif n // vec <= tpr * iters:
            params = 1
        elif 2 * (_threads(tpr) // tpr) * n * acc_size <= PARAMS_SMEM_LIMIT:
            params = 2
        else:
            params = 0
        cls = _BACKWARD_CLASSES[key] = BackwardClass(dtype, vec, tpr, iters, index, params)
    return cls


def clear_buckets() -> None:
    """Forget the memoized classes (after changing the tuning constants above)."""
    _FORWARD_CLASSES.clear()
    _BACKWARD_CLASSES.clear()


# ---- input checks (every error names the argument) -----------------------------------------------------------
def _row_length(op_name: str, x: torch.Tensor, normalized_shape) -> int:
    """n = prod(normalized_shape), which must equal x's trailing dimensions."""
    if len(normalized_shape) == 1 and x.dim() >= 1 and x.shape[-1] == normalized_shape[0]:
        return normalized_shape[0]
    k = len(normalized_shape)
    if k == 0 or x.dim() < k or tuple(x.shape[x.dim() - k:]) != tuple(normalized_shape):
        raise ValueError(f"jitops.{op_name}: argument 'normalized_shape' is {list(normalized_shape)} but 'x' has "
                         f"shape {tuple(x.shape)}; normalized_shape must be non-empty and equal x's last "
                         f"{max(k, 1)} dimension(s)")
    return math.prod(normalized_shape)


def _check_param(op_name: str, name: str, t: torch.Tensor, x: torch.Tensor, normalized_shape) -> None:
    if t.dtype != x.dtype:
        shapes.check_same_dtype(op_name, ("x", x), (name, t))
    if tuple(t.shape) != tuple(normalized_shape):
        raise ValueError(f"jitops.{op_name}: argument '{name}' has shape {tuple(t.shape)}, expected "
                         f"{tuple(normalized_shape)} (normalized_shape)")


def _check_dtype(op_name: str, name: str, t: torch.Tensor) -> None:
    allowed = CPU_DTYPES if t.is_cpu else CUDA_DTYPES
    if t.dtype not in allowed:
        shapes.check_dtype(op_name, name, t, allowed)


def _vector_width(n: int, itemsize: int, tensors: list[torch.Tensor]) -> int:
    """Elements per access that n and every tensor's start allow (tensors that will be copied are left out:
    fresh allocations are 16-byte aligned)."""
    width = 16 // itemsize
    address = 0
    for t in tensors:  # plain CUDA tensors: their address; fake and meta ones: shapes' rule (storage offset)
        address |= t.data_ptr() if type(t) is torch.Tensor and t.is_cuda else shapes.byte_alignment(t) % 16
    while width > 1 and (n % width or address % (width * itemsize)):
        width //= 2
    return width


def _check_inputs(op_name: str, x: torch.Tensor, normalized_shape, params) -> int:
    """Every check of x, normalized_shape and the (name, tensor) params; returns n.  Plain comparisons
    first (this runs on every call); the helpers that build the messages only on failure."""
    dtype = x.dtype
    if dtype not in CUDA_DTYPES or (dtype not in CPU_DTYPES and x.is_cpu):
        _check_dtype(op_name, "x", x)
    k = len(normalized_shape)
    if k == 1:
        n = normalized_shape[0]
        if x.dim() == 0 or x.shape[-1] != n:
            n = _row_length(op_name, x, normalized_shape)
        for name, t in params:
            if t is not None and (t.dtype != dtype or t.dim() != 1 or t.shape[0] != n):
                _check_param(op_name, name, t, x, normalized_shape)
        return n
    n = _row_length(op_name, x, normalized_shape)
    for name, t in params:
        if t is not None and (t.dtype != dtype or tuple(t.shape) != tuple(normalized_shape)):
            _check_param(op_name, name, t, x, normalized_shape)
    return n


# ---- jitops::layer_norm_forward --------------------------------------------------------------------------------
def _concrete(x: torch.Tensor) -> bool:
    """A real (or meta) tensor: its class can be computed.  Fake tensors under torch.compile/opcheck may have
    symbolic sizes; the fake path only needs the input checks."""
    return type(x) is torch.Tensor or type(x) is torch.nn.Parameter


def shape_class(x: torch.Tensor, normalized_shape, weight, bias, eps: float) -> ForwardClass:
    """The forward's class.  Runs on every call, so the common call (a contiguous CUDA x, one normalized
    dimension, weight and bias absent or contiguous vectors of x's dtype) takes a short path: a dozen tensor
    queries where the general checks below make ~30 (1.9-2.8 us against 5.6 on the lent H100's hosts).  Anything
    else, bad inputs included, takes the general path, which gives the same class or the error."""
    if type(x) is _Tensor and len(normalized_shape) == 1 and x.is_cuda and x.is_contiguous():
        n = normalized_shape[0]
        shape = x.shape
        dtype = x.dtype
        itemsize = _ITEMSIZE.get(dtype)
        if itemsize and n and shape and shape[-1] == n:
            row = (n,)
            address = x.data_ptr()
            plain = True
            if weight is not None:
                plain = (type(weight) is _Tensor and weight.dtype is dtype and weight.shape == row
                         and weight.is_contiguous())
                if plain:
                    address |= weight.data_ptr()
            if bias is not None and plain:
                plain = type(bias) is _Tensor and bias.dtype is dtype and bias.shape == row and bias.is_contiguous()
                if plain:
                    address |= bias.data_ptr()
            if plain:
                numel = x.numel()
                width = 16 // itemsize
                while width > 1 and (n % width or address % (width * itemsize)):
                    width >>= 1
                return forward_class(dtype, n, width, numel // n, "int" if numel < INT32_LIMIT else "long long")
    return _checked_shape_class(x, normalized_shape, weight, bias, eps)


def _checked_shape_class(x: torch.Tensor, normalized_shape, weight, bias, eps: float) -> ForwardClass:
    n = _check_inputs("layer_norm", x, normalized_shape, (("weight", weight), ("bias", bias)))
    if x.is_cpu or not _concrete(x):
        return ForwardClass(x.dtype, 0, 0, 0, "")
    aligned = [t for t in (x, weight, bias) if t is not None and t.is_contiguous()]
    numel = x.numel()
    return forward_class(x.dtype, n, _vector_width(n, x.element_size(), aligned), numel // n if n else 0,
                         "int" if numel < INT32_LIMIT else "long long")


LN_FORWARD = CudaKernel("layer_norm_forward", Source.file("layer_norm.cu"),
                        "jitops::layer_norm_forward<{T}, {VEC}, {TPR}, {ITERS}, {I}>",
                        "ptr ptr ptr ptr ptr i64 i64 f64")
LN_BACKWARD = CudaKernel("layer_norm_backward", Source.file("layer_norm.cu"),
                         "jitops::layer_norm_backward<{T}, {VEC}, {TPR}, {ITERS}, {I}, {PARAMS}>",
                         "ptr ptr ptr ptr ptr ptr ptr ptr i64 i64")
LN_COLUMNS = CudaKernel("layer_norm_backward_columns", Source.file("layer_norm.cu"),
                        "jitops::layer_norm_backward_columns<{T}, {VEC}, {I}>", "ptr ptr ptr ptr i64 i64 i64")
LN_REDUCE = CudaKernel("layer_norm_reduce_partials", Source.file("layer_norm.cu"),
                       "jitops::layer_norm_reduce_partials<{T}>", "ptr ptr ptr i64 i64")
LN_PARAM_GRADS = CudaKernel("layer_norm_param_grads", Source.file("layer_norm.cu"),
                            "jitops::layer_norm_param_grads<{T}>", "ptr ptr ptr ptr ptr i64 i64")
# -ffp-contract=off: dx subtracts mean(g) from g = dy * w, and a fused multiply-add there leaves the product's
# rounding error where the difference is exactly 0 (all of dx when n == 1).  x86-64's baseline has no FMA, but
# where it is (aarch64, -march=native) GCC fuses by default.
LN_CPU = CppExtension("layer_norm_cpu", Source.file("cpu/layer_norm.cpp"),
                      functions=("layer_norm_forward", "layer_norm_backward"), options=("-O3", "-ffp-contract=off"))


def cuda_kernels(cls: ForwardClass, target: Target):
    return {"forward": LN_FORWARD.bind(shapes.dtype_name(cls.dtype), T=shapes.CUDA_TYPES[cls.dtype], VEC=cls.vec,
                                       TPR=cls.tpr, ITERS=cls.iters, I=cls.index)}


def cpu_kernels(cls, target: Target):
    compute = CPU_COMPUTE[cls.dtype]
    return {"cpu": LN_CPU.bind(shapes.dtype_name(compute), SCALAR_T=shapes.CPU_TYPES[compute])}


def _cpu_operand(t, compute: torch.dtype):
    return t.contiguous().to(compute) if t is not None else None


def _rows(x: torch.Tensor, n: int, k: int) -> int:
    return x.numel() // n if n else math.prod(x.shape[:x.dim() - k])


def _row_length_unchecked(normalized_shape) -> int:
    return normalized_shape[0] if len(normalized_shape) == 1 else math.prod(normalized_shape)


def _forward_cuda(k, x: torch.Tensor, normalized_shape, weight, bias, eps: float, save_stats: bool):
    """y, and the statistics if save_stats (else None: the kernel skips writing them)."""
    cls = k.shape_class
    if not x.is_contiguous():
        x = x.contiguous()
    if weight is not None and not weight.is_contiguous():
        weight = weight.contiguous()
    if bias is not None and not bias.is_contiguous():
        bias = bias.contiguous()
    if len(normalized_shape) == 1:
        n = normalized_shape[0]
        rows = x.numel() // n if n else _rows(x, n, 1)
    else:
        n = math.prod(normalized_shape)
        rows = _rows(x, n, len(normalized_shape))
    y = torch.empty_like(x)
    stats = x.new_empty((2, rows), dtype=STATS_DTYPE[cls.dtype]) if save_stats else None
    if rows and n:
        tpr = cls.tpr
        threads = tpr if tpr > 128 else 128  # _threads(tpr), inline
        grid = -(-rows // (threads // tpr))
        if grid > UNCAPPED_GRID:
            grid = min(grid, sm_count(x.get_device()) * FORWARD_BLOCKS_PER_SM)
        k.forward.launch(grid, threads, x, weight, bias, y, stats, rows, n, eps)
    return y, stats


def run_cuda(k, x: torch.Tensor, normalized_shape, weight, bias, eps: float):
    return _forward_cuda(k, x, normalized_shape, weight, bias, eps, True)


def run_cpu(k, x: torch.Tensor, normalized_shape, weight, bias, eps: float):
    dtype, compute = x.dtype, CPU_COMPUTE[x.dtype]
    x, weight, bias = (_cpu_operand(t, compute) for t in (x, weight, bias))
    n = _row_length_unchecked(normalized_shape)
    rows = _rows(x, n, len(normalized_shape))
    y = torch.empty_like(x)
    stats = x.new_empty((2, rows), dtype=STATS_DTYPE[dtype])
    if rows and n:
        k.cpu.layer_norm_forward(x, weight, bias, y, stats, rows, n, eps)
    return y.to(dtype), stats


def torch_forward(k, x: torch.Tensor, normalized_shape, weight, bias, eps: float):
    """(y, stats) through ATen, stats laid out as the kernels write them: background mode's fallback."""
    y, mean, rstd = torch.native_layer_norm(x, list(normalized_shape), weight, bias, eps)
    stats = torch.stack((mean.reshape(-1), rstd.reshape(-1))).to(STATS_DTYPE[x.dtype])
    return y.contiguous(), stats


def fake(x: torch.Tensor, normalized_shape, weight, bias, eps: float):
    n = math.prod(normalized_shape)
    rows = _rows(x, n, len(normalized_shape))
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            x.new_empty((2, rows), dtype=STATS_DTYPE.get(x.dtype, torch.float32)))


def setup_context(ctx, inputs, output) -> None:
    x, normalized_shape, weight, bias, eps = inputs
    _, stats = output
    ctx.mark_non_differentiable(stats)
    ctx.save_for_backward(x, stats, weight)
    ctx.normalized_shape = list(normalized_shape)
    ctx.has_weight, ctx.has_bias = weight is not None, bias is not None


def backward(ctx, grad: torch.Tensor | None, grad_stats: torch.Tensor | None):
    x, stats, weight = ctx.saved_tensors
    need_dx = ctx.needs_input_grad[0]
    need_dw = ctx.has_weight and ctx.needs_input_grad[2]
    need_db = ctx.has_bias and ctx.needs_input_grad[3]
    if grad is None or not (need_dx or need_dw or need_db):
        return None, None, None
    dx, dw, db = layer_norm_backward(grad, x, stats, weight, ctx.normalized_shape, need_dx, need_dw, need_db)
    return dx if need_dx else None, dw if need_dw else None, db if need_db else None


# ---- jitops::layer_norm_backward -------------------------------------------------------------------------------
def backward_shape_class(grad: torch.Tensor, x: torch.Tensor, stats: torch.Tensor, weight, normalized_shape,
                         need_dx: bool, need_dweight: bool, need_dbias: bool) -> BackwardClass:
    n = _check_inputs("layer_norm_backward", x, normalized_shape, (("weight", weight),))
    if grad.dtype != x.dtype:
        shapes.check_same_dtype("layer_norm_backward", ("x", x), ("grad", grad))
    if grad.shape != x.shape:
        shapes.check_same_shape("layer_norm_backward", ("x", x), ("grad", grad))
    numel = x.numel()
    rows = numel // n if n else _rows(x, n, len(normalized_shape))
    if stats.dim() != 2 or stats.shape[0] != 2 or stats.shape[1] != rows:
        shapes.check_shape("layer_norm_backward", "stats", stats, (2, rows), "mean and rstd of every row")
    if x.is_cpu or not _concrete(x):
        return BackwardClass(x.dtype, 0, 0, 0, "", 0)
    aligned = [t for t in (grad, x, weight) if t is not None and t.is_contiguous()]
    return backward_class(x.dtype, n, _vector_width(n, x.element_size(), aligned), rows < SMALL_ROWS,
                          "int" if numel < INT32_LIMIT else "long long", 1 < rows <= FEW_ROWS)


def backward_cuda_kernels(cls: BackwardClass, target: Target):
    dtype, ctype = shapes.dtype_name(cls.dtype), shapes.CUDA_TYPES[cls.dtype]
    if cls.params == 3:  # the row kernel computes dx only; layer_norm_param_grads does dweight/dbias
        return {"backward": LN_BACKWARD.bind(dtype, T=ctype, VEC=cls.vec, TPR=cls.tpr, ITERS=cls.iters, I=cls.index,
                                             PARAMS=0),
                "param_grads": LN_PARAM_GRADS.bind(dtype, T=ctype)}
    kernels = {
        "backward": LN_BACKWARD.bind(dtype, T=ctype, VEC=cls.vec, TPR=cls.tpr, ITERS=cls.iters, I=cls.index,
                                     PARAMS=cls.params),
        "reduce": LN_REDUCE.bind(dtype, T=ctype),
    }
    if cls.params == 0:
        kernels["columns"] = LN_COLUMNS.bind(dtype, T=ctype, VEC=cls.vec, I=cls.index)
    return kernels


_OCCUPANCY: dict[tuple[int, int, int], int] = {}


def _blocks_per_sm(kernel, threads: int, shared_mem: int) -> int:
    """The backward's persistent grid is this times the SM count: one wave, every block summing many rows."""
    key = (id(kernel), threads, shared_mem)
    blocks = _OCCUPANCY.get(key)
    if blocks is None:
        try:
            blocks = kernel.max_active_blocks(threads, shared_mem)
        except Exception:  # noqa: BLE001 - a sizing hint: CuPy's binding of the same query (imports CuPy)
            from cupy_backends.cuda.api import driver

            blocks = driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.handle, threads, shared_mem)
        blocks = _OCCUPANCY[key] = max(1, blocks)
    return blocks


def run_backward_cuda(k, grad: torch.Tensor, x: torch.Tensor, stats: torch.Tensor, weight, normalized_shape,
                      need_dx: bool, need_dweight: bool, need_dbias: bool):
    cls = k.shape_class
    if not grad.is_contiguous():
        grad = grad.contiguous()
    if not x.is_contiguous():
        x = x.contiguous()
    if weight is not None and not weight.is_contiguous():
        weight = weight.contiguous()
    n = _row_length_unchecked(normalized_shape)
    rows = _rows(x, n, len(normalized_shape))
    dx = torch.empty_like(x) if need_dx else x.new_empty((0,))
    dw = x.new_empty(normalized_shape) if need_dweight else x.new_empty((0,))
    db = x.new_empty(normalized_shape) if need_dbias else x.new_empty((0,))
    params = need_dweight or need_dbias
    if not rows or not n:
        if params:  # sums over no rows
            dw.zero_()
            db.zero_()
        return dx, dw, db
    device = x.get_device()
    threads = _threads(cls.tpr)
    rpb = threads // cls.tpr
    fused = params and cls.params in (1, 2)  # dweight/dbias summed by the main kernel
    partial, parts = None, 0
    if need_dx or fused:
        shared = 2 * rpb * n * stats.element_size() if fused and (cls.params == 2 or rpb > 1) else 0
        grid = min(-(-rows // rpb), sm_count(device) * _blocks_per_sm(k.backward, threads, shared))
        direct = fused and grid == 1  # one block: it writes dweight/dbias itself, no second kernel
        if fused and not direct:
            parts = grid
            partial = x.new_empty((2, parts, n), dtype=stats.dtype)
        k.backward.launch(grid, threads, grad, x, stats, weight, dx if need_dx else None, partial,
                          dw if direct and need_dweight else None, db if direct and need_dbias else None, rows, n,
                          shared_mem=shared)
    if params and cls.params == 3:
        k.param_grads.launch(-(-n // 32), 32 * REDUCE_ROWS, grad, x, stats, dw if need_dweight else None,
                             db if need_dbias else None, rows, n)
        return dx, dw, db
    if params and not cls.params:
        column_blocks = -(-(n // cls.vec) // COLUMN_THREADS)
        parts = max(1, min(rows, 65535, -(-4 * sm_count(device) // column_blocks)))
        rows_per_part = -(-rows // parts)
        parts = -(-rows // rows_per_part)
        partial = x.new_empty((2, parts, n), dtype=stats.dtype)
        k.columns.launch((column_blocks, parts), COLUMN_THREADS, grad, x, stats, partial, rows, n, rows_per_part)
    if partial is not None:
        k.reduce.launch(-(-n // 32), 32 * REDUCE_ROWS, partial, dw if need_dweight else None,
                        db if need_dbias else None, parts, n)
    return dx, dw, db


def run_backward_cpu(k, grad: torch.Tensor, x: torch.Tensor, stats: torch.Tensor, weight, normalized_shape,
                     need_dx: bool, need_dweight: bool, need_dbias: bool):
    dtype, compute = x.dtype, CPU_COMPUTE[x.dtype]
    grad, x, weight = (_cpu_operand(t, compute) for t in (grad, x, weight))
    stats = stats.contiguous()
    n = _row_length_unchecked(normalized_shape)
    rows = _rows(x, n, len(normalized_shape))
    dx = torch.empty_like(x) if need_dx else x.new_empty((0,))
    dw = x.new_empty(normalized_shape) if need_dweight else x.new_empty((0,))
    db = x.new_empty(normalized_shape) if need_dbias else x.new_empty((0,))
    if rows and n:
        k.cpu.layer_norm_backward(grad, x, stats, weight, dx if need_dx else None, dw if need_dweight else None,
                                  db if need_dbias else None, rows, n)
    elif need_dweight or need_dbias:
        dw.zero_()
        db.zero_()
    return dx.to(dtype), dw.to(dtype), db.to(dtype)


def torch_backward(k, grad: torch.Tensor, x: torch.Tensor, stats: torch.Tensor, weight, normalized_shape,
                   need_dx: bool, need_dweight: bool, need_dbias: bool):
    """The backward through torch ops from the saved statistics, in their precision: background mode's
    fallback."""
    dims = len(normalized_shape)
    lead = x.dim() - dims
    row_dims, norm_dims = tuple(range(lead)), tuple(range(lead, x.dim()))
    view = (*x.shape[:lead], *([1] * dims))
    mean, rstd = stats[0].reshape(view), stats[1].reshape(view)
    g = grad.to(stats.dtype)
    xhat = (x.to(stats.dtype) - mean) * rstd
    empty = x.new_empty((0,))
    dw = (g * xhat).sum(row_dims).to(x.dtype) if need_dweight else empty
    db = g.sum(row_dims).to(x.dtype) if need_dbias else empty
    dx = empty
    if need_dx:
        gw = g * weight.to(stats.dtype) if weight is not None else g
        dx = (rstd * (gw - gw.mean(norm_dims, keepdim=True) - xhat * (gw * xhat).mean(norm_dims, keepdim=True)))
        dx = dx.to(x.dtype).contiguous()
    return dx, dw, db


def backward_fake(grad, x, stats, weight, normalized_shape, need_dx, need_dweight, need_dbias):
    return (torch.empty_like(x, memory_format=torch.contiguous_format) if need_dx else x.new_empty((0,)),
            x.new_empty(normalized_shape) if need_dweight else x.new_empty((0,)),
            x.new_empty(normalized_shape) if need_dbias else x.new_empty((0,)))


layer_norm_backward = op(
    "jitops::layer_norm_backward(Tensor grad, Tensor x, Tensor stats, Tensor? weight, int[] normalized_shape, "
    "bool need_dx=True, bool need_dweight=True, bool need_dbias=True) -> (Tensor, Tensor, Tensor)",
    shape_class=backward_shape_class,
    cuda=Impl(backward_cuda_kernels, run_backward_cuda),
    cpu=Impl(cpu_kernels, run_backward_cpu),
    fake=backward_fake,
    doc="Gradients of jitops.layer_norm: (dx, dweight, dbias); the ones not asked for are empty tensors.",
    fallback=torch_backward,
)

def companions(x, normalized_shape, weight, bias, eps, *, needs):
    """The backward's call (see backward above), for manifests and prefetching: dy like y (contiguous), the
    saved statistics."""
    need_dx, need_dw, need_db = needs[0], needs[1] and weight is not None, needs[2] and bias is not None
    if not (need_dx or need_dw or need_db):
        return []
    n = math.prod(normalized_shape)
    stats = shapes.placeholder(x, (2, x.numel() // n if n else 0), dtype=STATS_DTYPE.get(x.dtype, torch.float32))
    return [(layer_norm_backward, (shapes.placeholder(x, x.shape), x, stats, weight, list(normalized_shape),
                                   need_dx, need_dw, need_db))]


layer_norm_forward = op(
    "jitops::layer_norm_forward(Tensor x, int[] normalized_shape, Tensor? weight=None, Tensor? bias=None, "
    "float eps=1e-05) -> (Tensor, Tensor)",
    shape_class=shape_class,
    cuda=Impl(cuda_kernels, run_cuda),
    cpu=Impl(cpu_kernels, run_cpu),
    fake=fake,
    setup_context=setup_context,
    backward=backward,
    companions=companions,
    doc="jitops.layer_norm's op: returns (y, stats) where stats is (2, rows): mean and rstd of every row.",
    fallback=torch_forward,
)


# ---- jitops::layer_norm_inference: the forward when no gradient is recorded --------------------------------------
def run_inference_cuda(k, x: torch.Tensor, normalized_shape, weight, bias, eps: float) -> torch.Tensor:
    return _forward_cuda(k, x, normalized_shape, weight, bias, eps, False)[0]


def run_inference_cpu(k, x: torch.Tensor, normalized_shape, weight, bias, eps: float) -> torch.Tensor:
    return run_cpu(k, x, normalized_shape, weight, bias, eps)[0]


layer_norm_inference = op(
    "jitops::layer_norm_inference(Tensor x, int[] normalized_shape, Tensor? weight=None, Tensor? bias=None, "
    "float eps=1e-05) -> Tensor",
    shape_class=shape_class,
    cuda=Impl(cuda_kernels, run_inference_cuda),
    cpu=Impl(cpu_kernels, run_inference_cpu),
    fake=lambda x, normalized_shape, weight, bias, eps: torch.empty_like(x, memory_format=torch.contiguous_format),
    doc="jitops.layer_norm when no gradient is recorded: y only (the CUDA kernel skips the statistics).",
    fallback=lambda k, x, normalized_shape, weight, bias, eps: torch.nn.functional.layer_norm(
        x, list(normalized_shape), weight, bias, eps).contiguous(),
)


def layer_norm(x: torch.Tensor, normalized_shape, weight: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, eps: float = 1e-5) -> torch.Tensor:
    if type(normalized_shape) is int:
        normalized_shape = (normalized_shape,)
    # With a gradient to record, the forward op saves each row's statistics for the backward; without one the
    # inference op skips them: one allocation (2.6-3.1 us of a 12-19 us call on the lent H100's hosts) and 8
    # bytes a row fewer.
    if torch.is_grad_enabled() and (getattr(x, "requires_grad", False) or getattr(weight, "requires_grad", False)
                                    or getattr(bias, "requires_grad", False)):
        return layer_norm_forward(x, normalized_shape, weight, bias, eps)[0]
    return layer_norm_inference(x, normalized_shape, weight, bias, eps)


layer_norm.__doc__ = __doc__
layer_norm.op = layer_norm_forward.op  # type: ignore[attr-defined]

# One public name for the three ops: what the function above calls with a gradient recorded and without one.
def _bind(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    shape = [normalized_shape] if type(normalized_shape) is int else list(normalized_shape)
    return layer_norm_forward, (x, shape, weight, bias, eps)


public("layer_norm", layer_norm, entries=(layer_norm_forward, layer_norm_inference), parts=(layer_norm_backward,),
       calls=lambda entry, args, grad: [(layer_norm_forward if grad else layer_norm_inference, args)], bind=_bind)

# Common shape classes, for `cache_tools prewarm --all-builtin` (manifest items; each builds the forward, the
# backward and the no-grad path).
PREWARM = [
    {"op": "layer_norm", "dtypes": ["fp32", "fp16", "bf16"],
     "shapes": [[[4096, n], [n], [n]]], "kwargs": {"normalized_shape": [n], "eps": 1e-5}}
    for n in (768, 1024, 2048, 4096, 8192)
]
