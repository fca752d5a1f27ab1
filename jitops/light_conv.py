"""The host side of jitops.conv2d's light sm_90a kernels: the light GEMM kernel (kernels/gemm/sm90_light_gemm.cu)
built with LIGHT_CONV, an implicit GEMM whose activation operand TMA loads in im2col mode.  The default
(JITOPS_CONV2D_SM90_KERNEL=light); =cutlass takes CUTLASS's conv kernels (kernels/conv/conv2d_sm90.cu, nvcc).

Why: a CUTLASS 3 conv kernel takes 39-46 s of nvcc on a 2-core machine, most of it instantiating templates
(docs/architecture.md); conv2d's 42 kernels were 1532 s of the 1704 s an image's prewarm spent compiling.  A light
conv kernel compiles through NVRTC in 0.2-0.7 s, and over ResNet-50's layers runs level with CUTLASS's
(docs/benchmarks.md).

Covered: fprop at any stride, padding and dilation (bias fused; or fp32 out, no bias: the stem's columns); dgrad
in one slice, a strided one as its unit-stride phases in one launch, stored by rows (LIGHT_D_ROWS); wgrad into
fp32 slices or, in one slice of aligned channels, straight into dw.  Each with the tile width of the class's plan
(64, 128 or 256; 128 rows; the plan's clusters are dropped); an fprop or unit-stride dgrad on 128 x 64 tiles runs in
clusters of two CTAs that share A's tile where the pairs fit the grid (LIGHT_CLUSTER 2, conv2d_plan.light_cluster).
Not covered: split-K fprop and dgrad plans (only ever forced through config.conv2d_splits) and wgrad tiles over
several taps (plan_wgrad leaves those out under this setting): those take CUTLASS's kernels.  The host object
takes the CUTLASS library's arguments (conv2d_run._call), so the op's launch code does not change: (n, h, w, c)
describe x or dx, (k, r, s) the filter, padding (lower, upper) per dimension.
"""
from __future__ import annotations

import ctypes
import struct
from typing import Any, NamedTuple

from . import shapes
from .cutlass_host import SWIZZLE_128B, TMA_FLOAT32, TMA_UINT16, Im2colArgs, TmaArgs
from .launch import CudaFunction
from .light_gemm import (FIELDS, GROUP_ROWS, IN_TYPES, LIGHT_GEMM, PHASES_PARAMS_SIZE, STORE_ROWS, TILE_K, TILE_M,
                         LightKernel, _FIELDS, grid, output_tma, Problem)

OPERATORS = {"fprop": 1, "dgrad": 2, "wgrad": 3}
CONV_FIELDS = FIELDS + _FIELDS.size           # the sixteen conv ints follow the GEMM's fields
_CONV_FIELDS = struct.Struct("<16i")
# TMA's im2col limits for a rank-4 (NHWC) tensor: the bounding box's corners within [-128, 127], a load's filter
# offsets within [0, 255] (16 bits shared by the two spatial dimensions).
CORNER_LIMIT = 128
OFFSET_LIMIT = 256
# A strided dgrad's phases (LIGHT_D_ROWS): up to MAX_PHASES a launch, each a Phase (192 bytes: its im2col descriptor
# of dy, then fourteen ints) after Params' conv fields and their count.
MAX_PHASES = 4
PHASES_FIELD = CONV_FIELDS + _CONV_FIELDS.size
PHASE_ENTRIES = 512
PHASE_BYTES = 192
_PHASE_FIELDS = struct.Struct("<14i")
assert PHASES_PARAMS_SIZE == PHASE_ENTRIES + MAX_PHASES * PHASE_BYTES


def unsupported(name: str, cls: Any, fp32_out: bool = False) -> str | None:
    """Why the light kernels cannot run operator `name` of a conv class (ConvClass), or None when they can."""
    if name not in OPERATORS:
        return f"operator {name}"
    if cls.dtype not in IN_TYPES:
        return f"inputs of {cls.dtype}"
    if cls.splits > 1 and name != "wgrad":
        return "a split-K plan"
    if name == "wgrad" and "t" in cls.tile:
        return "a wgrad tile over several filter taps"
    (r, s), (pad_h, pad_w), (dil_h, dil_w) = cls.kernel, cls.padding, cls.dilation
    reach_h, reach_w = dil_h * (r - 1), dil_w * (s - 1)
    if max(reach_h, reach_w) >= OFFSET_LIMIT or max(pad_h, pad_w, reach_h, reach_w) >= CORNER_LIMIT:
        return "a filter reach or padding beyond TMA's im2col corners"
    return None


