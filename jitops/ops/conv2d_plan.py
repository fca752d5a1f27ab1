"""How jitops.conv2d picks its kernels: the tile table, the cost models fitted to the op's benchmark sweeps (their
constants: jitops/ops/conv2d_costs.py), the split-K and im2col-fold choices, the phases of a strided dgrad, and the
argument forms (stride, padding, dilation as an int or a pair) with the geometries that run as one GEMM
(takes_patches).

Pure Python on integers (no GPU, no torch tensors): the shape classes in jitops/ops/conv2d.py call plan_gemm,
plan_wgrad and _plan_fold, and tests check the plans on the CPU.  Benchmarks force a plan with
config.scope(conv2d_tile=..., conv2d_splits=..., conv2d_fold=...) (jitops/config.py).  The fitters of the cost
models are tools/fit_conv_gemm_cost.py and tools/fit_wgrad_cost.py, over the sweeps in tools/data/; the op's
latest figures are in docs/benchmarks.md.  Last, the memo of the classes conv2d.py computes (cached_class), keyed
on the tensors' shapes and dtypes.
"""
from __future__ import annotations

import functools
import operator
from typing import NamedTuple

import torch

from ..config import config
from ..shapes import Phase1D, dgrad_residues
from . import conv2d_costs as costs


ALIGN = 8            # channels per 16 bytes of fp16/bf16: TMA's stride alignment
TILE_K = 64          # GEMM-K per pipeline stage (kernels/conv/conv2d_sm90.cu)
HOPPER_SMS = 132     # tile heuristics assume an H100 SXM; the kernels run on any sm_90 part
LIGHT_CLUSTER_K_TILES = 16  # light_cluster: fewer k-steps a tile gain nothing from sharing A


# Tile configurations (TILE_M x TILE_N of the implicit GEMM), per operator, chosen by a cost model (plan_gemm)
# fitted to measurements on the H100 (tools/data/conv2d-*.json).  wgrad splits GEMM-K (N*P*Q) into fp32
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
         # Candidates `bench_conv2d.py --tiles` times; in no plan.  Clusters for wgrad (H100):
         # the 128x128 ones within 1-3 us of 128x128; 64x128c2x1 up to 2x slower than 64x128 on the 64-channel
         # 3x3 layer.
         "128x128c2x1": Tile(128, 128, 2, 1), "128x128c1x2": Tile(128, 128, 1, 2), "64x128c2x1": Tile(64, 128, 2, 1),
         "128x256c2x1": Tile(128, 256, 2, 1), "128x256c1x2": Tile(128, 256, 1, 2), "64x256c1x2": Tile(64, 256, 1, 2)}

# wgrad's 128x64 clusters are planned for 1x1 filters only (wgrad_candidates).
OPERATOR_TILES = {"fprop": ("128x64", "128x128", "128x256", "128x64c1x2", "128x64c2x1"),
                  "dgrad": ("128x64", "128x128", "128x256", "128x64c1x2", "128x64c2x1"),
                  "wgrad": ("64x64", "64x192t3", "64x128", "128x64", "128x128", "128x256", "64x256", "128x64c1x2",
                            "128x64c2x1")}
SPLIT_TILE = "128x128"           # the split-K variant of fprop and dgrad (only when forced)

REDUCE_BLOCK = 256   # threads a block of the wgrad reduction and unfold kernels (conv2d_run launches them)


# ---- the shape class: the plan of one layer -----------------------------------------------------------------
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
    cluster: int = 1            # the light kernel's CTAs a cluster (light_cluster); CUTLASS's take the tile's


