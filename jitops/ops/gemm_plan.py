"""jitops.gemm's plan: the shape class's fields and layout rules, which implementation runs a CUDA call
(cuda_route), the size buckets and the wave model that picks them, and each bucket's tile configuration.  Pure:
sizes, strides and the config in, decisions out; no launches, no kernels."""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch

from .. import shapes
from ..config import config

CUDA_DTYPES = (torch.bfloat16, torch.float16)  # jitops' own CUDA kernels
CUDA_ACCEPTED = (torch.float32, torch.bfloat16, torch.float16)  # float32 through cuBLAS (cuda_route)
CPU_DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)
ACTIVATIONS = {None: 0, "relu": 1, "gelu": 2, "gelu_tanh": 3}
# The approximation jitops.gelu applies for each GELU activation (the training path runs the GEMM with the
# bias fused, then jitops.gelu, which keeps the pre-activation its backward needs).
GELU_APPROXIMATE = {"gelu": "none", "gelu_tanh": "tanh"}
INT32_MAX = 2**31 - 1


class GemmClass(NamedTuple):
    dtype: torch.dtype
    out_dtype: torch.dtype
    a_kmajor: bool    # a is row-major (K contiguous); else column-major
    b_kmajor: bool    # b is column-major (K contiguous); else row-major
    align: int        # elements every row start, leading dimension and contiguous extent is a multiple of
    bucket: str       # picks the tile configuration (SM90_CONFIGS' keys); empty and cpu: none
    fused: bool       # bias and/or activation in the epilogue
    family: str       # config.gemm_family ("auto": by the device's arch, "sm80"); "aten" and "cpu": ATen's


_family_memo = (-1, "auto")  # (config.generation, config.gemm_family): class_from_layouts reads it inline


def family() -> str:
    """config.gemm_family, read once per config.generation: a knob read costs 0.24-0.4 us on the dev box, and
    every CUDA call's shape class asks."""
    global _family_memo
    generation, value = _family_memo
    if generation != config.generation:
        generation = config.generation  # before the value: a scope that starts between the reads costs a re-read
        value = config.gemm_family
        _family_memo = (generation, value)
    return value


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


# The wave model that picks a tile for the shapes no special bucket claims.  A persistent kernel runs its tiles in
# waves of one tile an SM; a problem costs about (waves) x (one tile's time), one tile's time being its area over its
# relative speed.  Speeds fitted to `bench_gemm.py --sweep-survey` (H100; docs/benchmarks.md, gemm):
# per output element of a wave, on the seven shapes of 512 rows or more with K >= 4096, a 128x128 tile took 1.02-1.16x
# (median 1.07) the time of a 128x256 and a 128x64 1.43-1.75x (median 1.57), leaving out one 128x256 point far off its
# other runs: speeds 0.93 and 0.66 (0.64 picks the same tile for every shape of the survey, the goal and the tests).
# The SM count is the H100 SXM's 132, a constant rather than the device's, so that a cache prewarmed without a GPU
# holds the kernels the device picks (an H100 PCIe, 114 SMs, gets the same choices, slightly off its own optimum).
WAVE_SMS = 132
# A decode step streams b through few tiles, one an SM, each bound by its SM's bandwidth and its K loop, so the
# widest tile that still gives most SMs a tile wins: with 1-64 rows, N = 14336 ran best on 64x128 tiles (112 of
# them; x0.97-1.01 of torch.matmul, 64x64 x0.88-0.94) and N = 8192 on 64x64 (128 tiles; x0.89-0.98, 64x128
# x0.77-0.87); 64x32 tiles won nowhere (`bench_gemm.py --sweep-decode`, H100).
DECODE_WIDE_TILES = 99  # 3/4 of WAVE_SMS
# The light kernel's 192-row and 192-column tiles (jitops/light_gemm.py) let a tile count fill whole waves where the
# 64-multiples cannot, as cuBLAS's 192 x 192 and 128 x 192 tiles do: ViT-B/16's 6304 x 768 GEMMs are 132 tiles of
# 192 x 192 (300 of 128 x 128: 2.3 waves), a 3072 x 768 weight gradient 96 of 128 x 192 (72 of 128 x 256).  On the
# 33 GEMMs of `bench_gemm.py --training` (H200, bf16, each tile forced in its own process) their time a wave a
# k-block per output element was within 5% of 128 x 256's (medians 0.95-0.98 of it); speed 1.0 leaves a tie to
# the older tile.  Listed last, so that a tie between them goes to the first.
WAVE_TILES = {"large": (128, 256, 1.0), "medium": (128, 128, 0.93), "small": (128, 64, 0.66),
              "wave_192x192": (192, 192, 1.0), "wave_128x192": (128, 192, 1.0), "wave_192x128": (192, 128, 1.0)}