def _plan_tile(cls: Any) -> tuple[int, int]:
    """(rows, columns) of the plan's tile, from its name in conv2d_plan.TILES ("128x64c1x2", "64x192t3")."""
    rows, rest = cls.tile.split("x", 1)
    return int(rows), int(rest.split("c")[0].split("t")[0])


def tile_n_for(cls: Any) -> int:
    """The width of the plan's tile (conv2d_plan.TILES: 128 rows by 64, 128 or 256 for fprop and dgrad)."""
    return _plan_tile(cls)[1]


def tile_m_for(name: str, cls: Any) -> int:
    """The rows of the kernel's tiles: a wgrad's plan's (64 where the layer has at most 64 filters: CUTLASS's
    plans), else 128."""
    return 64 if name == "wgrad" and _plan_tile(cls)[0] == 64 else TILE_M


def cluster_for(name: str, cls: Any) -> int:
    """The class's cluster (conv2d_plan.light_cluster: 2 for an fprop or unit-stride dgrad on 128 x 64 tiles whose
    pairs fit the grid), 1 for anything else: a wgrad, a strided dgrad's phase kernel, the stem's columns."""
    strided_dgrad = name == "dgrad" and tuple(cls.stride) != (1, 1)
    return cls.cluster if name != "wgrad" and not strided_dgrad else 1


def request(name: str, cls: Any, fp32_out: bool = False, direct: bool = False, cluster: int | None = None):
    """The kernel of operator `name`; fp32_out: fp32 out (fprop's columns); direct: a wgrad that writes dw itself
    (one slice), else into fp32 slices; cluster: 1 or 2 CTAs along N (None: cluster_for's)."""
    wgrad = name == "wgrad"  # MN-major operands
    cluster = cluster_for(name, cls) if cluster is None else cluster
    extra = {"LIGHT_D_ROWS": 1} if name == "dgrad" and tuple(cls.stride) != (1, 1) else {}
    if cluster == 2:
        extra["LIGHT_CLUSTER"] = 2
    tile_m = tile_m_for(name, cls)
    if tile_m != TILE_M:
        extra["LIGHT_TILE_M"] = tile_m
    return LIGHT_GEMM.bind(shapes.dtype_name(cls.dtype), LIGHT_T=IN_TYPES[cls.dtype],
                           LIGHT_OUT=int(fp32_out or (wgrad and not direct)), LIGHT_TILE_N=tile_n_for(cls),
                           LIGHT_FUSED=int(name == "fprop" and not fp32_out), LIGHT_A_KMAJOR=int(not wgrad),
                           LIGHT_B_KMAJOR=int(name == "fprop"), LIGHT_PINGPONG=0, LIGHT_CONV=OPERATORS[name], **extra)


# ---- Params -------------------------------------------------------------------------------------------------------
class ConvProblem(NamedTuple):
    """One call's problem as conv2d_run passes it (CUTLASS's argument order), with the kernel's operator."""
    conv: int                  # 1 fprop, 2 dgrad, 3 wgrad
    n: int
    h: int
    w: int
    c: int
    k: int
    r: int
    s: int
    pad_h: int
    pad_h_hi: int
    pad_w: int
    pad_w_hi: int
    stride_h: int
    stride_w: int
    dil_h: int
    dil_w: int
    sm_count: int
    splits: int = 1            # wgrad's slices of GEMM-K (N*P*Q)


def _out_size(size: int, pad: int, pad_hi: int, taps: int, stride: int, dilation: int) -> int:
    return (size + pad + pad_hi - dilation * (taps - 1) - 1) // stride + 1