def output_size(size: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def round_up(n: int, multiple: int = ALIGN) -> int:
    return (n + multiple - 1) // multiple * multiple


# ---- arguments: torch's int-or-pair forms, and the geometries that are one GEMM over patches -------------------
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


def takes_patches(r: int, s: int, stride, padding, dilation) -> bool:
    """Whether an R x S filter with this geometry convolves non-overlapping patches: stride = filter size,
    padding 0 ("valid") and dilation 1.  Such a conv is one GEMM, patches (N*P*Q, C*R*S) x weight (K, C*R*S)^T,
    which jitops.conv2d runs on jitops.linear.  1x1 stride-1 (pointwise) convs are excluded: they are a plain GEMM
    in the conv kernels already (GEMM-K = C, no gather), common in ResNets (_prewarm_items lists ResNet-50's),
    and keep the conv op's channels_last gradients there."""
    if (r == 1 and s == 1) or r < 1 or s < 1:  # (an empty filter: the conv op names the stride it cannot take)
        return False
    if padding != "valid" and (type(padding) is str or _int_pair("padding", padding) != (0, 0)):
        return False
    return _int_pair("stride", stride) == (r, s) and _int_pair("dilation", dilation) == (1, 1)


def _int_pair(name: str, value) -> tuple[int, int]:
    """_pair with a shortcut for a pair of ints (a module's stride): every conv call asks takes_patches."""
    if type(value) is tuple and len(value) == 2 and type(value[0]) is int and type(value[1]) is int:
        return value
    return _pair("conv2d", name, value)


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
    other kernels store from registers, element by element (3-11 us slower on ResNet-50's one-slice layers,
    H100)."""
    t = TILES[tile]
    if t.taps > 1:
        return wgrad_tile_serves(tile, channels, filter_rs)
    return filter_rs == (1, 1) or channels % t.n == 0


def wgrad_tile_serves(tile: str, channels: int, filter_rs: tuple[int, int]) -> bool:
    """Whether a wgrad tile can run this layer: a tile over T taps is one whole filter row, exactly its channels
    and its S = T taps (kernels/conv/conv_sm90.cuh, WgradTapSpanning::can_implement)."""
    t = TILES[tile]
    return t.taps == 1 or (channels == t.channels and filter_rs[1] == t.taps)


def _one_cta(tile: str) -> bool:
    return TILES[tile].cluster_m * TILES[tile].cluster_n == 1


def wgrad_candidates(channels: int, filter_rs: tuple[int, int], light: bool = False) -> tuple[str, ...]:
    """The tiles a wgrad plan chooses from: those that store through TMA where there are any (the flat ones;
    64-row tiles store from registers either way, kernels/conv/conv2d_sm90.cu), thread block clusters only for
    1x1 filters, and tiles over several taps where the filter's width takes them.  Clusters (multicast of the
    shared operand) were the fastest tile on 12 of the 14 1x1 layers of ResNet-50 and slower on 5 of the 7 3x3
    ones (H100, best split each; tools/data/conv2d-wgrad-tiles-wide-clusters.json).  light: the light kernel's,
    tiles of one filter tap and no clusters (its wgrad runs every tile as one CTA: light_cluster)."""
    one_by_one = filter_rs == (1, 1)
    tiles = tuple(t for t in OPERATOR_TILES["wgrad"] if wgrad_tile_serves(t, channels, filter_rs) and
                  (not light or (TILES[t].taps == 1 and _one_cta(t))) and
                  (wgrad_flat(t, channels, filter_rs) or TILES[t].m == 64) and
                  (one_by_one or _one_cta(t)))
    return tiles or tuple(t for t in OPERATOR_TILES["wgrad"] if TILES[t].taps == 1)


def plan_wgrad(k: int, channels: int, filter_rs: tuple[int, int], k_tiles: int) -> tuple[str, int, bool]:
    """(tile, splits, flat) of the weight gradient dw (K x R*S*C) over k_tiles 64-deep k-steps: the cheapest by
    wgrad_cost_us among wgrad_candidates, each at its best split count."""
    forced_tile, forced_splits = _forced_tile("wgrad"), config.conv2d_splits.get("wgrad")
    if forced_tile and not wgrad_tile_serves(forced_tile, channels, filter_rs):
        raise ValueError(f"jitops: wgrad tile {forced_tile!r} (config.conv2d_tile) covers a filter row of "
                         f"{TILES[forced_tile].taps} taps x {TILES[forced_tile].channels} channels; this layer's "
                         f"is {filter_rs[1]} x {channels}")
    light = config.conv2d_sm90_kernel == "light"  # its wgrad takes one tap a tile (jitops/light_conv.py)
    tiles = (forced_tile,) if forced_tile else wgrad_candidates(channels, filter_rs, light=light)
    plans = [(t, normalize_splits(k_tiles, s)) for t in tiles
             for s in ((forced_splits,) if forced_splits else range(1, 257))]
    tile, splits = min(plans, key=lambda plan: wgrad_cost_us(plan[0], plan[1], round_up(k), channels, filter_rs,
                                                             k_tiles, light))
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
                  k_tiles: int, light: bool = False) -> float:
    """Predicted microseconds of a wgrad plan: CUTLASS's kernel (conv2d_costs.WGRAD_TILE_US and the constants after
    it) or the light kernel's (conv2d_costs.LIGHT_WGRAD_TILE_US and after)."""
    t = TILES[tile]
    # the light fit has no L2-loads term, CUTLASS's none for the reduction's depth
    table, per_gb, split_us, per_mb, per_depth = (
        (costs.LIGHT_WGRAD_TILE_US, 0.0, costs.LIGHT_WGRAD_SPLIT_US, costs.LIGHT_WGRAD_US_PER_MB_SLICES,
         costs.LIGHT_WGRAD_US_PER_SLICE_DEPTH) if light else
        (costs.WGRAD_TILE_US, costs.WGRAD_US_PER_GB_LOADED, costs.WGRAD_SPLIT_US, costs.WGRAD_US_PER_MB_SLICES, 0.0))
    step_us, wave_us = table.get(f"{t.m}x{t.n}", table["128x128"])
    work = wgrad_work_tiles(tile, k, channels, filter_rs, splits)
    steps = _ceil(k_tiles, splits)
    cost = _ceil(work, HOPPER_SMS) * (steps * step_us + wave_us)
    # A cluster's CTAs share (multicast) the operand tile they have in common: along M the B tile, along N A's.
    rows_loaded = t.m / t.cluster_n + t.n / t.cluster_m
    cost += work * steps * rows_loaded * TILE_K * 2 / 1e9 * per_gb
    if splits > 1:
        cost += split_us + splits * k * channels * filter_rs[0] * filter_rs[1] * 4 / 1e6 * per_mb
        cost += reduce_depth(splits, k, channels, filter_rs) * per_depth
    return cost


