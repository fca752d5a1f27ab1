"""How jitops.layer_norm picks its kernels: the hidden-size buckets (threads per row, vectors per thread), the
vector width, and where the backward sums dweight/dbias, with the constants measured on the H100 that set
them (benchmarks/bench_layer_norm.py --sweep; figures in docs/benchmarks.md).

Pure: the shape classes in jitops/ops/layer_norm.py call forward_class, backward_class and _vector_width.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .. import shapes
from ..config import config

CPU_COMPUTE = shapes.CPU_COMPUTE
INT32_LIMIT = 2**30  # 32-bit index math below this many elements (row and grid offsets never pass 2^31)

# Tuning (the hidden-size buckets; benchmarks/bench_layer_norm.py --sweep): bytes of its row each thread keeps
# in registers, and the most threads per row.  The backward also keeps dweight/dbias sums for its columns, hence
# at most 512 threads (<= 128 registers each).  Fewer than SMALL_ROWS rows leave the GPU mostly idle and the
# time is one row's latency: then a row is spread one 16-byte vector per thread when it fits in one block.
# Sweep on the H100 (bench_layer_norm.py --sweep, us ours/torch): forward tiles of 128 bytes
# against 64: (65536, 1024) bf16 98.8 vs 104.5 (torch 154.6), (4096, 4097) bf16 61.6 vs 72.2 (torch 97.5), the
# headline (16384, 8192) bf16 equal (198); backward tiles of 32 bytes against 64: the headline 356 vs 294 (torch
# 672), so 64.  Capping the forward grid at 4 blocks an SM instead of 16 cost 3-10%.  But 128-byte forward tiles
# leave short rows too few threads (timed in CUDA graphs): (4096, 128) bf16 5.7 us against 3.8 with 64 bytes,
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
# Without it (H100): (64, 1024) fp16/bf16 backward 4.5-4.6 us against torch's 4.3, the only
# rows of the benchmark set slower than torch.  One row keeps its one-kernel path (the row kernel writes them itself).
FEW_ROWS = 64

# dweight/dbias sums in shared memory ([2][n] of float) up to this size; sm_80 allows 163 KB a block.
PARAMS_SMEM_LIMIT = 160 * 1024


class ForwardClass(NamedTuple):
    dtype: torch.dtype
    vec: int      # elements per access
    tpr: int      # threads per row
    iters: int    # vectors per thread per row tile
    index: str    # "int" or "long long"
    rms: bool = False  # jitops.rms_norm: the mean taken as 0 (the kernels' RMS)


class BackwardClass(NamedTuple):
    dtype: torch.dtype
    vec: int
    tpr: int
    iters: int
    index: str
    params: int   # where dweight/dbias are summed: 1 registers, 2 shared memory, 0 layer_norm_backward_columns
    #               (all three + layer_norm_reduce_partials), 3 layer_norm_param_grads (few rows)
    rms: bool = False


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
_FORWARD_CLASSES: dict[tuple, tuple["ForwardClass", "ForwardClass"]] = {}
_BACKWARD_CLASSES: dict[tuple, "BackwardClass"] = {}


def forward_class(dtype: torch.dtype, n: int, vec: int, rows: int, index: str, rms: bool = False) -> ForwardClass:
    """The class for `rows` rows of n: fewer than SMALL_ROWS rows take the few-rows bucket; otherwise 128-byte
    tiles when that leaves enough threads (FORWARD_BUSY_THREADS, FORWARD_MIN_WIDE_TPR), else 64-byte tiles."""
    small = rows < SMALL_ROWS
    key = (dtype, n, vec, small, index, rms)
    pair = _FORWARD_CLASSES.get(key)
    if pair is None:
        itemsize = _ITEMSIZE[dtype]
        wide_tile = config.layer_norm_tuning.get("forward_tile_bytes", FORWARD_TILE_BYTES)
        pair = _FORWARD_CLASSES[key] = tuple(
            ForwardClass(dtype, vec, *_bucket(n, vec, itemsize, tile, FORWARD_MAX_TPR, small), index, rms)
            for tile in (wide_tile, wide_tile // 2))
    wide = small or (pair[0].tpr >= FORWARD_MIN_WIDE_TPR and rows * pair[0].tpr >= FORWARD_BUSY_THREADS)
    return pair[0] if wide else pair[1]


def backward_class(dtype: torch.dtype, n: int, vec: int, small: bool, index: str, few: bool = False,
                   rms: bool = False) -> BackwardClass:
    key = (dtype, n, vec, small, index, few, rms)
    cls = _BACKWARD_CLASSES.get(key)
    if cls is None:
        tile = config.layer_norm_tuning.get("backward_tile_bytes", BACKWARD_TILE_BYTES)
        tpr, iters = _bucket(n, vec, _ITEMSIZE[dtype], tile, BACKWARD_MAX_TPR, small)
        acc_size = 8 if dtype == torch.float64 else 4
        if few:
            params = 3
        elif n // vec <= tpr * iters:
            params = 1
        elif 2 * (_threads(tpr) // tpr) * n * acc_size <= PARAMS_SMEM_LIMIT:
            params = 2
        else:
            params = 0
        cls = _BACKWARD_CLASSES[key] = BackwardClass(dtype, vec, tpr, iters, index, params, rms)
    return cls


def clear_buckets() -> None:
    """Forget the memoized classes: a config scope's layer_norm_tuning applies to classes computed after this."""
    _FORWARD_CLASSES.clear()
    _BACKWARD_CLASSES.clear()


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