# ---- a strided dgrad's phases -------------------------------------------------------------------------------------
def dgrad_phases(p: "ConvProblem") -> list[tuple[shapes.Phase1D, shapes.Phase1D]]:
    """A strided dgrad's phases (rows, columns), those with the most taps first: the CTAs walk them in this order,
    so the last wave is of the cheapest tiles."""
    out_h = _out_size(p.h, p.pad_h, p.pad_h_hi, p.r, p.stride_h, p.dil_h)
    out_w = _out_size(p.w, p.pad_w, p.pad_w_hi, p.s, p.stride_w, p.dil_w)
    rows = shapes.dgrad_residues(p.h, out_h, p.r, p.stride_h, p.pad_h, p.dil_h)
    cols = shapes.dgrad_residues(p.w, out_w, p.s, p.stride_w, p.pad_w, p.dil_w)
    return sorted(((r, c) for r in rows for c in cols), key=lambda rc: -len(rc[0].taps) * len(rc[1].taps))


# A launch's zero phases (residues no tap reaches) are stored by two hands: the producer warpgroup's three idle warps
# store their first pixels while the consumers run the GEMM tiles, the consumers the rest after their tiles.  Rates
# per SM behind the split, from ResNet-50's 1x1 stride-2 dgrads on the H200 (`bench_conv2d.py --operators dgrad`;
# rough): the idle warps about 0.8 TB/s over 132 SMs (L7's 38.5 MB of zeros took 54.2 us all theirs), the consumers'
# stores from registers about 1.5 TB/s (26 us of L7's 38.2 after its GEMM tiles), the GEMM tiles about 500 TFLOP/s.
# Split by these, L7 ran 35.6 us (37.6 all the consumers', CUTLASS's phase kernels 35.1).
IDLE_ZERO_BYTES_PER_SM = 0.8e12 / 132
CONSUMER_ZERO_BYTES_PER_SM = 1.5e12 / 132
GEMM_FLOPS_PER_SM = 500e12 / 132


def idle_zero_pixels(p: "ConvProblem", phases: list) -> list[int]:
    """How many of each phase's first pixels the idle warps zero (0 for a phase with taps): as many as keeps both
    hands busy to the same end.  With the GEMM tiles taking T_g and Z bytes of zeros, the idle warps store at r_i
    all along and the consumers at r_c after T_g, so both finish at T = (Z + r_c T_g) / (r_i + r_c), or at T_g
    when the idle warps alone finish sooner; the idle warps take r_i T of the bytes."""
    bytes_per_pixel = 2 * p.c
    zero_pixels = [p.n * rows.count * cols.count if not (rows.taps and cols.taps) else 0 for rows, cols in phases]
    flops = sum(2 * p.n * rows.count * cols.count * p.c * len(rows.taps) * len(cols.taps) * p.k
                for rows, cols in phases)
    zero_bytes = sum(zero_pixels) * bytes_per_pixel
    if not zero_bytes:
        return zero_pixels
    r_i, r_c = IDLE_ZERO_BYTES_PER_SM * p.sm_count, CONSUMER_ZERO_BYTES_PER_SM * p.sm_count
    t_gemm = flops / (GEMM_FLOPS_PER_SM * p.sm_count)
    t_end = max(t_gemm, (zero_bytes + r_c * t_gemm) / (r_i + r_c))
    left = min(sum(zero_pixels), int(r_i * t_end / bytes_per_pixel))
    idle = []
    for pixels in zero_pixels:
        idle.append(min(pixels, left))
        left -= idle[-1]
    return idle


def phase_problem(p: "ConvProblem", rows: shapes.Phase1D, cols: shapes.Phase1D) -> "ConvProblem":
    """The unit-stride dgrad of one phase: its pixels as dx, its taps as the filter."""
    return p._replace(h=rows.count, w=cols.count, r=max(1, len(rows.taps)), s=max(1, len(cols.taps)),
                      pad_h=rows.lower, pad_h_hi=rows.upper, pad_w=cols.lower, pad_w_hi=cols.upper, stride_h=1,
                      stride_w=1, dil_h=rows.dilation, dil_w=cols.dilation)