def _wave_cost(bucket: str, m: int, n: int) -> float:
    tile_m, tile_n, speed = WAVE_TILES[bucket]
    tiles = -(-m // tile_m) * -(-n // tile_n)
    return -(-tiles // WAVE_SMS) * tile_m * tile_n / speed


def _bucket(m: int, n: int, k: int) -> str:
    """Which tile configuration (measured on the H100: docs/benchmarks.md, gemm).  Shapes repeat, so the
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

# One (M, N, K) per bucket that _choose_bucket sends there (tests/test_gemm.py checks it), so that
# `cache_tools prewarm --all-builtin` can cover every configuration the rules above can pick.
BUCKET_EXAMPLES = {"decode": (16, 14336, 4096), "decode_narrow": (16, 4096, 4096), "skinny": (256, 4096, 4096),
                   "large_short_k": (8192, 4096, 1024), "large": (8192, 4096, 4096), "medium": (512, 4096, 4096),
                   "small": (1024, 1024, 1024), "wave_192x192": (6304, 768, 3072), "wave_128x192": (3072, 768, 6304),
                   "wave_192x128": (3072, 1024, 4096)}


# ---- which implementation runs a CUDA call --------------------------------------------------------------------
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


def allow_tf32() -> bool:
    """torch.backends.cuda.matmul.allow_tf32, read the way that costs 0.2 us (the attribute costs 1.5 us on the
    dev box): "high" and "medium" are the precisions that set it.  Once a program has set the flag through both
    of torch's APIs (set_float32_matmul_precision, then the attribute), torch refuses the generic query: the CUDA
    matmul's own flag then decides."""
    try:
        return torch.get_float32_matmul_precision() != "highest"
    except RuntimeError:
        return bool(torch.backends.cuda.matmul.allow_tf32)


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
    memo = _family_memo  # family() without its call on the common path (the shape class runs on every call)
    return GemmClass(dtype, out, a_kmajor, b_kmajor, align, _bucket(m, n, k), fused,
                     memo[1] if memo[0] == config.generation else family())


# ---- tile configurations --------------------------------------------------------------------------------------
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


# Size bucket -> configuration.  Measured on the H100: docs/benchmarks.md.
# bf16 on the H100, `bench_gemm.py --tune` (TFLOP/s; torch.matmul 630-695 in the same run):
#   4096^3: 128x256 cooperative 2x1, swizzle 8: 693 (swizzle 1: 662; 256x128 1x2: 680; 128x128 ping-pong: 635);
#   4000^3: 128x256 swizzle 8: 648 (swizzle 1: 613); 8192x8192x1024: 128x128 ping-pong 2x1: 651, 128x256: 602;
#   128x8192x8192: 128x64 cooperative 1x2 (A multicast): 332, 128x64 1x1: 329, 128x128 stream-K: 282.
# 16384x2048x4096 (8 tile columns) did better with swizzle 1 (607) than 8 (598): _swizzle.
# `bench_gemm.py --sweep-survey` (same device and day; time against torch.matmul's): with 1 to 32 rows and
# N = 14336 the 64x128 ping-pong tile ran at 0.97-1.04x (the 128x64 cooperative 0.47-0.79x); squares of 256-1024
# ran best on 128x64 tiles (0.70-0.78x; 128x128 stream-K, the small bucket before: 0.44-0.58x); 512- to 2048-row
# layers on 128x128 or 128x256 tiles by the wave model (0.94-1.09x; stream-K 0.75-0.87x).  Split-K and stream-K
# lost nearly everywhere to their fix-up (the partial tiles' reduction); the stream-K build stays for sweeps.
# Skinny: `--sweep-skinny` ran its 128x64 tile without a cluster at x0.90-0.97 of torch.matmul on 128-256 rows
# against 4096-14336 columns, with the 1x2 cluster (A multicast) at x0.73-0.98 (x0.73 at 128x4096x4096); on the
# goal's 128x8192x8192 both x0.97.  The small bucket keeps its 1x2 cluster: the survey measured it better there.
SM90_CONFIGS = {
    "large": Sm90Config((128, 256, 64), (2, 1), pingpong=False, streamk=False, swizzle=8),
    "large_short_k": Sm90Config((128, 128, 64), (2, 1), pingpong=True, streamk=False),
    "medium": Sm90Config((128, 128, 64), (2, 1), pingpong=False, streamk=False),
    "small": Sm90Config((128, 64, 64), (1, 2), pingpong=False, streamk=False),
    "skinny": Sm90Config((128, 64, 64), (1, 1), pingpong=False, streamk=False),
    "decode": Sm90Config((64, 128, 64), (1, 1), pingpong=True, streamk=False),
    "decode_narrow": Sm90Config((64, 64, 64), (1, 1), pingpong=True, streamk=False),
}
# The wave buckets' tiles are the light kernel's; CUTLASS's kernel (JITOPS_GEMM_SM90_KERNEL=cutlass) runs their
# shapes on the medium bucket's 128 x 128 tiles.
SM90_CONFIGS.update({bucket: SM90_CONFIGS["medium"] for bucket in ("wave_192x192", "wave_128x192", "wave_192x128")})
# CUTLASS 2 (sm_80 family): two configurations; the buckets below large share the 128x128 one.
SM80_LARGE = Sm80Config((128, 256, 32), (64, 64, 32), 3)
SM80_SMALL = Sm80Config((128, 128, 32), (64, 64, 32), 4)
SM80_CONFIGS = {bucket: SM80_LARGE if bucket.startswith("large") else SM80_SMALL for bucket in SM90_CONFIGS}
# 2-byte alignment: cp.async copies 4, 8 or 16 bytes, so this class takes CUTLASS's two-stage register-staged
# mainloop, with smaller warp tiles (64x64 spilled at 255 registers).
SM80_ALIGN1 = Sm80Config((128, 128, 32), (64, 32, 32), 2)


def sm80_config(cls: GemmClass) -> Sm80Config:
    return SM80_ALIGN1 if cls.align == 1 else SM80_CONFIGS[cls.bucket]


@functools.lru_cache(maxsize=4096)  # run_sm90 asks on every call; shapes repeat
def _swizzle(config: Sm90Config, m: int, n: int) -> int:
    """The scheduler's tile swizzle: the configuration's, but 1 when there are fewer than 16 tile rows or columns,
    and halved until it divides both counts.  CUTLASS pads the swizzled side's tiles to a multiple of the swizzle
    with empty tiles: 512x14336x4096 (4 tile rows) ran at 194.6 us with swizzle 8 against 96.3 for torch.matmul
    (`bench_gemm.py --survey`, H100)."""
    tiles_m, tiles_n = -(-m // config.tile[0]), -(-n // config.tile[1])
    swizzle = config.swizzle if min(tiles_m, tiles_n) >= 16 else 1
    while swizzle > 1 and (tiles_m % swizzle or tiles_n % swizzle):
        swizzle //= 2
    return swizzle