def reduce_depth(splits: int, k: int, channels: int, filter_rs: tuple[int, int]) -> float:
    """The slices each thread of the wgrad reduction sums, scaled by how far dw's elements (one thread each) fall
    short of a block on every SM: splits where they do not fill it, less where they do."""
    return splits * min(1.0, HOPPER_SMS * REDUCE_BLOCK / (k * channels * filter_rs[0] * filter_rs[1]))


def gemm_cost_us(operator: str, tile: str, splits: int, m: int, n: int, k_tiles: int) -> float:
    """Predicted microseconds of an fprop or dgrad plan (conv2d_costs.GEMM_TILE_US; a tile without constants, only
    ever forced, costs as 128x128)."""
    table = costs.GEMM_TILE_US[operator]
    step_us, wave_us = table.get(tile, table["128x128"])
    return _ceil(_work_tiles(tile, m, n, splits), HOPPER_SMS) * (_ceil(k_tiles, splits) * step_us + wave_us)


def light_cluster(operator: str, tile: str, splits: int, m: int, n: int, k_tiles: int,
                  stride: tuple[int, int] = (1, 1)) -> int:
    """CTAs a cluster of the light kernel's fprop or unit-stride dgrad (jitops/light_conv.py, LIGHT_CLUSTER): 2 on a
    128 x 64 plan with at least LIGHT_CLUSTER_K_TILES k-steps whose pairs of tiles run in no more rounds on the 66
    clusters the driver fits on 132 SMs than the tiles alone, else 1.  A pair shares A's tile, each CTA loading half
    (H200, bf16, ResNet-50 at batch 32, against cluster 1, bit for bit: 18-72 k-steps x1.10-1.29, fprop L6, L8,
    L18, L20, L22 and dgrad L8, L20, L21; 8 k-steps x0.94-1.00, fprop L10 and dgrad L9; a 64-wide N, whose pair
    is half empty, x0.51-0.89).  Not a wgrad: its splits are planned for single CTAs, and pairs measured
    x0.87-1.03."""
    t = TILES[tile]
    if operator == "wgrad" or splits > 1 or (t.m, t.n) != (128, 64) or tuple(stride) != (1, 1) \
            or k_tiles < LIGHT_CLUSTER_K_TILES:
        return 1
    tiles_m, tiles_n = _ceil(m, t.m), _ceil(n, t.n)
    return 2 if _ceil(tiles_m * _ceil(tiles_n, 2), HOPPER_SMS // 2) <= _ceil(tiles_m * tiles_n, HOPPER_SMS) else 1


def _plan_best(operator: str, candidates, m: int, n: int, k_tiles: int):
    tile, splits = min(candidates, key=lambda plan: gemm_cost_us(operator, plan[0], plan[1], m, n, k_tiles))
    return tile, normalize_splits(k_tiles, splits)


# ---- strided dgrad as unit-stride phases (pure; tested on the CPU) --------------------------------------------
def dgrad_phases_1d(size: int, out_size: int, kernel: int, stride: int, padding: int,
                    dilation: int) -> tuple[list[Phase1D], bool]:
    """Phases of one spatial dimension for CUTLASS's unit-stride dgrad, and whether they write every dx row (if
    not, dx must be zeroed first): shapes.dgrad_residues (the light kernel runs them all), less those no tap
    reaches, clipped to the rows whose taps read inside dy (the rest are zeros)."""
    phases = []
    written = 0
    for phase in dgrad_residues(size, out_size, kernel, stride, padding, dilation):
        if not phase.taps:
            continue
        e0 = phase.lower
        span = (len(phase.taps) - 1) * phase.dilation
        first = max(0, -e0)                                   # rows before this read only dy[< 0]
        end = min(phase.count, out_size - e0 + span)          # rows from here read only dy[>= out_size]
        if end <= first:
            continue
        phases.append(phase._replace(start=phase.start + stride * first, count=end - first, lower=e0 + first,
                                     upper=out_size - end - e0 + span))
        written += end - first
    return phases, written == size


@functools.lru_cache(maxsize=1024)
def dgrad_phases(input_hw: tuple[int, int], output_hw: tuple[int, int], kernel: tuple[int, int],
                 stride: tuple[int, int], padding: tuple[int, int], dilation: tuple[int, int]):
    """2-D phases (row phase, column phase) and whether together they write all of dx."""
    rows, rows_full = dgrad_phases_1d(input_hw[0], output_hw[0], kernel[0], stride[0], padding[0], dilation[0])
    cols, cols_full = dgrad_phases_1d(input_hw[1], output_hw[1], kernel[1], stride[1], padding[1], dilation[1])
    return tuple((r, c) for r in rows for c in cols), rows_full and cols_full


# ---- few input channels: an explicit im2col matrix, and how many filter rows it folds -------------------------
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


IM2COL_SHARED_BYTES = 40 * 1024   # a block's rows and tables stay under the 48 KB that needs no opt-in


def _im2col_shared_bytes(block_rows: int, columns: int, element_size: int) -> int:
    """kernels/conv/im2col.cu's shared memory: the rows, then 16 bytes a column (an offset and two ints)."""
    return block_rows * columns * element_size + 16 * columns


# A strided few-channel fprop need not materialise every filter row: the matrix of a `fold` x S filter at stride
# (fold, stride_w), one row per `fold` input rows, holds fold*S*C columns, and a conv of ceil(R/fold) taps over
# it at unit stride is the layer (row p reads matrix rows p .. p + R/fold - 1, i.e. input rows p*fold - pad + r).
# For the stem (7x7 stride 2, C=3, 224x224, batch 32) that is a 40 MB matrix of 48 columns and 4 k-steps a tile
# instead of 122 MB, 152 columns, 3 k-steps.  The weight gradient is the same wgrad over the folded matrix, its
# (R/fold, 1) filter of fold*S*C channels unfolded into dw.  _plan_fold picks by writing and reading the matrix
# at the im2col kernel's measured rate (122 MB in 81.5 us on the H100) plus the GEMM's fitted
# cost.
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


# One slice and channel counts that need no padding: the wgrad kernel writes dw (KRSC, in its dtype) itself, no
# fp32 slice and no copy (2-4 us a layer on ResNet-50's 7x7 layers).  config.conv2d_wgrad_direct=False: the slice
# and torch's copy (the benchmark's A/B).  Read when a layer is planned: the shape class carries it
# (ConvClass.direct), so the op's kernel memo follows a change.
def wgrad_direct(cls: ConvClass) -> bool:
    return cls.direct and cls.splits == 1  # planned only for aligned layers without im2col (_grad_class)


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


# ---- memo of the shape classes --------------------------------------------------------------------------------
# Shape classes run on every call; validating and picking a tile costs ~10 us of Python, so each distinct
# combination of argument shapes, dtypes, device kind and geometry is classified once.  Errors are not cached.
_CLASSES: dict = {}


def _hashable(value):
    if isinstance(value, torch.Tensor):
        return (value.shape, value.dtype)
    return tuple(value) if type(value) is list else value


def cached_class(compute, op_name: str, a: torch.Tensor, b: torch.Tensor, *rest) -> ConvClass:
    """compute(op_name, a, b, *rest), memoised on the shapes, dtypes and device kind of the tensors and the
    values of everything else."""
    try:
        # Benchmarks and tests force a plan with config.scope(conv2d_tile=..., conv2d_splits=..., conv2d_fold=...):
        # config.generation changes with every scope, so a class planned under other knobs is not reused.
        key = (op_name, a.shape, b.shape, a.dtype, b.dtype, a.is_cpu, *map(_hashable, rest), config.generation)
        cls = _CLASSES.get(key)
    except TypeError:  # symbolic sizes (torch.compile with dynamic shapes) are not hashable: no caching
        return compute(op_name, a, b, *rest)
    if cls is None:
        cls = compute(op_name, a, b, *rest)
        if len(_CLASSES) > 4096:
            _CLASSES.clear()
        _CLASSES[key] = cls
    return cls