def geometry(p: ConvProblem) -> dict:
    """The implicit GEMM of a problem: its A tensor (x for fprop, dy for dgrad) and the descriptors' corners.

    fprop: rows are y's pixels (N, P, Q); pixel (p, q) at tap (r, s) reads x at (p * stride - pad + r * dil, ...),
    so the box starts at -pad and is stride apart; its upper corner is pad_hi - dil * (S - 1).
    dgrad (unit stride): rows are dx's pixels (N, H, W); dx(h) = sum over taps r of dy(h + pad - r * dil) . w(r), so
    with r' = R - 1 - r the read is at h + (pad - dil * (R - 1)) + r' * dil: the box starts there, a pixel apart,
    and takes the filter's taps in reverse (the kernel flips them)."""
    if p.conv in (1, 3):  # wgrad walks the same grid: dy's pixels, read at each tap
        out_h = _out_size(p.h, p.pad_h, p.pad_h_hi, p.r, p.stride_h, p.dil_h)
        out_w = _out_size(p.w, p.pad_w, p.pad_w_hi, p.s, p.stride_w, p.dil_w)
        lower = (-p.pad_w, -p.pad_h)
        upper = (p.pad_w_hi - p.dil_w * (p.s - 1), p.pad_h_hi - p.dil_h * (p.r - 1))
        return dict(a_dims=(p.c, p.w, p.h, p.n), a_channels=p.c, out_channels=p.k, out_h=out_h, out_w=out_w,
                    lower=lower, upper=upper, strides=(p.stride_w, p.stride_h))
    dy_h = _out_size(p.h, p.pad_h, p.pad_h_hi, p.r, 1, p.dil_h)
    dy_w = _out_size(p.w, p.pad_w, p.pad_w_hi, p.s, 1, p.dil_w)
    lower = (p.pad_w - p.dil_w * (p.s - 1), p.pad_h - p.dil_h * (p.r - 1))
    upper = (lower[0] + p.w - dy_w, lower[1] + p.h - dy_h)
    return dict(a_dims=(p.k, dy_w, dy_h, p.n), a_channels=p.k, out_channels=p.c, out_h=p.h, out_w=p.w,
                lower=lower, upper=upper, strides=(1, 1))


def activation_tma(g: dict, pixels: int = TILE_M) -> Im2colArgs:
    """The NHWC tensor in im2col mode, `pixels` pixels (fprop, dgrad: a tile's 128 rows of A; wgrad: a k-block's
    64 of B) of 64 channels (128 bytes, the swizzle's width) a load."""
    c, w, h, _ = g["a_dims"]
    return Im2colArgs(TMA_UINT16, g["a_dims"], (c * 2, w * c * 2, h * w * c * 2), g["lower"], g["upper"], TILE_K,
                      pixels, (1, *g["strides"], 1), SWIZZLE_128B)


def filter_tma(p: ConvProblem, tile_n: int) -> TmaArgs:
    """B: the KRSC filter by tap.  fprop (K-major): dims (C, R*S, K), a box of 64 channels of one tap for tile_n
    filters.  dgrad (MN-major): dims (C, K, R*S), boxes of 64 channels (dx's) by 64 filters (GEMM-K) of one tap."""
    taps = p.r * p.s
    if p.conv == 1:
        return TmaArgs(TMA_UINT16, (p.c, taps, p.k), (p.c * 2, taps * p.c * 2), (TILE_K, 1, tile_n), SWIZZLE_128B)
    return TmaArgs(TMA_UINT16, (p.c, p.k, taps), (taps * p.c * 2, p.c * 2), (64, TILE_K, 1), SWIZZLE_128B)


def wgrad_output_tma(p: ConvProblem, store_cols: int) -> TmaArgs:
    """wgrad's D: dw (16-bit, one split) or the fp32 slices, [split][K][R*S][C] as dims (C, R*S, K, splits), a store
    of one tap's store_cols channels by 64 filters (the padding of the kernel's columns falls past C, clipped)."""
    size = 128 // store_cols  # a store is one 128-byte swizzle row wide
    taps = p.r * p.s
    return TmaArgs(TMA_FLOAT32 if size == 4 else TMA_UINT16, (p.c, taps, p.k, p.splits),
                   (p.c * size, taps * p.c * size, p.k * taps * p.c * size), (store_cols, 1, STORE_ROWS, 1),
                   SWIZZLE_128B)


