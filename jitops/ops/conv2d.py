"""jitops.conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1): 2-D convolution
(cross-correlation), forward and backward, with a channels_last output.

Arguments as torch.nn.functional.conv2d takes them: x [N, C, H, W] or unbatched [C, H, W] (the output then has
no batch dimension either); stride, padding and dilation an int or a pair; padding also "valid" (0) or "same"
(stride 1; where the dilated kernel's extent is even, the extra row or column goes at the bottom or right, as
torch puts it, by padding x with F.pad: one copy of x, as torch's own _convolution_same makes).  groups must be 1:
grouped and depthwise convolutions are not implemented yet.

Layouts.  The CUDA kernels work on NHWC activations and KRSC filters (channel-contiguous), so:
- `x` may be channels_last or contiguous NCHW (any strides, in fact).  A channels_last x is used in place; any
  other layout is converted ONCE per call into an NHWC copy (one read and one write of x: for a memory-bound
  1x1 conv that copy costs about as much as the conv itself, so keep activations channels_last).
- `weight` [K, C, R, S] is copied to KRSC each call unless it is already channels_last (small: the weights).
- The output is allocated with torch.empty(..., memory_format=torch.channels_last) and the kernel writes its
  NHWC memory directly: it IS channels_last in memory (strides (P*Q*K, 1, Q*K, K)), not merely tagged.  The
  gradients follow the same rule: grad_x and grad_weight are channels_last [N, C, H, W] / [K, C, R, S].

Kernels (CUDA, fp16 and bf16, Hopper sm_90a; other GPUs run the ATen path below, i.e. cuDNN): CUTLASS 3
implicit GEMM with TMA im2col loads and wgmma in kernels/conv/ (conv_sm90.cuh: a persistent kernel with two
consumer warpgroups around CUTLASS's conv collectives; conv2d_sm90.cu: one configuration per translation unit).
Three operators, each compiled on first use per shape class:
- fprop  y  = x * w          implicit GEMM  M = N*P*Q, N = K, GEMM-K = C*R*S   (+ bias fused in the epilogue)
- dgrad  dx = dy * w^T       implicit GEMM  M = N*H*W, N = C, GEMM-K = K*R*S   (unit stride; see below)
- wgrad  dw = dy^T * x       implicit GEMM  M = K, N = C*R*S, GEMM-K = N*P*Q   (split-K into fp32 slices that
                                                                                one NVRTC kernel sums into dw;
                                                                                one slice: dw stored directly;
                                                                                through TMA as a flat matrix
                                                                                where the tile allows)
Filter size, stride, padding and dilation reach the kernel at run time (CUTLASS 3 encodes them into the TMA
im2col descriptors on the host), so one compiled kernel serves many layers; the shape class still names them,
with the dtype, the channel alignment and the plan (tile or thread block cluster, split count, im2col, flat
store) picked for the GEMM shape by cost models fitted to the op's own benchmark sweeps (GEMM_TILE_US,
WGRAD_TILE_US).

Strided dgrad.  CUTLASS's sm90 dgrad supports unit stride only.  A stride-s dgrad is split into s_h*s_w
phases: the rows h = a (mod s) of dx receive only the filter taps r with (a + pad - r*dil) = 0 (mod s), and
over those rows dgrad is a unit-stride dgrad with that sub-filter (dilation dil/gcd(s, dil), its own
padding).  Each phase writes every s-th pixel of dx through a strided output view; rows that no tap reaches
are zero.  `dgrad_phases` is pure and tested against torch on the CPU.

Channels that are not a multiple of 8 (TMA needs 16-byte aligned strides): C and K are zero-padded to the next
multiple of 8 in copies of x, w (and dy), and the output is computed at the padded width and copied into the
channels_last result.  Cost: one extra pass over x and the output, plus the GEMM work of the padded channels.
Aligned channels take none of this.  Layers with at most 16 (padded) input channels, like the 7x7 stem (C=3),
run fprop and wgrad as a 1x1 conv over an explicit im2col matrix instead, and dgrad as the matrix's gradient
(a 1x1 conv) summed into dx by col2im; both transforms are NVRTC kernels (see IM2COL_MAX_CHANNELS).  A strided
fprop or wgrad (the stem) folds only `stride` filter rows into the matrix and convolves the rest (_plan_fold).

CPU (and CUDA GPUs older than Hopper): ATen (torch.nn.functional.conv2d and torch.nn.grad), with the same
channels_last output contract, so CI exercises the shape classes, fake kernels, autograd, opcheck and
torch.compile.  CPU dtypes: fp32, fp64, fp16, bf16.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import operator
from typing import NamedTuple

import torch

from .. import shapes
from ..config import config
from ..launch import current_stream, sm_count
from ..op import Impl, op, public
from ..specs import CudaKernel, CudaLibrary, Source, Target

CUDA_DTYPES = (torch.float16, torch.bfloat16)
CPU_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
CHANNELS_LAST = torch.channels_last
ALIGN = 8            # channels per 16 bytes of fp16/bf16: TMA's stride alignment
TILE_K = 64          # GEMM-K per pipeline stage (kernels/conv/conv2d_sm90.cu)
HOPPER_SMS = 132     # tile heuristics assume an H100 SXM; the kernels run on any sm_90 part

# Tile configurations (TILE_M x TILE_N of the implicit GEMM), per operator, chosen by a cost model (plan_gemm)
# fitted to measurements on the lent H100 (docs/benchmarks_conv2d.md).  wgrad splits GEMM-K (N*P*Q) into fp32
# partial sums where that pays.  fprop/dgrad have a split-K variant (SPLIT_TILE) that is compiled and used only
# when forced with config.conv2d_splits: on ResNet-50 at batch 32 it measured slower (the 7x7 3x3 layer: 32 us split
# 2 x 128x128, 27 us unsplit 128x64).
class Tile(NamedTuple):
    m: int                      # TILE_M x TILE_N of the implicit GEMM
    n: int
    cluster_m: int = 1          # thread block cluster: CTAs side by side along M share (TMA multicast) the B
    cluster_n: int = 1          # operand's loads, along N the A operand's
    taps: int = 1               # wgrad: filter taps (consecutive s) per tile, n / taps channels each

    @property
    def channels(self) -> int:
        """wgrad: the channels of one tap a tile covers."""
        return self.n // self.taps


# Names: "MxN", "MxNcAxB" for a cluster of A x B CTAs, "MxNtT" for a wgrad tile over T filter taps.
# A wgrad tile covers channels of one filter tap (CUTLASS's loads), so on a 64-channel 3x3 layer a 128-wide tile
# is half zeros; 64x64 has none, and 64x192t3 covers a whole filter row (3 taps x 64 channels) and loads dy once
# for the three (kernels/conv/conv_sm90.cuh, WgradTapSpanning).
TILES = {"64x64": Tile(64, 64), "64x192t3": Tile(64, 192, taps=3),
         "64x128": Tile(64, 128), "64x256": Tile(64, 256), "128x64": Tile(128, 64), "128x128": Tile(128, 128),
         "128x256": Tile(128, 256), "128x64c1x2": Tile(128, 64, 1, 2), "128x64c2x1": Tile(128, 64, 2, 1),
         # Candidates `bench_conv2d.py --tiles` times; in no plan.  Clusters for wgrad (lent H100, 2026-11-22,
         # benchmarks/results/conv2d_tiles_wgrad_13*.json): the 128x128 ones within 1-3 us of 128x128 (13:13);
         # 64x128c2x1 up to 2x slower than 64x128 on the 64-channel 3x3 layer (13:40).
         "128x128c2x1": Tile(128, 128, 2, 1), "128x128c1x2": Tile(128, 128, 1, 2), "64x128c2x1": Tile(64, 128, 2, 1),
         "128x256c2x1": Tile(128, 256, 2, 1), "128x256c1x2": Tile(128, 256, 1, 2), "64x256c1x2": Tile(64, 256, 1, 2)}
# wgrad's 128x64 clusters are planned for 1x1 filters only (wgrad_candidates).
OPERATOR_TILES = {"fprop": ("128x64", "128x128", "128x256", "128x64c1x2", "128x64c2x1"),
                  "dgrad": ("128x64", "128x128", "128x256", "128x64c1x2", "128x64c2x1"),
                  "wgrad": ("64x64", "64x192t3", "64x128", "128x64", "128x128", "128x256", "64x256", "128x64c1x2",
                            "128x64c2x1")}
SPLIT_TILE = "128x128"           # the split-K variant of fprop and dgrad (only when forced)
# fprop/dgrad: microseconds per 64-deep k-step of one work tile and per wave of work tiles, per tile (a cluster
# tile has its own: its CTAs share the loads of the operand they have in common), fitted by least squares
# (relative error) by benchmarks/fit_conv_gemm_cost.py to every ResNet-50 layer and the reference layer at each
# tile, one slice (lent H100, 2026-11-22 16:42, benchmarks/results/conv2d_tiles_fprop_dgrad_1642.json; dgrad on
# its unit-stride layers): median error 8.5% (fprop), 7.9% (dgrad).  It replaced relative tile efficiencies set
# by hand, whose plans measured 0.852x of cuDNN's fprop in that run against 0.894x for this model's (the best
# tile per layer: 0.899x).  The 128x128-per-two-SMs cluster (128x64c1x2, the activation tile multicast) is what
# the 7x7 layers lacked: L18 and L20 28.5 -> 21.2 us.
GEMM_TILE_US = {
    "fprop": {"128x64": (0.357, 1.26), "128x128": (0.394, 2.65), "128x256": (0.672, 4.45),
              "128x64c1x2": (0.266, 1.40), "128x64c2x1": (0.355, 1.26)},
    "dgrad": {"128x64": (0.364, 0.84), "128x128": (0.403, 2.15), "128x256": (0.658, 3.59),
              "128x64c1x2": (0.270, 0.99), "128x64c2x1": (0.358, 0.87)}}
# wgrad: microseconds per 64-deep k-step of one work tile and per wave of work tiles (pipeline fill, epilogue;
# a cluster tile costs as its tile, less the operand bytes it multicasts; work tiles counted as the kernel's
# scheduler does, wgrad_work_tiles), fitted by least squares (relative error) by benchmarks/fit_wgrad_cost.py
# to 1322 timings of ResNet-50's wgrad layers at batch 32 and the 3x3 reference layer, every candidate tile at
# 1 to 131 slices (lent H100, 2026-11-22 16:15, 16:18, 17:51 and 17:59; benchmarks/results/
# conv2d_tiles_wgrad_161*.json and conv2d_tiles_wgrad_taps_17*.json): median error 6.8%, 90th percentile 19%.
# The fit also has a term for the bytes of dy and x (170 us per GB from DRAM), the same for every plan of a
# layer and so left out here.  Why the small tiles win on most layers: a wave of 128x64 costs 0.9 us against
# 128x256's 3.3, and more work tiles fill the 132 SMs with fewer fp32 slices.
WGRAD_TILE_US = {"64x64": (0.139, 1.46), "64x192": (0.258, 7.42), "64x128": (0.145, 3.34), "128x64": (0.144, 0.93),
                 "128x128": (0.244, 1.68), "128x256": (0.491, 3.28), "64x256": (0.252, 6.42)}
WGRAD_US_PER_GB_LOADED = 36.3    # operand tiles loaded from L2 into the SMs (about 28 TB/s across them)
# Two or more slices: the reduction kernel and the split path.  The fit says 2.3 us; with it the plans split
# the 14x14 and 28x28 3x3 layers (128x128 in 3 slices), 6-8 us slower than one slice, because a second kernel
# in the stream and the fp32 slices cost more there than the model's terms.  4.5 us is where the plans of the
# measured layers are best (`fit_wgrad_cost.py --score-split-us` on the same timings: ResNet-50's weighted wgrad
# against cuDNN 0.941 at 2.3-3 us, 0.973 at 4.5, 0.966 at 5.5-7), the one constant set by the plans rather
# than by the fit.
WGRAD_SPLIT_US = 4.5
WGRAD_US_PER_MB_SLICES = 0.447   # the fp32 slices written by the kernel and read by the reduction
# Benchmarks and tests force a tile, a split count or a fold with config.scope(conv2d_tile=..., conv2d_splits=...,
# conv2d_fold=...) (jitops/config.py); the shape class cache below is keyed on them.
_OPERATOR = {"conv2d": "fprop", "conv2d_input_grad": "dgrad", "conv2d_weight_grad": "wgrad"}


class ConvClass(NamedTuple):
    """What a compiled conv kernel is chosen by.  Only dtype, operator, tile and whether it splits K change the
    compiled code; the geometry rides along so that one class is one kind of layer (and the memo key says so)."""

    dtype: torch.dtype
    kernel: tuple[int, int]     # R, S
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    aligned: bool               # C and K multiples of 8: no channel padding
    tile: str                   # key of TILES ("" on the CPU)
    splits: int = 1             # slices of GEMM-K reduced separately (fp32 partial sums) when > 1; wgrad: >= 1
    im2col: bool = False        # few channels (the 7x7 stem, C=3): explicit im2col, then a 1x1 conv, see below
    flat: bool = False          # wgrad: the kernel stores dw as the flat K x (R*S*C) matrix (wgrad_flat)
    fold: int = 0               # fprop/wgrad over im2col: filter rows per matrix row (0: all, 1x1; _plan_fold)
    direct: bool = False        # wgrad: a one-slice plan writes dw itself (config.conv2d_wgrad_direct)


# ---- arguments ---------------------------------------------------------------------------------------------
def _pair(op_name: str, name: str, value) -> tuple[int, int]:
    if type(value) is int:
        return (value, value)
    if isinstance(value, str):
        hint = "an int, a pair of ints, 'same' or 'valid'" if name == "padding" else "an int or a pair of ints"
        raise ValueError(f"jitops.{op_name}: argument '{name}' is {value!r}; use {hint}")
    try:
        pair = tuple(v if type(v) is int else operator.index(v) for v in value)
    except TypeError:  # not a sequence, or an element that is no integer (1.5, "s")
        raise TypeError(f"jitops.{op_name}: argument '{name}' must be an int or a pair of ints, "
                        f"got {value!r}") from None
    if len(pair) == 1:
        pair = (pair[0], pair[0])
    elif len(pair) != 2:
        raise ValueError(f"jitops.{op_name}: argument '{name}' must be an int or a pair of ints, got {value!r}")
    return pair  # type: ignore[return-value]


def _geometry(op_name: str, stride, padding, dilation):
    stride, padding, dilation = (_pair(op_name, "stride", stride), _pair(op_name, "padding", padding),
                                 _pair(op_name, "dilation", dilation))
    if stride[0] < 1 or stride[1] < 1:
        raise ValueError(f"jitops.{op_name}: argument 'stride' is {stride}; strides must be >= 1")
    if padding[0] < 0 or padding[1] < 0:
        raise ValueError(f"jitops.{op_name}: argument 'padding' is {padding}; padding must be >= 0")
    if dilation[0] < 1 or dilation[1] < 1:
        raise ValueError(f"jitops.{op_name}: argument 'dilation' is {dilation}; dilation must be >= 1")
    return stride, padding, dilation


def output_size(size: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def _check_rank(op_name: str, name: str, t: torch.Tensor, what: str) -> None:
    if t.dim() != 4:
        raise ValueError(f"jitops.{op_name}: argument '{name}' must be 4-D {what}, got shape {tuple(t.shape)}")


def _check_dtype(op_name: str, pairs) -> None:
    first_name, first = pairs[0]
    allowed = CPU_DTYPES if first.is_cpu else CUDA_DTYPES
    if first.dtype not in allowed:
        shapes.check_dtype(op_name, first_name, first, allowed)
    for name, t in pairs[1:]:
        if t is not None and t.dtype != first.dtype:
            shapes.check_same_dtype(op_name, (first_name, first), (name, t))


def round_up(n: int, multiple: int = ALIGN) -> int:
    return (n + multiple - 1) // multiple * multiple


# Shape classes run on every call; validating and picking a tile costs ~10 us of Python, so each distinct
# combination of argument shapes, dtypes, device kind and geometry is classified once.  Errors are not cached.
_CLASS_CACHE: dict = {}


def _hashable(value):
    if isinstance(value, torch.Tensor):
        return (value.shape, value.dtype)
    return tuple(value) if type(value) is list else value


def _cached(compute, op_name: str, a: torch.Tensor, b: torch.Tensor, *rest) -> ConvClass:
    """compute(op_name, a, b, *rest), memoised on the shapes, dtypes and device kind of the tensors and the
    values of everything else."""
    try:
        operator = _OPERATOR[op_name]
        key = (op_name, a.shape, b.shape, a.dtype, b.dtype, a.is_cpu, *map(_hashable, rest),
               config.conv2d_tile.get(operator), config.conv2d_splits.get(operator), config.conv2d_fold,
               config.conv2d_wgrad_direct)
        cls = _CLASS_CACHE.get(key)
    except TypeError:  # symbolic sizes (torch.compile with dynamic shapes) are not hashable: no caching
        return compute(op_name, a, b, *rest)
    if cls is None:
        cls = compute(op_name, a, b, *rest)
        if len(_CLASS_CACHE) > 4096:
            _CLASS_CACHE.clear()
        _CLASS_CACHE[key] = cls
    return cls


# ---- tiles and split-K ---------------------------------------------------------------------------------------


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def normalize_splits(k_tiles: int, splits: int) -> int:
    """The split count the kernel runs: every split owns at least one k-tile (its slice is written)."""
    splits = max(1, min(splits, k_tiles))
    return _ceil(k_tiles, _ceil(k_tiles, splits))


def plan_gemm(operator: str, m: int, n: int, k_tiles: int, tiles=None) -> tuple[str, int]:
    """(tile, splits) for an fprop or dgrad M x N implicit GEMM with k_tiles 64-deep k-steps: the cheapest by
    gemm_cost_us among `tiles` (default: the operator's).  wgrad plans with plan_wgrad."""
    forced_tile, forced_splits = _forced_tile(operator), config.conv2d_splits.get(operator)
    tiles = (forced_tile,) if forced_tile else tiles or OPERATOR_TILES[operator]
    candidates = [(t, 1) for t in tiles]
    if forced_splits and forced_splits > 1:
        candidates = [(forced_tile or SPLIT_TILE, forced_splits)]
    elif forced_splits:
        candidates = [(t, forced_splits) for t, _ in candidates]
    return _plan_best(operator, candidates, m, n, k_tiles)


def _forced_tile(operator: str) -> str | None:
    tile = config.conv2d_tile.get(operator)
    if tile is not None and tile not in TILES:
        raise ValueError(f"jitops.conv2d: config.conv2d_tile[{operator!r}] is {tile!r}, which is no tile of "
                         f"jitops/ops/conv2d_plan.py; use one of {', '.join(TILES)}")
    return tile


def wgrad_flat(tile: str, channels: int, filter_rs: tuple[int, int]) -> bool:
    """Whether the wgrad kernel with this tile can store dw (or its fp32 slices) as the flat K x (R*S*C) matrix
    through TMA (WGRAD_FLAT in kernels/conv/conv2d_sm90.cu): only when its tiles of the (C,S,R) mode are flat
    column ranges, i.e. a 1x1 filter, C a multiple of a one-tap TILE_N, or a tile over a whole filter row.  The
    other kernels store from registers, element by element (3-11 us slower on ResNet-50's one-slice layers:
    docs/benchmarks_conv2d.md)."""
    t = TILES[tile]
    if t.taps > 1:
        return wgrad_tile_serves(tile, channels, filter_rs)
    return filter_rs == (1, 1) or channels % t.n == 0


def wgrad_tile_serves(tile: str, channels: int, filter_rs: tuple[int, int]) -> bool:
    """Whether a wgrad tile can run this layer: a tile over T taps is one whole filter row, exactly its channels
    and its S = T taps (kernels/conv/conv_sm90.cuh, WgradTapSpanning::can_implement)."""
    t = TILES[tile]
    return t.taps == 1 or (channels == t.channels and filter_rs[1] == t.taps)


def wgrad_candidates(channels: int, filter_rs: tuple[int, int]) -> tuple[str, ...]:
    """The tiles a wgrad plan chooses from: those that store through TMA where there are any (the flat ones;
    64-row tiles store from registers either way, kernels/conv/conv2d_sm90.cu), thread block clusters only for
    1x1 filters, and tiles over several taps where the filter's width takes them.  Clusters (multicast of the
    shared operand) were the fastest tile on 12 of the 14 1x1 layers of ResNet-50 and slower on 5 of the 7 3x3
    ones (lent H100, 2026-11-22 16:18, best split each; benchmarks/results/conv2d_tiles_wgrad_1618.json)."""
    one_by_one = filter_rs == (1, 1)
    tiles = tuple(t for t in OPERATOR_TILES["wgrad"] if wgrad_tile_serves(t, channels, filter_rs) and
                  (wgrad_flat(t, channels, filter_rs) or TILES[t].m == 64) and
                  (one_by_one or TILES[t].cluster_m * TILES[t].cluster_n == 1))
    return tiles or tuple(t for t in OPERATOR_TILES["wgrad"] if TILES[t].taps == 1)


def plan_wgrad(k: int, channels: int, filter_rs: tuple[int, int], k_tiles: int) -> tuple[str, int, bool]:
    """(tile, splits, flat) of the weight gradient dw (K x R*S*C) over k_tiles 64-deep k-steps: the cheapest by
    wgrad_cost_us among wgrad_candidates, each at its best split count."""
    forced_tile, forced_splits = _forced_tile("wgrad"), config.conv2d_splits.get("wgrad")
    if forced_tile and not wgrad_tile_serves(forced_tile, channels, filter_rs):
        raise ValueError(f"jitops: wgrad tile {forced_tile!r} (config.conv2d_tile) covers a filter row of "
                         f"{TILES[forced_tile].taps} taps x {TILES[forced_tile].channels} channels; this layer's "
                         f"is {filter_rs[1]} x {channels}")
    tiles = (forced_tile,) if forced_tile else wgrad_candidates(channels, filter_rs)
    plans = [(t, normalize_splits(k_tiles, s)) for t in tiles
             for s in ((forced_splits,) if forced_splits else range(1, 257))]
    tile, splits = min(plans, key=lambda plan: wgrad_cost_us(plan[0], plan[1], round_up(k), channels, filter_rs,
                                                             k_tiles))
    return tile, splits, wgrad_flat(tile, channels, filter_rs)


def _work_tiles(tile: str, m: int, n: int, splits: int) -> int:
    """Work tiles the kernel's scheduler runs for an M x N GEMM in `splits` slices (whole clusters)."""
    t = TILES[tile]
    return _ceil(_ceil(m, t.m), t.cluster_m) * t.cluster_m * _ceil(_ceil(n, t.n), t.cluster_n) * t.cluster_n * splits


def wgrad_work_tiles(tile: str, k: int, channels: int, filter_rs: tuple[int, int], splits: int) -> int:
    """Work tiles of a wgrad kernel: its N mode is the filter's (C,S,R), tiled by channels of one tap (or of
    `taps` taps along S) as CUTLASS's scheduler does (cute::ceil_div by mode), not as the flat R*S*C."""
    t = TILES[tile]
    n_tiles = _ceil(channels, t.channels) * _ceil(filter_rs[1], t.taps) * filter_rs[0]
    return _ceil(_ceil(k, t.m), t.cluster_m) * t.cluster_m * _ceil(n_tiles, t.cluster_n) * t.cluster_n * splits


def wgrad_cost_us(tile: str, splits: int, k: int, channels: int, filter_rs: tuple[int, int],
                  k_tiles: int) -> float:
    """Predicted microseconds of a wgrad plan (WGRAD_TILE_US and the constants after it)."""
    t = TILES[tile]
    step_us, wave_us = WGRAD_TILE_US.get(f"{t.m}x{t.n}", WGRAD_TILE_US["128x128"])
    work = wgrad_work_tiles(tile, k, channels, filter_rs, splits)
    steps = _ceil(k_tiles, splits)
    cost = _ceil(work, HOPPER_SMS) * (steps * step_us + wave_us)
    # A cluster's CTAs share (multicast) the operand tile they have in common: along M the B tile, along N A's.
    rows_loaded = t.m / t.cluster_n + t.n / t.cluster_m
    cost += work * steps * rows_loaded * TILE_K * 2 / 1e9 * WGRAD_US_PER_GB_LOADED
    if splits > 1:
        cost += WGRAD_SPLIT_US + splits * k * channels * filter_rs[0] * filter_rs[1] * 4 / 1e6 * WGRAD_US_PER_MB_SLICES
    return cost


def gemm_cost_us(operator: str, tile: str, splits: int, m: int, n: int, k_tiles: int) -> float:
    """Predicted microseconds of an fprop or dgrad plan (GEMM_TILE_US; a tile without constants, only ever
    forced, costs as 128x128)."""
    costs = GEMM_TILE_US[operator]
    step_us, wave_us = costs.get(tile, costs["128x128"])
    return _ceil(_work_tiles(tile, m, n, splits), HOPPER_SMS) * (_ceil(k_tiles, splits) * step_us + wave_us)


def _plan_best(operator: str, candidates, m: int, n: int, k_tiles: int):
    tile, splits = min(candidates, key=lambda plan: gemm_cost_us(operator, plan[0], plan[1], m, n, k_tiles))
    return tile, normalize_splits(k_tiles, splits)


# ---- strided dgrad as unit-stride phases (pure; tested on the CPU) --------------------------------------------
class Phase1D(NamedTuple):
    start: int                  # first dx row of this phase; it writes rows start, start + stride, ...
    count: int                  # rows written
    taps: tuple[int, ...]       # filter taps (ascending) of the unit-stride sub-filter
    lower: int                  # its padding before ...
    upper: int                  # ... and after (so that its output extent is exactly dy's)
    dilation: int               # its dilation (in dy rows)


def dgrad_phases_1d(size: int, out_size: int, kernel: int, stride: int, padding: int,
                    dilation: int) -> tuple[list[Phase1D], bool]:
    """Phases of one spatial dimension and whether they write every dx row (if not, dx must be zeroed first).

    dx[h] = sum over taps r, outputs o with h = o*stride - padding + r*dilation of dy[o] * w[r].  For
    h = a + stride*i the taps are those with (a + padding - r*dilation) % stride == 0, spaced stride/g apart
    (g = gcd(stride, dilation)), and o = i + e0 - j*(dilation/g) for the j-th tap: a unit-stride dgrad with
    lower padding e0, dilation dilation/g.  Rows that no tap reaches are left out (and are zero)."""
    phases = []
    written = 0
    sub_dilation = dilation // math.gcd(stride, dilation)
    for a in range(stride):
        rows = len(range(a, size, stride))
        taps = tuple(r for r in range(kernel) if (a + padding - r * dilation) % stride == 0)
        if rows == 0 or not taps:
            continue
        e0 = (a + padding - taps[0] * dilation) // stride
        span = (len(taps) - 1) * sub_dilation
        first = max(0, -e0)                               # rows before this read only dy[< 0]
        end = min(rows, out_size - e0 + span)             # rows from here read only dy[>= out_size]
        if end <= first:
            continue
        lower = e0 + first
        upper = out_size - end - e0 + span
        phases.append(Phase1D(a + stride * first, end - first, taps, lower, upper,
                              sub_dilation if len(taps) > 1 else 1))
        written += end - first
    return phases, written == size


@functools.lru_cache(maxsize=1024)
def dgrad_phases(input_hw: tuple[int, int], output_hw: tuple[int, int], kernel: tuple[int, int],
                 stride: tuple[int, int], padding: tuple[int, int], dilation: tuple[int, int]):
    """2-D phases (row phase, column phase) and whether together they write all of dx."""
    rows, rows_full = dgrad_phases_1d(input_hw[0], output_hw[0], kernel[0], stride[0], padding[0], dilation[0])
    cols, cols_full = dgrad_phases_1d(input_hw[1], output_hw[1], kernel[1], stride[1], padding[1], dilation[1])
    return tuple((r, c) for r in rows for c in cols), rows_full and cols_full


# ---- kernels -----------------------------------------------------------------------------------------------
_ARGS = ("ptr", "ptr", "ptr", "ptr", *["i32"] * 15, "i64", "i64", "i64", "i32", "i32", "i32", "ptr")
_FUNCTIONS = {"jitops_conv2d": (_ARGS, "i32"), "jitops_conv2d_info": (("i32",), "i32")}
CONV_SPECS = {name: CudaLibrary(f"conv2d_{name}", Source.file("conv/conv2d_sm90.cu"), functions=_FUNCTIONS,
                                arch_specific=True)
              for name in ("fprop", "dgrad", "wgrad", "wgrad_direct", "fprop_splitk", "dgrad_splitk")}
_OPERATOR_CODE = {"fprop": 0, "dgrad": 1, "wgrad": 2}
_ELEMENT = {torch.float16: "cutlass::half_t", torch.bfloat16: "cutlass::bfloat16_t"}
_STATUS = {1: "the kernel cannot implement this problem (CUTLASS can_implement)",
           2: "the kernel launch failed", 3: "raising the kernel's shared-memory limit failed"}


def _request(name: str, cls: ConvClass, target: Target):
    if target.capability is None or target.capability[0] != 9:
        return {}  # the kernels need Hopper (wgmma, TMA im2col): other GPUs run ATen (cuDNN), see _aten_fallback
    tile = TILES[cls.tile]
    split = name != "wgrad" and cls.splits > 1
    defines = dict(CONV_OP=_OPERATOR_CODE[name], ELEMENT=_ELEMENT[cls.dtype], TILE_M=tile.m, TILE_N=tile.n,
                   CLUSTER_M=tile.cluster_m, CLUSTER_N=tile.cluster_n, SPLIT_K=int(split))
    if tile.taps > 1:
        defines["TILE_TAPS"] = tile.taps
    if name == "wgrad":
        defines["WGRAD_FLAT"] = int(cls.flat)
    if name == "wgrad" and wgrad_direct(cls):
        return {"wgrad_direct": CONV_SPECS["wgrad_direct"].bind(shapes.dtype_name(cls.dtype), WGRAD_DIRECT=1,
                                                                **defines)}
    spec = CONV_SPECS[f"{name}_splitk" if split else name]
    return {name: spec.bind(shapes.dtype_name(cls.dtype), **defines)}


def _no_kernels(cls: ConvClass, target: Target):
    return {}  # the CPU path is ATen


def _raw_entry(library):
    """The library's jitops_conv2d as a bare ctypes function: called with data pointers it skips HostFunction's
    per-argument conversion loop (27 arguments; ~3 us a call)."""
    fn = _RAW_ENTRIES.get(library.path)
    if fn is None:
        fn = ctypes.CDLL(library.path, mode=ctypes.RTLD_LOCAL).jitops_conv2d  # the same handle: already loaded
        fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 15 + [ctypes.c_longlong] * 3 + \
            [ctypes.c_int] * 3 + [ctypes.c_void_p]
        fn.restype = ctypes.c_int
        _RAW_ENTRIES[library.path] = fn
    return fn


_RAW_ENTRIES: dict[str, object] = {}


def _call(library, op_name: str, a, b, d, bias, *args) -> None:
    if hasattr(library, "path"):  # a loaded kernel library (the CPU tests pass a stand-in that takes tensors)
        status = _raw_entry(library)(a.data_ptr(), b.data_ptr(), d.data_ptr(),
                                     None if bias is None else bias.data_ptr(), *args)
    else:
        status = library.jitops_conv2d(a, b, d, bias, *args)
    if status:
        args = (a, b, d, bias, *args)
        raise RuntimeError(f"jitops.{op_name}: {_STATUS.get(status, f'status {status}')}; problem "
                           f"(n, h, w, c, k, r, s, pads, strides, dilations) = {args[4:19]}")


# ---- layout helpers --------------------------------------------------------------------------------------------
# Few input channels: each 64-deep k-step of the implicit GEMM covers one filter tap's channels, so C=3 (padded
# to 8) uses 8/64 of every step: the 7x7 stem would do 8x its work.  Up to this many (padded) channels, fprop and
# wgrad materialise the im2col matrix [N, P, Q, R*S*C] (C fastest, padded to a multiple of 8) and run it as a 1x1
# conv: 147 -> 152 columns in 3 k-steps for the stem instead of 49.
IM2COL_MAX_CHANNELS = 16


def _uses_im2col(c: int, r: int, s: int) -> bool:
    # The im2col kernel keeps a table of the columns and at least one row in shared memory (under 40 KB: a
    # filter of up to ~2200 taps x channels, e.g. 11x11 at 16 channels); larger filters run directly.
    return round_up(c) <= IM2COL_MAX_CHANNELS and r * s > 1 and \
        _im2col_shared_bytes(1, round_up(c * r * s), 2) <= IM2COL_SHARED_BYTES


# The im2col matrix is built by one NVRTC kernel (kernels/conv/im2col.cu) that reads x through its strides.
IM2COL = CudaKernel("conv2d_im2col", Source.file("conv/im2col.cu"), "jitops::conv2d_im2col<{T}>",
                    "ptr ptr i64 i32 i32 i32 i32 i32 i32 i32 i64 i64 i64 i64 i32 i32 i32 i32 i32 i32 i32 i32")
IM2COL_BLOCK = 256
IM2COL_SHARED_BYTES = 40 * 1024   # a block's rows and tables stay under the 48 KB that needs no opt-in


# dgrad of those layers: the columns' gradient dy . W as a 1x1 conv (the fprop kernel), then this gather into dx.
COL2IM = CudaKernel("conv2d_col2im", Source.file("conv/im2col.cu"), "jitops::conv2d_col2im<{T}>",
                    "ptr ptr i64 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32")


def _im2col_shared_bytes(block_rows: int, columns: int, element_size: int) -> int:
    """kernels/conv/im2col.cu's shared memory: the rows, then 16 bytes a column (an offset and two ints)."""
    return block_rows * columns * element_size + 16 * columns


# A strided few-channel fprop need not materialise every filter row: the matrix of a `fold` x S filter at stride
# (fold, stride_w), one row per `fold` input rows, holds fold*S*C columns, and a conv of ceil(R/fold) taps over
# it at unit stride is the layer (row p reads matrix rows p .. p + R/fold - 1, i.e. input rows p*fold - pad + r).
# For the stem (7x7 stride 2, C=3, 224x224, batch 32) that is a 40 MB matrix of 48 columns and 4 k-steps a tile
# instead of 122 MB, 152 columns, 3 k-steps.  The weight gradient is the same wgrad over the folded matrix, its
# (R/fold, 1) filter of fold*S*C channels unfolded into dw.  _plan_fold picks by writing and reading the matrix
# at the im2col kernel's measured rate (122 MB in 81.5 us, lent H100, docs/benchmarks_conv2d.md runs 12-14) plus
# the GEMM's fitted cost.
IM2COL_MB_PER_US = 122 / 81.5


def _fold_matrix(n: int, p: int, q: int, c: int, r: int, s: int, fold: int) -> tuple[int, int, int, float]:
    """(rows per image, columns, taps of the conv over it, megabytes at 2 bytes) of the im2col matrix that
    folds `fold` filter rows (0: all of them; the conv is then 1x1)."""
    if fold == 0:
        rows, columns, taps = p, round_up(c * r * s), 1
    else:
        rows, columns, taps = p + _ceil(r, fold) - 1, round_up(fold * s * c), _ceil(r, fold)
    return rows, columns, taps, n * rows * q * columns * 2 / 1e6


def _plan_fold(operator: str, n: int, p: int, q: int, k: int, c: int, r: int, s: int, stride,
               dilation) -> tuple[int, str, int, bool]:
    """(fold, tile, splits, flat) of a few-channel fprop or wgrad: fold 0 is the whole im2col matrix and a 1x1
    conv; fold f (f = stride_h, unit dilation along H) folds f filter rows into the matrix and convolves
    ceil(R/f) taps over it."""
    def plan(fold: int) -> tuple[float, str, int, bool]:
        _, columns, taps, matrix_mb = _fold_matrix(n, p, q, c, r, s, fold)
        if operator == "wgrad":
            k_tiles = _ceil(n * p * q, TILE_K)
            tile, splits, flat = plan_wgrad(k, columns, (taps, 1), k_tiles)
            cost = wgrad_cost_us(tile, splits, round_up(k), columns, (taps, 1), k_tiles)
        else:
            k_tiles = _ceil(columns, TILE_K) * taps
            (tile, splits), flat = plan_gemm("fprop", n * p * q, round_up(k), k_tiles), False
            cost = gemm_cost_us("fprop", tile, splits, n * p * q, round_up(k), k_tiles)
        return 2 * matrix_mb / IM2COL_MB_PER_US + cost, tile, splits, flat
    folds = [0] + ([stride[0]] if 1 < stride[0] < r and dilation[0] == 1 else [])
    forced = config.conv2d_fold
    if forced is not None:
        if forced and dilation[0] != 1:
            raise ValueError(f"jitops.conv2d: config.conv2d_fold={forced} cannot serve this layer (a fold > 0 "
                             f"needs unit dilation along H, here {dilation[0]}); use 0 or None")
        folds = [forced]
    plans = {fold: plan(fold) for fold in folds}
    fold = min(plans, key=lambda f: plans[f][0])
    return (fold, *plans[fold][1:])


def _folded_im2col(kern, x: torch.Tensor, cls: ConvClass, p: int, q: int) -> tuple[torch.Tensor, int]:
    """The matrix of cls.fold filter rows [N, P + taps - 1, Q, round_up(fold*S*C)] for a conv of `taps` =
    ceil(R/fold) taps at unit stride (_plan_fold), and that tap count."""
    fold, (r, s), c = cls.fold, cls.kernel, x.shape[1]
    rows, _, taps, _ = _fold_matrix(x.shape[0], p, q, c, r, s, fold)
    matrix = _im2col(kern, x, fold, s, (fold, cls.stride[1]), cls.padding, (1, cls.dilation[1]), rows, q)
    return matrix, taps


def _fold_weight(weight: torch.Tensor, fold: int, k8: int, columns: int) -> torch.Tensor:
    """w [K, C, R, S] -> [k8, ceil(R/fold), 1, columns] (KRSC): tap j's channels are filter rows j*fold ..
    j*fold + fold - 1 in (row, s, c) order, as the folded matrix's columns; missing rows and padding zero."""
    k, c, r, s = weight.shape
    taps, per_tap = _ceil(r, fold), fold * s * c
    out = torch.zeros((k8, taps, 1, columns), dtype=weight.dtype, device=weight.device)
    krsc = weight.permute(0, 2, 3, 1)
    whole = r // fold  # taps with all `fold` rows; a last one may have fewer
    out[:k, :whole, 0, :per_tap].copy_(krsc[:, :whole * fold].reshape(k, whole, per_tap))
    if whole < taps:
        rest = r - whole * fold
        out[:k, whole, 0, :rest * s * c].copy_(krsc[:, whole * fold:].reshape(k, rest * s * c))
    return out


def _with_im2col(kernels: dict, cls: ConvClass) -> dict:
    if kernels and cls.im2col:
        kernels["im2col"] = IM2COL.bind(shapes.dtype_name(cls.dtype), T=shapes.CUDA_TYPES[cls.dtype])
    return kernels


def _im2col(kern, x: torch.Tensor, r: int, s: int, stride, padding, dilation, p: int, q: int) -> torch.Tensor:
    """x [N, C, H, W] (any strides) -> [N, P, Q, round_up(R*S*C)] (order r, s, c; extra columns zero)."""
    n, c, h, w = x.shape
    columns = round_up(r * s * c)
    out = torch.empty((n, p, q, columns), dtype=x.dtype, device=x.device)
    rows = n * p * q
    if rows == 0:
        return out
    # Rows per block: a power of two, at most 64, whose rows and tables fit IM2COL_SHARED_BYTES.
    log_rows = 6
    while log_rows and _im2col_shared_bytes(1 << log_rows, columns, x.element_size()) > IM2COL_SHARED_BYTES:
        log_rows -= 1
    kern.im2col.launch(-(-rows >> log_rows), IM2COL_BLOCK, x, out, rows, columns, log_rows, p, q, h, w, c,
                       *x.stride(), s, stride[0], stride[1], padding[0], padding[1], dilation[0], dilation[1],
                       r * s * c, shared_mem=_im2col_shared_bytes(1 << log_rows, columns, x.element_size()))
    return out


def _nhwc(t: torch.Tensor, channels: int) -> torch.Tensor:
    """t [N, C, H, W] (any strides) as an NHWC tensor [N, H, W, channels], channel-contiguous and 16-byte
    aligned; channels beyond C are zero.  A channels_last, aligned t with channels == C is returned as a view."""
    n, c, h, w = t.shape
    view = t.permute(0, 2, 3, 1)
    if channels == c and view.is_contiguous() and t.data_ptr() % 16 == 0:
        return view
    out = torch.empty((n, h, w, channels), dtype=t.dtype, device=t.device)
    out[..., :c].copy_(view)
    if channels > c:
        out[..., c:].zero_()
    return out


def _channels_last_like(shape, like: torch.Tensor) -> torch.Tensor:
    return torch.empty(shape, dtype=like.dtype, device=like.device, memory_format=CHANNELS_LAST)


def _launch_args(t: torch.Tensor):
    index = t.get_device()
    return index, sm_count(index), current_stream(index)


# ---- jitops::conv2d_input_grad: dx from dy and w ----------------------------------------------------------------
def _grad_class(op_name: str, grad: torch.Tensor, other: torch.Tensor, other_name: str, size, stride, padding,
                dilation, which: str) -> ConvClass:
    _check_rank(op_name, "grad", grad, "[N, K, P, Q]")
    _check_rank(op_name, other_name, other, "")
    _check_dtype(op_name, [("grad", grad), (other_name, other)])
    stride, padding, dilation = _geometry(op_name, stride, padding, dilation)
    size = tuple(int(s) for s in size)
    if len(size) != 4:
        raise ValueError(f"jitops.{op_name}: argument '{which}_size' must have 4 entries, got {size}")
    if which == "input":
        n, c, h, w = size
        k, _, r, s = other.shape
    else:
        k, c, r, s = size
        n, _, h, w = other.shape
    expected = (n, k, output_size(h, r, stride[0], padding[0], dilation[0]),
                output_size(w, s, stride[1], padding[1], dilation[1]))
    if tuple(grad.shape) != expected:
        raise ValueError(f"jitops.{op_name}: argument 'grad' has shape {tuple(grad.shape)}, expected {expected} "
                         "(the conv2d output's shape)")
    aligned = c % ALIGN == 0 and k % ALIGN == 0
    if grad.is_cpu:
        return ConvClass(grad.dtype, (r, s), stride, padding, dilation, aligned, "")
    if which == "input" and _uses_im2col(c, r, s):  # through the columns' gradient (a 1x1 fprop) and col2im
        p, q = expected[2], expected[3]
        tile, _ = plan_gemm("fprop", n * p * q, round_up(c * r * s), _ceil(round_up(k), TILE_K))
        return ConvClass(grad.dtype, (r, s), stride, padding, dilation, aligned, tile, 1, True)
    if which == "input":  # a strided dgrad runs stride_h * stride_w phases of about this size each
        tile, splits = plan_gemm("dgrad", n * _ceil(h, stride[0]) * _ceil(w, stride[1]), round_up(c),
                                 _ceil(round_up(k), TILE_K) * _ceil(r, stride[0]) * _ceil(s, stride[1]))
    else:
        p, q = expected[2], expected[3]
        if _uses_im2col(c, r, s):  # a wgrad over the im2col matrix (_plan_fold)
            fold, tile, splits, flat = _plan_fold("wgrad", n, p, q, k, c, r, s, stride, dilation)
            return ConvClass(grad.dtype, (r, s), stride, padding, dilation, aligned, tile, splits, True, flat, fold)
        tile, splits, flat = plan_wgrad(k, round_up(c), (r, s), _ceil(n * p * q, TILE_K))
        return ConvClass(grad.dtype, (r, s), stride, padding, dilation, aligned, tile, splits, flat=flat,
                         direct=config.conv2d_wgrad_direct and aligned)
    return ConvClass(grad.dtype, (r, s), stride, padding, dilation, aligned, tile, splits)


def input_grad_shape_class(grad, weight, input_size, stride, padding, dilation) -> ConvClass:
    return _cached(_grad_class, "conv2d_input_grad", grad, weight, "weight", input_size, stride, padding, dilation,
                   "input")


def input_grad_cuda_kernels(cls: ConvClass, target: Target):
    if cls.im2col:  # the columns' gradient as a 1x1 fprop, then col2im
        kernels = _request("fprop", cls, target)
        if kernels:
            kernels["col2im"] = COL2IM.bind(shapes.dtype_name(cls.dtype), T=shapes.CUDA_TYPES[cls.dtype])
        return kernels
    return _request("dgrad", cls, target)


def run_input_grad_cuda(kern, grad, weight, input_size, stride, padding, dilation) -> torch.Tensor:
    if not hasattr(kern, "dgrad") and not hasattr(kern, "col2im"):  # not a Hopper GPU
        return run_input_grad_cpu(kern, grad, weight, input_size, stride, padding, dilation)
    cls = kern.shape_class
    n, c, h, w = (int(v) for v in input_size)
    k, _, r, s = weight.shape
    dx = _channels_last_like((n, c, h, w), grad)
    if dx.numel() == 0:
        return dx
    if k == 0 or grad.numel() == 0:
        return dx.zero_()
    c8, k8 = round_up(c), round_up(k)
    dy = _nhwc(grad, k8)
    if cls.im2col:
        return _input_grad_through_columns(kern, dy, weight, dx, k8)
    # dgrad's B operand is the filter viewed as (C, (K, S, R)): KRSC with C and K padded.
    w_krsc = weight.permute(0, 2, 3, 1)
    if (c8, k8) != (c, k) or not w_krsc.is_contiguous():
        padded = torch.zeros((k8, r, s, c8), dtype=weight.dtype, device=weight.device)
        padded[:k, :, :, :c].copy_(w_krsc)
        w_krsc = padded
    out = dx.permute(0, 2, 3, 1) if c8 == c else torch.empty((n, h, w, c8), dtype=dx.dtype, device=dx.device)
    stride, padding, dilation = cls.stride, cls.padding, cls.dilation
    p, q = grad.shape[2], grad.shape[3]
    phases, full = dgrad_phases((h, w), (int(p), int(q)), (r, s), stride, padding, dilation)
    if not full:
        out.zero_()
    device, sms, stream = _launch_args(grad)
    # A strided dgrad's phases write disjoint pixels of dx: each runs on a side stream of its own, forked from and
    # joined back into the caller's stream, so that their short kernels overlap instead of each leaving the SMs
    # to drain (config.conv2d_dgrad_phase_streams).
    side = _side_streams(device, len(phases)) if (config.conv2d_dgrad_phase_streams and len(phases) > 1 and
                                                  dx.is_cuda) else None
    main = torch.cuda.current_stream(device) if side else None
    for index, (rows, cols) in enumerate(phases):
        with torch.cuda.stream(side[index]) if side else contextlib.nullcontext():
            if side:
                side[index].wait_stream(main)
                stream = side[index].cuda_stream
            _dgrad_phase(kern, cls, dy, w_krsc, out, rows, cols, (n, h, w, c8, k8, r, s), device, sms, stream)
    for other in side or ():
        main.wait_stream(other)
    if c8 != c:
        dx.permute(0, 2, 3, 1).copy_(out[..., :c])
    return dx


def _dgrad_phase(kern, cls, dy, w_krsc, out, rows, cols, dims, device, sms, stream) -> None:
    """One phase of a dgrad (all of it at unit stride): dx's pixels of these rows and columns from the taps
    that reach them."""
    n, h, w, c8, k8, r, s = dims
    stride = cls.stride
    # The taps of a phase are evenly spaced: a sliced view of the filter (no index tensor, so CUDA graphs can
    # capture this), made contiguous for TMA.
    sub = w_krsc
    if len(rows.taps) != r or len(cols.taps) != s:
        sub = w_krsc[:, _taps_slice(rows.taps), _taps_slice(cols.taps)].contiguous()
    if rows.count == h and cols.count == w:  # unit stride: the phase is all of dx
        view = out
    else:
        view = out[:, rows.start::stride[0], cols.start::stride[1], :][:, :rows.count, :cols.count]
    problem = (n, rows.count, cols.count, c8, k8, len(rows.taps), len(cols.taps), rows.lower, rows.upper,
               cols.lower, cols.upper, 1, 1, rows.dilation, cols.dilation)
    if cls.splits > 1:
        k_tiles = _ceil(k8, TILE_K) * len(rows.taps) * len(cols.taps)
        splits = normalize_splits(k_tiles, cls.splits)
        partial = torch.empty((splits, n, rows.count, cols.count, c8), dtype=torch.float32, device=out.device)
        _call(kern.dgrad, "conv2d_input_grad", dy, sub, partial, None, *problem, 0, 0, 0, splits, device, sms,
              stream)
        view.copy_(partial[0] if splits == 1 else partial.sum(0))
    else:
        sn, sh, sw, _ = view.stride()
        _call(kern.dgrad, "conv2d_input_grad", dy, sub, view, None, *problem, sn, sh, sw, 1, device, sms, stream)


# Side streams per device for a strided dgrad's phases (at most 4 in flight; more phases share them).
_SIDE_STREAMS: dict[int, list] = {}


def _side_streams(device: int, count: int) -> list:
    streams = _SIDE_STREAMS.get(device)
    if streams is None:
        streams = _SIDE_STREAMS[device] = [torch.cuda.Stream(device) for _ in range(4)]
    return [streams[i % len(streams)] for i in range(count)]


def _taps_slice(taps: tuple[int, ...]) -> slice:
    step = taps[1] - taps[0] if len(taps) > 1 else 1
    return slice(taps[0], taps[-1] + 1, step)


def _input_grad_through_columns(kern, dy: torch.Tensor, weight: torch.Tensor, dx: torch.Tensor, k8: int):
    """Few input channels (the stem): columns [N, P, Q, R*S*C padded] = dy . W, a 1x1 conv with the filter as
    R*S*C output channels over K input channels (one k-step for K=64, where the direct dgrad's 64-wide tile
    carries 8 padded channels: 963 us for the stem against cuDNN's 474), then col2im sums them into dx."""
    cls = kern.shape_class
    n, c, h, w = dx.shape
    k, _, r, s = weight.shape
    p, q = dy.shape[1], dy.shape[2]
    width = round_up(r * s * c)
    w_columns = torch.zeros((width, 1, 1, k8), dtype=weight.dtype, device=weight.device)
    w_columns[:r * s * c, 0, 0, :k].copy_(weight.permute(2, 3, 1, 0).reshape(r * s * c, k))  # rows (r, s, c)
    columns = torch.empty((n, p, q, width), dtype=dx.dtype, device=dx.device)
    _call(kern.fprop, "conv2d_input_grad", dy, w_columns, columns, None, n, p, q, k8, width, 1, 1, 0, 0, 0, 0,
          1, 1, 1, 1, 0, 0, 0, 1, *_launch_args(dy))
    elements = dx.numel()
    kern.col2im.launch(-(-elements // IM2COL_BLOCK), IM2COL_BLOCK, columns, dx.permute(0, 2, 3, 1), elements, h, w,
                       c, p, q, r, s, width, cls.stride[0], cls.stride[1], cls.padding[0], cls.padding[1],
                       cls.dilation[0], cls.dilation[1])
    return dx


def run_input_grad_cpu(kern, grad, weight, input_size, stride, padding, dilation) -> torch.Tensor:
    cls = kern.shape_class
    dx = torch.nn.grad.conv2d_input([int(v) for v in input_size], weight, grad, stride=cls.stride,
                                    padding=cls.padding, dilation=cls.dilation)
    return dx.contiguous(memory_format=CHANNELS_LAST)


def _input_grad_fake(grad, weight, input_size, stride, padding, dilation):
    return _channels_last_like(tuple(input_size), grad)


conv2d_input_grad = op(
    "jitops::conv2d_input_grad(Tensor grad, Tensor weight, SymInt[4] input_size, int[2] stride=1, "
    "int[2] padding=0, int[2] dilation=1) -> Tensor",
    shape_class=input_grad_shape_class,
    cuda=Impl(input_grad_cuda_kernels, run_input_grad_cuda),
    cpu=Impl(_no_kernels, run_input_grad_cpu),
    fake=_input_grad_fake,
    doc="Gradient of jitops.conv2d with respect to x (channels_last [N, C, H, W]).",
    fallback=run_input_grad_cpu,  # ATen (cuDNN on CUDA) while the kernels compile
)


# ---- jitops::conv2d_weight_grad: dw from dy and x ---------------------------------------------------------------
def weight_grad_shape_class(grad, x, weight_size, stride, padding, dilation) -> ConvClass:
    return _cached(_grad_class, "conv2d_weight_grad", grad, x, "x", weight_size, stride, padding, dilation, "weight")


# The split slices' sum, cast to dw's dtype and written into its KRSC memory (kernels/conv/wgrad_reduce.cu),
# for plans of two or more slices; one slice is copied into dw by torch.  False: torch's sum over the slices,
# then a copy, for every plan (bench_conv2d.py times both).  Lent H100, 2026-11-22 12:18, ResNet-50 at batch 32
# (benchmarks/results/conv2d_run7.json): split layers 0.7-3.4 us faster each with the kernel (L9 28.4 against
# 31.7 us), unsplit ones 1.7-3.8 us slower (L20 40.2 against 36.4: torch's copy moves 4 elements a thread).
WGRAD_REDUCE = CudaKernel("conv2d_wgrad_reduce", Source.file("conv/wgrad_reduce.cu"),
                          "jitops::conv2d_wgrad_reduce<{T}>", "ptr ptr i32 i64 i32 i32 i32")
REDUCE_BLOCK = 256


# One slice and channel counts that need no padding: the wgrad kernel writes dw (KRSC, in its dtype) itself, no
# fp32 slice and no copy (2-4 us a layer on ResNet-50's 7x7 layers, 13:22).  False: the slice and torch's copy (the
# benchmark's A/B).  Read when a layer is planned: the shape class carries it (ConvClass.direct), so the op's
# kernel memo follows a change.


def wgrad_direct(cls: ConvClass) -> bool:
    return cls.direct and cls.splits == 1  # planned only for aligned layers without im2col (_grad_class)


def weight_grad_cuda_kernels(cls: ConvClass, target: Target):
    kernels = _request("wgrad", cls, target)
    if kernels and cls.splits > 1:  # a single slice needs no reduction kernel (_reduce_into)
        kernels["reduce"] = WGRAD_REDUCE.bind(shapes.dtype_name(cls.dtype), T=shapes.CUDA_TYPES[cls.dtype])
    return _with_im2col(kernels, cls)


def _reduce_into(kern, partial: torch.Tensor, dw: torch.Tensor) -> None:
    """dw (channels_last [K, C, R, S], i.e. KRSC memory, seen as [K, taps, channels]) = the sum over partial's
    slices [splits][K8][taps][padded channels] of its first K rows and `channels` channels per tap."""
    splits, _, taps, _ = partial.shape
    k = dw.shape[0]
    channels = dw.numel() // (k * taps)
    if not config.conv2d_wgrad_reduce_kernel or splits == 1:
        total = partial[0] if splits == 1 else partial.sum(0)
        dw.permute(0, 2, 3, 1).view(k, taps, channels).copy_(total[:k, :, :channels])
        return
    rows = k * taps
    if rows * channels >= 2**31:
        raise ValueError(f"jitops.conv2d_weight_grad: the weight gradient has {rows * channels} elements; the "
                         "reduction kernel indexes it with 32 bits (at most 2**31 - 1)")
    kern.reduce.launch(-(-rows * channels // REDUCE_BLOCK), REDUCE_BLOCK, partial, dw, splits, partial[0].numel(),
                       rows, channels, partial.shape[-1])


def run_weight_grad_cuda(kern, grad, x, weight_size, stride, padding, dilation) -> torch.Tensor:
    direct = getattr(kern, "wgrad_direct", None)
    if not hasattr(kern, "wgrad") and direct is None:  # not a Hopper GPU
        return run_weight_grad_cpu(kern, grad, x, weight_size, stride, padding, dilation)
    cls = kern.shape_class
    k, c, r, s = (int(v) for v in weight_size)
    n, _, h, w = x.shape
    p, q = grad.shape[2], grad.shape[3]
    dw = _channels_last_like((k, c, r, s), grad)
    if dw.numel() == 0:
        return dw
    if grad.numel() == 0:
        return dw.zero_()
    c8, k8 = round_up(c), round_up(k)
    device, sms, stream = _launch_args(grad)
    splits = normalize_splits(_ceil(n * p * q, TILE_K), cls.splits)
    if cls.im2col and cls.fold:  # a wgrad of ceil(R/fold) taps over the folded matrix (_plan_fold), unfolded
        fold = cls.fold
        columns, taps = _folded_im2col(kern, x, cls, p, q)
        width = columns.shape[-1]
        partial = torch.empty((splits, k8, taps, 1, width), dtype=torch.float32, device=grad.device)
        _call(kern.wgrad, "conv2d_weight_grad", _nhwc(grad, k8), columns, partial, None, n, columns.shape[1], q,
              width, k8, taps, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, splits, device, sms, stream)
        # [K][tap][fold*S*C]: tap j's channels are filter rows j*fold .. (row, s, c); rows past R are dropped
        folded = _channels_last_like((k, fold * s * c, taps, 1), grad)
        _reduce_into(kern, partial.view(splits, k8, taps, width), folded)
        dw.permute(0, 2, 3, 1).copy_(folded.permute(0, 2, 3, 1).reshape(k, taps * fold, s, c)[:, :r])
        return dw
    if cls.im2col:  # dw as a 1x1 wgrad over the im2col matrix: [K, R*S*C] -> KRSC
        columns = _im2col(kern, x, r, s, cls.stride, cls.padding, cls.dilation, p, q)
        width = columns.shape[-1]
        partial = torch.empty((splits, k8, 1, 1, width), dtype=torch.float32, device=grad.device)
        _call(kern.wgrad, "conv2d_weight_grad", _nhwc(grad, k8), columns, partial, None, n, p, q, width, k8, 1, 1,
              0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, splits, device, sms, stream)
        _reduce_into(kern, partial.view(splits, k8, 1, width), dw)  # the columns are (r, s, c): KRSC order
        return dw
    geometry = (cls.padding[0], cls.padding[0], cls.padding[1], cls.padding[1], cls.stride[0], cls.stride[1],
                cls.dilation[0], cls.dilation[1], 0, 0, 0, splits, device, sms, stream)
    if direct is not None:  # one slice, c == c8 and k == k8: dw's KRSC memory is the kernel's output
        _call(direct, "conv2d_weight_grad", _nhwc(grad, k8), _nhwc(x, c8), dw, None, n, h, w, c8, k8, r, s,
              *geometry)
        return dw
    partial = torch.empty((splits, k8, r, s, c8), dtype=torch.float32, device=grad.device)
    _call(kern.wgrad, "conv2d_weight_grad", _nhwc(grad, k8), _nhwc(x, c8), partial, None, n, h, w, c8, k8, r, s,
          *geometry)
    _reduce_into(kern, partial.view(splits, k8, r * s, c8), dw)
    return dw


def run_weight_grad_cpu(kern, grad, x, weight_size, stride, padding, dilation) -> torch.Tensor:
    cls = kern.shape_class
    dw = torch.nn.grad.conv2d_weight(x, [int(v) for v in weight_size], grad, stride=cls.stride,
                                     padding=cls.padding, dilation=cls.dilation)
    return dw.contiguous(memory_format=CHANNELS_LAST)


def _weight_grad_fake(grad, x, weight_size, stride, padding, dilation):
    return _channels_last_like(tuple(weight_size), grad)


conv2d_weight_grad = op(
    "jitops::conv2d_weight_grad(Tensor grad, Tensor x, SymInt[4] weight_size, int[2] stride=1, "
    "int[2] padding=0, int[2] dilation=1) -> Tensor",
    shape_class=weight_grad_shape_class,
    cuda=Impl(weight_grad_cuda_kernels, run_weight_grad_cuda),
    cpu=Impl(_no_kernels, run_weight_grad_cpu),
    fake=_weight_grad_fake,
    doc="Gradient of jitops.conv2d with respect to weight (channels_last [K, C, R, S]).",
    fallback=run_weight_grad_cpu,  # ATen (cuDNN on CUDA) while the kernels compile
)


# ---- jitops::conv2d ----------------------------------------------------------------------------------------------
def shape_class(x, weight, bias, stride, padding, dilation) -> ConvClass:
    return _cached(_conv_class, "conv2d", x, weight, bias, stride, padding, dilation)


def _conv_class(op_name, x, weight, bias, stride, padding, dilation) -> ConvClass:
    if x.dim() != 4:
        _check_rank("conv2d", "x", x, "[N, C, H, W] (or, through jitops.conv2d, an unbatched [C, H, W])")
    if weight.dim() != 4:
        _check_rank("conv2d", "weight", weight, "[K, C, R, S]")
    _check_dtype("conv2d", [("x", x), ("weight", weight), ("bias", bias)])
    stride, padding, dilation = _geometry("conv2d", stride, padding, dilation)
    n, c, h, w = x.shape
    k, wc, r, s = weight.shape
    if wc != c:
        raise ValueError(f"jitops.conv2d: argument 'weight' has {wc} input channels (shape {tuple(weight.shape)}) "
                         f"but 'x' has {c} channels (shape {tuple(x.shape)}); groups are not supported")
    if bias is not None and tuple(bias.shape) != (k,):
        raise ValueError(f"jitops.conv2d: argument 'bias' has shape {tuple(bias.shape)}, expected ({k},) "
                         "(one value per output channel)")
    p = output_size(h, r, stride[0], padding[0], dilation[0])
    q = output_size(w, s, stride[1], padding[1], dilation[1])
    if p < 1 or q < 1 or r < 1 or s < 1:
        raise ValueError(f"jitops.conv2d: argument 'x' of spatial size {h}x{w} is smaller than the dilated "
                         f"{r}x{s} kernel with padding {padding} and dilation {dilation} (output {p}x{q})")
    aligned = c % ALIGN == 0 and k % ALIGN == 0
    if x.is_cpu:
        return ConvClass(x.dtype, (r, s), stride, padding, dilation, aligned, "")
    if _uses_im2col(c, r, s):
        fold, tile, splits, _ = _plan_fold("fprop", n, p, q, k, c, r, s, stride, dilation)
        return ConvClass(x.dtype, (r, s), stride, padding, dilation, aligned, tile, splits, True, fold=fold)
    tile, splits = plan_gemm("fprop", n * p * q, round_up(k), _ceil(round_up(c), TILE_K) * r * s)
    return ConvClass(x.dtype, (r, s), stride, padding, dilation, aligned, tile, splits)


def cuda_kernels(cls: ConvClass, target: Target):
    return _with_im2col(_request("fprop", cls, target), cls)


def run_cuda(kern, x, weight, bias, stride, padding, dilation) -> torch.Tensor:
    if not hasattr(kern, "fprop"):  # not a Hopper GPU
        return run_cpu(kern, x, weight, bias, stride, padding, dilation)
    cls = kern.shape_class
    n, c, h, w = x.shape
    k, _, r, s = weight.shape
    p = output_size(h, r, cls.stride[0], cls.padding[0], cls.dilation[0])
    q = output_size(w, s, cls.stride[1], cls.padding[1], cls.dilation[1])
    y = _channels_last_like((n, k, p, q), x)
    if y.numel() == 0:
        return y
    if c == 0:
        return y.copy_(bias.view(1, k, 1, 1).expand_as(y)) if bias is not None else y.zero_()
    c8, k8 = round_up(c), round_up(k)
    w_krsc = None
    if cls.im2col and cls.fold:  # a conv of ceil(R/fold) taps over the matrix of `fold` filter rows (_plan_fold)
        x, taps = _folded_im2col(kern, x, cls, p, q)
        x = x.permute(0, 3, 1, 2)
        w_krsc = _fold_weight(weight, cls.fold, k8, x.shape[1])
        c, h, w, r, s, c8 = x.shape[1], x.shape[2], q, taps, 1, x.shape[1]
        cls = cls._replace(stride=(1, 1), padding=(0, 0), dilation=(1, 1))
    elif cls.im2col:  # a 1x1 conv over the im2col matrix [N, P, Q, R*S*C]: x and w become (R*S*C)-channel tensors
        x = _im2col(kern, x, r, s, cls.stride, cls.padding, cls.dilation, p, q).permute(0, 3, 1, 2)
        weight = weight.permute(0, 2, 3, 1).reshape(k, r * s * c, 1, 1)
        c, h, w, r, s, c8 = r * s * c, p, q, 1, 1, x.shape[1]
        cls = cls._replace(stride=(1, 1), padding=(0, 0), dilation=(1, 1))
    if w_krsc is None and k8 == k:
        w_krsc = _nhwc(weight, c8)
    if w_krsc is None:
        w_krsc = torch.zeros((k8, r, s, c8), dtype=weight.dtype, device=weight.device)
        w_krsc[:k, :, :, :c].copy_(weight.permute(0, 2, 3, 1))
    if bias is not None and (k8 != k or not bias.is_contiguous() or bias.data_ptr() % 16):
        padded = torch.zeros(k8, dtype=bias.dtype, device=bias.device)
        padded[:k].copy_(bias)
        bias = padded
    problem = (n, h, w, c8, k8, r, s, cls.padding[0], cls.padding[0], cls.padding[1], cls.padding[1],
               cls.stride[0], cls.stride[1], cls.dilation[0], cls.dilation[1], 0, 0, 0)
    if cls.splits > 1:  # fp32 partial sums of GEMM-K slices, reduced here (bias added once, at the end)
        splits = normalize_splits(_ceil(c8, TILE_K) * r * s, cls.splits)
        partial = torch.empty((splits, n, p, q, k8), dtype=torch.float32, device=x.device)
        _call(kern.fprop, "conv2d", _nhwc(x, c8), w_krsc, partial, None, *problem, splits, *_launch_args(x))
        total = partial[0] if splits == 1 else partial.sum(0)
        if bias is not None:
            total += bias.float()
        y.permute(0, 2, 3, 1).copy_(total[..., :k])
        return y
    out = y.permute(0, 2, 3, 1) if k8 == k else torch.empty((n, p, q, k8), dtype=x.dtype, device=x.device)
    _call(kern.fprop, "conv2d", _nhwc(x, c8), w_krsc, out, bias, *problem, 1, *_launch_args(x))
    if k8 != k:
        y.permute(0, 2, 3, 1).copy_(out[..., :k])
    return y


def run_cpu(kern, x, weight, bias, stride, padding, dilation) -> torch.Tensor:
    cls = kern.shape_class
    y = torch.nn.functional.conv2d(x, weight, bias, stride=cls.stride, padding=cls.padding, dilation=cls.dilation)
    return y.contiguous(memory_format=CHANNELS_LAST)


def fake(x, weight, bias, stride, padding, dilation):
    stride, padding, dilation = _geometry("conv2d", stride, padding, dilation)
    n, _, h, w = x.shape
    k, _, r, s = weight.shape
    return _channels_last_like((n, k, output_size(h, r, stride[0], padding[0], dilation[0]),
                                output_size(w, s, stride[1], padding[1], dilation[1])), x)


# ---- autograd: dgrad for x, wgrad for weight, a reduction for bias; each only when needed ----------------------
def setup_context(ctx, inputs, output) -> None:
    x, weight, bias, stride, padding, dilation = inputs
    ctx.geometry = (stride, padding, dilation)
    ctx.input_size = tuple(x.shape)
    ctx.weight_size = tuple(weight.shape)
    need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    ctx.save_for_backward(x if need_w else None, weight if need_x else None)


def backward(ctx, grad: torch.Tensor):
    x, weight = ctx.saved_tensors
    stride, padding, dilation = ctx.geometry
    dx = dw = db = None
    if ctx.needs_input_grad[0]:
        dx = conv2d_input_grad(grad, weight, ctx.input_size, stride, padding, dilation)
    if ctx.needs_input_grad[1]:
        dw = conv2d_weight_grad(grad, x, ctx.weight_size, stride, padding, dilation)
    if ctx.needs_input_grad[2]:
        db = grad.sum(dim=(0, 2, 3))
    return dx, dw, db


# ---- ResNet-50 at batch 32 (torchvision v1.5: stride in the 3x3): the shape classes the benchmarks and the
# deployment prewarm use.  (in channels, out channels, input size, kernel, stride, padding)
RESNET50 = [
    (3, 64, 224, 7, 2, 3),                                                    # stem (C=3: channel-padded)
    (64, 64, 56, 1, 1, 0), (64, 64, 56, 3, 1, 1), (64, 256, 56, 1, 1, 0), (256, 64, 56, 1, 1, 0),    # layer1
    (256, 128, 56, 1, 1, 0), (128, 128, 56, 3, 2, 1), (256, 512, 56, 1, 2, 0),                        # layer2 in
    (128, 128, 28, 3, 1, 1), (128, 512, 28, 1, 1, 0), (512, 128, 28, 1, 1, 0),                        # layer2
    (512, 256, 28, 1, 1, 0), (256, 256, 28, 3, 2, 1), (512, 1024, 28, 1, 2, 0),                       # layer3 in
    (256, 256, 14, 3, 1, 1), (256, 1024, 14, 1, 1, 0), (1024, 256, 14, 1, 1, 0),                      # layer3
    (1024, 512, 14, 1, 1, 0), (512, 512, 14, 3, 2, 1), (1024, 2048, 14, 1, 2, 0),                     # layer4 in
    (512, 512, 7, 3, 1, 1), (512, 2048, 7, 1, 1, 0), (2048, 512, 7, 1, 1, 0),                         # layer4
]


def _prewarm_items(batch: int = 32) -> list[dict]:
    """One public conv2d item per layer: it builds fprop, dgrad and wgrad (the op's companions)."""
    items = []
    for c, k, size, kernel, stride, padding in RESNET50:
        kwargs = {"stride": [stride, stride], "padding": [padding, padding], "dilation": [1, 1]}
        x, wt = [batch, c, size, size], [k, c, kernel, kernel]
        items.append({"op": "conv2d", "dtypes": ["fp16", "bf16"], "shapes": [[x, wt, None]], "kwargs": kwargs})
    return items


# Manifest items for `cache_tools prewarm --all-builtin`: ResNet-50's conv layers.
PREWARM = _prewarm_items()


def companions(x, weight, bias, stride, padding, dilation, *, needs):
    """The backward's calls (see backward above), for manifests and prefetching: dy shaped like the output."""
    if not (needs[0] or needs[1]):
        return []
    (n, _, h, w), (k, _, r, s) = x.shape, weight.shape
    st, pad, dil = _geometry("conv2d", stride, padding, dilation)
    grad = shapes.placeholder(x, (n, k, output_size(h, r, st[0], pad[0], dil[0]),
                                  output_size(w, s, st[1], pad[1], dil[1])))
    calls = []
    if needs[0]:
        calls.append((conv2d_input_grad, (grad, weight, list(x.shape), stride, padding, dilation)))
    if needs[1]:
        calls.append((conv2d_weight_grad, (grad, x, list(weight.shape), stride, padding, dilation)))
    return calls


_conv2d = op(
    "jitops::conv2d(Tensor x, Tensor weight, Tensor? bias=None, int[2] stride=1, int[2] padding=0, "
    "int[2] dilation=1) -> Tensor",
    shape_class=shape_class,
    cuda=Impl(cuda_kernels, run_cuda),
    cpu=Impl(_no_kernels, run_cpu),
    fake=fake,
    setup_context=setup_context,
    backward=backward,
    companions=companions,
    doc=__doc__,
    fallback=run_cpu,  # ATen (cuDNN on CUDA) while the kernels compile
)


# ---- the public function: torch's argument forms, reduced to what the op takes --------------------------------
def _same_padding(weight, stride, dilation) -> tuple[tuple[int, int], list[int]]:
    """padding="same": (symmetric padding, F.pad's [left, right, top, bottom] for the odd extra row/column).
    The dilated kernel's extent minus one, d * (k - 1), is split in two; an odd remainder goes at the end
    (bottom, right), as torch's _convolution_same puts it."""
    if _pair("conv2d", "stride", stride) != (1, 1):
        raise ValueError(f"jitops.conv2d: argument 'padding' is 'same' but 'stride' is {stride!r}; torch and jitops "
                         "take padding='same' for stride 1 only: give the padding as ints")
    if not isinstance(weight, torch.Tensor):
        shapes.check_tensor("conv2d", "weight", weight)
    if weight.dim() != 4:
        _check_rank("conv2d", "weight", weight, "[K, C, R, S]")
    dilation = _geometry("conv2d", 1, 0, dilation)[2]
    total = [dilation[i] * (weight.shape[2 + i] - 1) for i in range(2)]
    extra = [0, total[1] % 2, 0, total[0] % 2]
    return (total[0] // 2, total[1] // 2), extra if any(extra) else []


def _op_call(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """(jitops::conv2d's arguments, whether x is unbatched) for a call of jitops.conv2d."""
    if groups != 1:
        raise ValueError(f"jitops.conv2d: argument 'groups' is {groups!r}; grouped and depthwise convolutions are "
                         "not implemented yet (docs/semantics.md): use torch.nn.functional.conv2d for them")
    if type(padding) is str:
        if padding == "valid":
            padding = 0
        elif padding == "same":
            padding, extra = _same_padding(weight, stride, dilation)
            if extra and isinstance(x, torch.Tensor):
                x = torch.nn.functional.pad(x, extra)
        else:
            raise ValueError(f"jitops.conv2d: argument 'padding' is {padding!r}; use an int, a pair of ints, "
                             "'same' or 'valid'")
    unbatched = isinstance(x, torch.Tensor) and x.dim() == 3
    if unbatched:  # [C, H, W]: a batch of one
        x = x.unsqueeze(0)
    return (x, weight, bias, stride, padding, dilation), unbatched


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    if groups == 1 and type(padding) is not str and (not isinstance(x, torch.Tensor) or x.dim() != 3):
        return _conv2d(x, weight, bias, stride, padding, dilation)  # the op's own arguments
    args, unbatched = _op_call(x, weight, bias, stride, padding, dilation, groups)
    y = _conv2d(*args)
    return y.squeeze(0) if unbatched else y


conv2d.__doc__ = __doc__
conv2d.op = _conv2d.op  # type: ignore[attr-defined]
public("conv2d", conv2d, entries=(_conv2d,), parts=(conv2d_input_grad, conv2d_weight_grad),
       bind=lambda *args, **kwargs: (_conv2d, _op_call(*args, **kwargs)[0]))