def pack_params(info: Any, p: ConvProblem, addresses: tuple[int, int, int, int], encode, clusters: int = 0
                ) -> tuple[bytearray, tuple[int, int, int]]:
    """Params bytes of one conv problem and its grid; `encode(buffer, offset, args, address)` writes a descriptor
    (a strided dgrad's kernel, info.d_rows: pack_phases); `clusters`: light_gemm.grid's."""
    g = geometry(p)
    a, b, d, bias = addresses
    pixels = p.n * g["out_h"] * g["out_w"]
    c_blocks = -(-g["a_channels"] // TILE_K)
    taps = p.r * p.s
    splits, split_blocks = 1, taps * c_blocks
    if p.conv == 3:  # M: the filters, N: (tap, padded channel), GEMM-K: pixels in `splits` equal runs
        splits = p.splits
        split_blocks = -(-(-(-pixels // TILE_K)) // splits)  # ceil(ceil(pixels / 64) / splits)
        gemm = Problem(p.k, taps * c_blocks * TILE_K, split_blocks * TILE_K, 0, 0, 0, 0, p.sm_count)
    else:
        gemm = Problem(pixels, g["out_channels"], split_blocks * TILE_K, 0, 0, 0, 0, p.sm_count)
    params = bytearray(info.params_size)
    _FIELDS.pack_into(params, FIELDS, bias, gemm.m, gemm.n, gemm.k, 0, min(GROUP_ROWS, -(-gemm.m // info.tile_m)))
    _CONV_FIELDS.pack_into(params, CONV_FIELDS, c_blocks, taps, p.s, g["out_w"], g["out_h"] * g["out_w"],
                           *g["lower"], *g["strides"], p.dil_w, p.dil_h, splits, split_blocks, 0, 0, 0)
    buffer = (ctypes.c_char * len(params)).from_buffer(params)
    if p.conv == 3:
        encode(buffer, 0, TmaArgs(TMA_UINT16, (p.k, pixels), (p.k * 2,), (64, TILE_K), SWIZZLE_128B), a)  # dy
        encode(buffer, info.tma_b, activation_tma(g, pixels=TILE_K), b)  # x, 64 pixels a box
        encode(buffer, info.tma_d, wgrad_output_tma(p, info.store_cols), d)
        return params, grid(gemm, info.tile_n, info.cluster, splits, clusters, info.tile_m)
    encode(buffer, 0, activation_tma(g, pixels=TILE_M // info.cluster), a)  # a cluster's CTAs load half each
    encode(buffer, info.tma_b, filter_tma(p, info.tile_n), b)
    encode(buffer, info.tma_d, output_tma(gemm.m, gemm.n, gemm.n, info.store_cols), d)
    return params, grid(gemm, info.tile_n, info.cluster, clusters=clusters)


def pack_phases(info: Any, p: ConvProblem, addresses: tuple[int, int, int, int], encode,
                d_strides: tuple[int, int, int], phases: list) -> tuple[bytearray, tuple[int, int, int]]:
    """Params bytes and grid of one launch of a strided dgrad's kernel (LIGHT_D_ROWS) over `phases` (at most
    MAX_PHASES of dgrad_phases): dx's NHWC strides d_strides become the phases' pixel strides, B is the whole filter
    (each phase reads its taps there), each phase gets its Phase entry; of the GEMM's fields the kernel reads n (dx's
    channels), group_m and the bias field (dx's address)."""
    a, b, d, bias = addresses  # bias: dx's address again (conv2d_run._call), which the patching rewrites
    d_sn, d_sh, d_sw = d_strides
    params = bytearray(info.params_size)
    buffer = (ctypes.c_char * len(params)).from_buffer(params)
    pixels = p.n * p.h * p.w
    _FIELDS.pack_into(params, FIELDS, bias, pixels, p.c, 0, 0, min(GROUP_ROWS, -(-pixels // TILE_M)))
    _CONV_FIELDS.pack_into(params, CONV_FIELDS, -(-p.k // TILE_K), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, d_sn,
                           p.stride_h * d_sh, p.stride_w * d_sw)
    struct.pack_into("<i", params, PHASES_FIELD, len(phases))
    tiles_n = -(-p.c // info.tile_n)
    units = 0
    idle = idle_zero_pixels(p, phases)
    for i, (rows, cols) in enumerate(phases):
        sub = phase_problem(p, rows, cols)
        g = geometry(sub)
        if not all(-CORNER_LIMIT <= v < CORNER_LIMIT for v in (*g["lower"], *g["upper"])):
            raise ValueError(f"jitops.conv2d_input_grad (light sm_90a kernel): phase {rows.start, cols.start}'s "
                             f"bounding box {g['lower']}..{g['upper']} is beyond TMA's im2col corners")
        at = PHASE_ENTRIES + i * PHASE_BYTES
        encode(buffer, at, activation_tma(g), a)
        step_h = rows.taps[1] - rows.taps[0] if len(rows.taps) > 1 else 0
        step_w = cols.taps[1] - cols.taps[0] if len(cols.taps) > 1 else 0
        last = rows.taps[-1] * p.s + cols.taps[-1] if rows.taps and cols.taps else 0
        phase_pixels = p.n * rows.count * cols.count
        _PHASE_FIELDS.pack_into(params, at + 128, phase_pixels, cols.count, rows.count * cols.count, *g["lower"],
                                len(rows.taps) * len(cols.taps), len(cols.taps), sub.dil_w, sub.dil_h, last,
                                step_h * p.s, step_w, rows.start * d_sh + cols.start * d_sw, idle[i])
        units += -(-(phase_pixels - idle[i]) // TILE_M) * tiles_n
    encode(buffer, info.tma_b, filter_tma(p, info.tile_n), b)
    # D: the whole of dx; the kernel stores by rows and never reads it, but the patching keeps it a valid descriptor
    encode(buffer, info.tma_d, output_tma(pixels, p.c, p.c, info.store_cols), d)
    # every SM's idle warps take a share of the idle zeros, with or without a tile to run
    return params, (p.sm_count if any(idle) else max(1, min(p.sm_count, units)), 1, 1)


def check_problem(p: ConvProblem, d_strides: tuple[int, int, int], addresses: tuple[int, int, int, int],
                  d_rows: bool = False) -> None:
    """What the kernel assumes and the class's plan already guarantees (conv2d_run pads channels to multiples of 8
    and passes NHWC memory): checked once per packed problem."""
    name = ("conv2d", "conv2d_input_grad", "conv2d_weight_grad")[p.conv - 1]
    if p.c % 8 or p.k % 8 or any(address % 16 for address in addresses[:3]):
        raise ValueError(f"jitops.{name} (light sm_90a kernel): channels {p.c} and {p.k} must be multiples of 8 and "
                         "the tensors 16-byte aligned; this class should have taken CUTLASS's kernel")
    if p.conv == 2:
        if (p.stride_h, p.stride_w) != (1, 1) and not d_rows:
            raise ValueError(f"jitops.{name} (light sm_90a kernel): stride {(p.stride_h, p.stride_w)}; a strided "
                             "dgrad takes the kernel built with LIGHT_D_ROWS (its phases)")
        if d_rows and (any(stride % 8 for stride in d_strides) or addresses[2] % 16 or not all(d_strides)):
            raise ValueError(f"jitops.{name} (light sm_90a kernel): dx strides {d_strides} must be positive multiples "
                             "of 8 elements and dx 16-byte aligned")
        if not d_rows and any(d_strides) and d_strides != (p.h * p.w * p.c, p.w * p.c, p.c):
            raise ValueError(f"jitops.{name} (light sm_90a kernel): dx strides {d_strides} are not its NHWC memory")


# ---- the host object ----------------------------------------------------------------------------------------------
# A LightConv problem's key: ConvProblem's fields, then dx's strides (d_sn, d_sh, d_sw); a strided dgrad's launch
# adds the index of its first phase.
_STRIDES_AT = len(ConvProblem._fields)
_PHASE_AT = _STRIDES_AT + 3


def _problem(key: tuple) -> ConvProblem:
    return ConvProblem(*key[:_STRIDES_AT])


class LightConv(LightKernel):
    """A light conv kernel with its host side: `launch(...)` takes CUTLASS's library arguments; the light kernels'
    packing and patching, with a conv problem's checks and Params."""

    def __init__(self, function: CudaFunction, info: Any = None, driver: Any = None) -> None:
        super().__init__(function, info, driver)
        self._address_field: Any = ...  # probed on the first problem
        self._phases: dict[tuple, list] = {}  # a strided dgrad's (LIGHT_D_ROWS) by problem

    def descriptor_address_field(self) -> int | None:
        """The tiled descriptors' address field if an im2col descriptor keeps its address there too, else None:
        then every patch goes through cuTensorMapReplaceAddress."""
        if self._address_field is ...:
            tiled = self._driver.address_field
            probe = Im2colArgs(TMA_UINT16, (64, 8, 8, 1), (128, 1024, 8192), (0, 0), (0, 0), TILE_K, TILE_M,
                               (1, 1, 1, 1), SWIZZLE_128B)
            self._address_field = tiled if self._driver._find_address_field(probe) == tiled else None
        return self._address_field

    def launch(self, a: Any, b: Any, d: Any, bias: Any, n: int, h: int, w: int, c: int, k: int, r: int, s: int,
               pad_h: int, pad_h_hi: int, pad_w: int, pad_w_hi: int, stride_h: int, stride_w: int, dil_h: int,
               dil_w: int, d_sn: int, d_sh: int, d_sw: int, splits: int, device: int, sm_count: int,
               stream: int) -> Any:
        """One call with the CUTLASS library's arguments (tensors a, b, d, bias; a kernel that stores D by rows,
        info.d_rows, takes D's address in the bias field: conv2d_run._call passes d there); returns the packed
        problems it launched (a strided dgrad of more than MAX_PHASES phases takes several launches)."""
        if splits != 1 and (self.info.conv != 3 or self.info.store_cols != 32):
            raise ValueError(f"jitops.conv2d (light sm_90a kernel): {splits} split-K slices; the light fprop, "
                             "dgrad and direct wgrad take one")
        key = (self.info.conv, n, h, w, c, k, r, s, pad_h, pad_h_hi, pad_w, pad_w_hi, stride_h, stride_w, dil_h,
               dil_w, sm_count, splits, d_sn, d_sh, d_sw)
        addresses = tuple(0 if t is None else t.data_ptr() for t in (a, b, d, bias))
        if not self.info.d_rows:
            return [self._launch(key, addresses, stream)]
        # A strided dgrad: its phases, MAX_PHASES a launch (one launch up to stride 2 x 2).
        count = len(self._phases_of(key))
        return [self._launch(key + (first,), addresses, stream) for first in range(0, count, MAX_PHASES)]

    def _phases_of(self, key: tuple) -> list:
        """A strided dgrad's phases (dgrad_phases) by its problem's key, worked out once."""
        phases = self._phases.get(key)
        if phases is None:
            if len(self._phases) >= 1024:  # as the packed problems: bounded for a process sweeping sizes
                self._phases.clear()
            phases = self._phases[key] = dgrad_phases(_problem(key))
        return phases

    def _check(self, key: tuple, addresses: tuple[int, int, int, int]) -> None:
        check_problem(_problem(key), key[_STRIDES_AT:_PHASE_AT], addresses, bool(self.info.d_rows))

    def _pack(self, key: tuple, addresses: tuple[int, int, int, int]) -> tuple[bytearray, tuple[int, int, int]]:
        if not self.info.d_rows:
            return pack_params(self.info, _problem(key), addresses, self._driver.encode_into, self.clusters)
        return pack_phases(self.info, _problem(key), addresses, self._driver.encode_into,
                           key[_STRIDES_AT:_PHASE_AT], self._launch_phases(key))

    def a_descriptors(self, key: tuple) -> tuple[int, ...]:
        if not self.info.d_rows:
            return super().a_descriptors(key)
        return tuple(PHASE_ENTRIES + i * PHASE_BYTES for i in range(len(self._launch_phases(key))))

    def _launch_phases(self, key: tuple) -> list:
        """The phases of a strided dgrad's launch: MAX_PHASES of them from its first."""
        first = key[_PHASE_AT]
        return self._phases_of(key[:_PHASE_AT])[first:first + MAX_PHASES]


def host(kernel: Any) -> LightConv:
    """The host side of a loaded light conv kernel, made once and kept on it.  A Recording's wrapper of the kernel
    (jitops/native.py) is looked through; conv2d_run hands the wrapper the launch to keep."""
    function = getattr(kernel, "_function", kernel)
    found = function.__dict__.get("light_conv_host")
    if found is None:
        found = function.__dict__.setdefault("light_conv_host", LightConv(function))
    return found


__all__ = ["ConvProblem", "LightConv", "OPERATORS", "activation_tma", "cluster_for", "dgrad_phases", "filter_tma",
           "geometry", "host", "pack_params", "pack_phases", "phase_problem", "request", "tile_m_for", "tile_n_for",
           "unsupported"]
