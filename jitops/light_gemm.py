"""The host side of jitops.gemm's light sm_90a kernel (kernels/gemm/sm90_light_gemm.cu), the default
(JITOPS_GEMM_SM90_KERNEL=cutlass takes CUTLASS's kernel instead: jitops/cutlass_host.py).

Why: CUTLASS's GemmUniversal takes about 49 s to compile through NVRTC on a 2-core machine, 41 s of it in the C++
front end instantiating templates.  The light kernel is the same design (TMA into an mbarrier ring, wgmma from
shared memory, a producer warpgroup and two consumers, persistent tiles) written against PTX with no includes:
about 1 s unfused, 2 s with the fused epilogue, on the same machine (docs/benchmarks.md, "Cold compiles per
kernel family"), and as fast as CUTLASS's kernel on bench_gemm's shapes (docs/benchmarks.md, gemm).

It covers every layout of A and B (K-major or MN-major each: x @ w.t(), x @ w and a training step's backward
GEMMs), 16-byte aligned (N and the leading dimensions multiples of 8), bf16 or fp16 in, the inputs' type or fp32
out, with the fused bias and activation.  `unsupported()` says why a class is not covered; jitops.gemm then
builds CUTLASS's kernel.

The kernel takes one 448-byte parameter (its `Params`): the TMA descriptors of A, B and D, from the driver's
cuTensorMapEncodeTiled, then the bias pointer and five ints.  The kernel exports the launch facts (shared
memory, threads, tile, stages, Params size) as the `__constant__` array jitops_light_gemm_info, read here from
the cubin without a GPU; tests/test_light_gemm.py checks them against `expected_info`.
"""
from __future__ import annotations

import ctypes
import struct
import threading
from typing import Any, NamedTuple

import torch

from . import shapes
from .cutlass_host import (MAX_SM_PER_GPC, SWIZZLE_128B, TMA_FLOAT32, TMA_UINT16, Im2colArgs, PackedParams, TmaArgs,
                           _TmaDriver, cubin_u64_table, patch_descriptor)
from .launch import _CUDA_ERROR_INVALID_CONTEXT, CudaFunction, _bind_context, _Driver
from .specs import BuildRequest, CudaKernel, Source

LIGHT_GEMM = CudaKernel(
    "gemm_sm90_light", Source.file("gemm/sm90_light_gemm.cu"), "jitops_light::jitops_sm90_light_gemm", (),
    arch_specific=True, defines=True)

TILE_M, TILE_K = 128, 64       # decode GEMMs' and some wgrads' tiles are 64 rows (tile_m_for): LightInfo.tile_m
MAX_SMEM = 232448             # H100: 227 KB of dynamic shared memory per block
MAX_STAGES = 8
GROUP_ROWS = 8                # tile rows per raster group (L2 reuse of B's tiles)
OUT_TYPES = {torch.bfloat16: 0, torch.float16: 0, torch.float32: 1}
IN_TYPES = {torch.bfloat16: 0, torch.float16: 1}

# Params (kernels/gemm/sm90_light_gemm.cu): descriptors of A, B and D, then bias, m, n, k, activation, group_m,
# and the split tail's split_from, splits, slices and counters.  The kernel's static_asserts hold it to these
# offsets.
PARAMS_SIZE = 448
CONV_PARAMS_SIZE = 512        # a conv kernel's: sixteen ints more (jitops/light_conv.py)
PHASES_PARAMS_SIZE = 1280     # a strided dgrad's: then four phases of 192 bytes (light_conv.MAX_PHASES)
TMA_A, TMA_B, TMA_D, FIELDS = 0, 128, 256, 384
_FIELDS = struct.Struct("<Qiiiii")
SPLIT_FIELDS = 412            # split_from, splits, then (8-byte aligned) the slices' and the counters' addresses
WORKSPACE_FIELD, COUNTERS_FIELD = 424, 432
_SPLIT = struct.Struct("<ii4xQQ")
STORE_ROWS = 64               # the epilogue's TMA store box: a consumer warpgroup's rows by 128 bytes of D
STORE_BYTES = STORE_ROWS * 128

INFO_FIELDS = ("smem", "threads", "tile_m", "tile_n", "tile_k", "stages", "params_size", "tma_b", "tma_d",
               "store_cols", "a_kmajor", "b_kmajor", "pingpong", "conv", "d_rows", "grouped", "cluster")


class LightInfo(NamedTuple):
    smem: int
    threads: int
    tile_m: int
    tile_n: int
    tile_k: int
    stages: int
    params_size: int
    tma_b: int
    tma_d: int
    store_cols: int
    a_kmajor: int
    b_kmajor: int
    pingpong: int
    conv: int  # 0 the GEMM, 1 conv2d's fprop, 2 its dgrad, 3 its wgrad (jitops/light_conv.py)
    d_rows: int  # 1: D stored by rows at run-time strides (a strided dgrad's phase)
    grouped: int  # 0 one GEMM; 1, 2, 3 grouped_gemm's ragged M, ragged K and list forms (jitops/light_grouped.py)
    cluster: int  # 1; 2: clusters of two CTAs along N, each loading half of A's tile for both

    @staticmethod
    def from_cubin(cubin: bytes) -> "LightInfo":
        return LightInfo(*cubin_u64_table(cubin, "jitops_light_gemm_info", INFO_FIELDS,
                                          "kernels/gemm/sm90_light_gemm.cu"))


def expected_info(tile_n: int, a_kmajor: bool = True, b_kmajor: bool = True, out_bytes: int = 2,
                  pingpong: bool = False, conv: int = 0, d_rows: bool = False, grouped: int = 0,
                  cluster: int = 1, tile_m: int = TILE_M) -> LightInfo:
    """What the kernel computes for a tile: a consumer warpgroup per 64 rows (two for pingpong) and the producer's,
    the consumers' epilogue staging buffers, as many tile_m x 64 + tile_n x 64 stages as fit beside them (at most
    8), 1 KB of slack to align the ring to the 128-byte swizzle's 1024-byte period, plus two mbarriers a stage and
    the pingpong consumers' two, and the split tail's flag words (32 bytes).  Two staging buffers a consumer, or one
    where the second would cost the ring its fourth stage (192 x 192)."""
    consumers = 2 if pingpong else tile_m // 64
    stage = (tile_m + tile_n) * TILE_K * 2
    buffers = 1 if (MAX_SMEM - 2048 - consumers * 2 * STORE_BYTES) // stage < 4 <= (
        MAX_SMEM - 2048 - consumers * STORE_BYTES) // stage else 2  # a 192 x 192 tile's fourth stage
    epilogue = consumers * buffers * STORE_BYTES
    stages = min((MAX_SMEM - 2048 - epilogue) // stage, MAX_STAGES)
    params_size = PHASES_PARAMS_SIZE if d_rows else CONV_PARAMS_SIZE if conv else PARAMS_SIZE
    return LightInfo(1024 + stages * stage + epilogue + 16 * stages + 32, 128 * (consumers + 1), tile_m, tile_n,
                     TILE_K, stages, params_size, TMA_B, TMA_D, 128 // out_bytes, int(a_kmajor),
                     int(b_kmajor), int(pingpong), conv, int(d_rows), grouped, cluster)


# ---- which classes, which tile --------------------------------------------------------------------------------
# Each bucket's tile (rows, columns); a bucket not listed (a class the kernel does not take) reads 128 x 128.
#   128 x 256 where CUTLASS's kernel uses it; 128 x 64 for the small bucket, as CUTLASS's kernel (twice the tiles
#     where there are too few for the SMs; a training step's weight gradients, long K: H200, bf16, 1024x1024x4096
#     16.3 us against 22.6 on 128 x 128, 768x768x6304 22.3 against 32.3, torch.mm 13.7 and 15.2); 128 x 128 for the
#     medium bucket (its 6304-row ViT-B/16 GEMMs lost on 128 x 64: qkv's dgrad 49.0 us against 40.5).
#   64 rows for the few-row buckets (at most 256 rows against 4096 or more columns), where a 128-row tile is mostly
#     zeros and there are too few tiles for the SMs.  H200, bf16, kernel time against torch.mm (x: higher is
#     faster), 128 x 128 tiles before:
#       decode (N = 14336, K = 4096; 1-64 rows): 64 x 256 x0.90-0.98, 64 x 128 x0.84-1.02, 128 x 128 x0.38-0.73;
#       decode_narrow (N = 4096 and 8192): 64 x 128 x0.55-0.85, 64 x 64 x0.56-0.77, 128 x 128 x0.41-0.52, before
#         split-K (split_tail, below);
#       skinny (128-256 rows, N and K 4096-14336): 64 x 128 x0.91-1.04, 128 x 64 x0.88-1.08, 128 x 128 x0.64-0.98.
#   The wave buckets' 192-row (three consumer warpgroups) and 192-column tiles (gemm_plan.WAVE_TILES).
TILES = {"large": (128, 256), "large_short_k": (128, 128), "medium": (128, 128), "small": (128, 64),
         "skinny": (64, 128), "decode": (64, 256), "decode_narrow": (64, 128),
         "wave_192x192": (192, 192), "wave_128x192": (128, 192), "wave_192x128": (192, 128)}


def tile_n_for(bucket: str) -> int:
    return TILES.get(bucket, (TILE_M, 128))[1]


def tile_m_for(bucket: str) -> int:
    return TILES.get(bucket, (TILE_M, 128))[0]


def pingpong_for(bucket: str) -> bool:
    """The consumers take whole tiles in turn where CUTLASS's kernel does so with 128-row tiles: many tiles with
    a short K, where an epilogue that stalls both consumers weighs most (8192x8192x1024: x0.86-0.88 of CUTLASS's
    pingpong kernel with both consumers on each tile, x0.98-0.99 taking turns)."""
    return bucket == "large_short_k"


def unsupported(cls: Any) -> str | None:
    """Why the light kernel cannot run a jitops.gemm class (GemmClass), or None when it can."""
    if cls.dtype not in IN_TYPES:
        return f"inputs of {cls.dtype}"
    if cls.out_dtype not in (cls.dtype, torch.float32):
        return f"output of {cls.out_dtype}"
    if cls.align != 8:
        return "rows or leading dimensions not 16-byte aligned"
    if cls.bucket in ("empty", "cpu"):
        return f"bucket {cls.bucket!r}"
    return None


def request(cls: Any) -> BuildRequest:
    tile_m = tile_m_for(cls.bucket)
    extra = {"LIGHT_TILE_M": tile_m} if tile_m != TILE_M else {}
    return LIGHT_GEMM.bind(shapes.dtype_name(cls.dtype), LIGHT_T=IN_TYPES[cls.dtype],
                           LIGHT_OUT=OUT_TYPES[cls.out_dtype], LIGHT_TILE_N=tile_n_for(cls.bucket),
                           LIGHT_FUSED=int(cls.fused), LIGHT_A_KMAJOR=int(cls.a_kmajor),
                           LIGHT_B_KMAJOR=int(cls.b_kmajor), LIGHT_PINGPONG=int(pingpong_for(cls.bucket)), **extra)


# ---- Params -------------------------------------------------------------------------------------------------------
def operand_tma(kmajor: bool, rows: int, k: int, ld: int, box_rows: int) -> TmaArgs:
    """A (M rows) or B (N rows) with leading dimension `ld` (elements, 16-bit), moved as UINT16 as CUTLASS moves
    16-bit operands.  K-major (K contiguous): one box is a stage's tile, 64 elements of K (128 bytes, the
    swizzle's width) by `box_rows` rows.  MN-major (rows contiguous): boxes of 64 rows (128 bytes) by 64 of K,
    box_rows / 64 of them a stage."""
    if kmajor:
        return TmaArgs(TMA_UINT16, (k, rows), (ld * 2,), (TILE_K, box_rows), SWIZZLE_128B)
    return TmaArgs(TMA_UINT16, (rows, k), (ld * 2,), (64, TILE_K), SWIZZLE_128B)


def output_tma(m: int, n: int, ldd: int, store_cols: int) -> TmaArgs:
    """D (M, N, row-major, `ldd` elements apart), stored a box of 64 rows by `store_cols` columns (128 bytes: 64
    16-bit or 32 fp32 elements) with the 128-byte swizzle the epilogue's staging buffers are written in."""
    out_bytes = 128 // store_cols
    return TmaArgs(TMA_UINT16 if out_bytes == 2 else TMA_FLOAT32, (n, m), (ldd * out_bytes,),
                   (store_cols, STORE_ROWS), SWIZZLE_128B)


class Problem(NamedTuple):
    m: int
    n: int
    k: int
    lda: int
    ldb: int
    ldd: int
    activation: int
    sm_count: int
    # B's stored rows where B is shorter than the problem (0: as long): its extent along the dimension `ldb`
    # strides, N for a K-major B, K for an MN-major one.  TMA reads zeros past them, so a Linear whose width is
    # not a multiple of 8 runs its N8-wide problems on the unpadded weight (GPT-2's head: F.pad of the 100 MB
    # weight cost 34 us of host time a call on the H200, twice a training step).
    b_rows: int = 0


# Split-K under one wave: where a GEMM's tiles leave most SMs idle, each tile becomes `splits` units of consecutive
# k-blocks, all of them in one round, summed in the kernel by the split that finishes last
# (kernels/gemm/sm90_light_gemm.cu).  A decode GEMM's 1x4096x4096 is 32 tiles of 64 x 128 for 132 SMs: 17.1 us whole,
# 13.4 split four ways, cuBLAS's split-K 10.1 (H200, device time).
# One round only: a CTA that takes a second unit lost every time it was tried (H200, each count forced):
# 768x768x6304 on 72 tiles of 128 x 64, 21.3 us whole against 29.8 / 27.2 / 34.0 / 50.9 split 2 / 3 / 5 / 8 ways;
# 1x4096x4096 split 8 ways (two rounds) 22.5 against 14.2 for four.  The fix-up is the cost, mostly the last split's
# sum: 1x4096x4096 split 16 ways took 52.4 us, 22.2 without the sum and 12.1 with no fix-up at all, a CTA that sums
# reaching its next unit late, and likelier to sum again (docs/architecture.md, "Split-K").  Even 768x768x6304 with
# no fix-up, split 5 ways, took 21.9 us (L2-bound on 128 x 64 tiles), no better than whole.
# At most SPLIT_MAX ways: the last split reads every slice of its tile (16 ways on 1x4096x4096: 51.4 us when it read
# them one at a time; it now reads two at a time).
# A split streams at least SPLIT_MIN_BLOCKS k-blocks: with 4 (three ways of 12) ViT-B/16's 6304x768x768 tail lost
# to its fix-up, 21.9 against 18.0 us (a slice stored and all read back).
# 64 x 256 tiles never split: decode's 1-16x14336x4096 (56 tiles, split two ways) took 37.8 us against 33.0 whole,
# where 64 x 128 tiles gained (1x4096x14336: 36.7 against 58.0; H200, device time).
SPLIT_MIN_BLOCKS = 16
SPLIT_MAX = 4
SPLIT_MAX_TILE_N = 192
SPLIT_GAIN = 0.85  # split only where the model (split_tail) expects at least 15% off the whole tiles' time


def split_tail(m: int, n: int, k: int, tile_m: int, tile_n: int, pingpong: bool, cluster: int, sm_count: int
               ) -> tuple[int, int]:
    """(split_from, splits) of a plain GEMM: the tiles from split_from on are split `splits` ways; (tiles, 1) for
    none.  Only a GEMM of fewer tiles than half the SMs splits, every tile (split_from 0), and only as many ways as
    keep its units in one round (SPLIT_MAX at most); pingpong and cluster builds never split (their units are whole
    tiles or pairs).  The count minimizes a unit's k-blocks plus each slice's store and read, where that is under
    SPLIT_GAIN of the whole tile's k-blocks (768x768x6304 on 36 tiles of 128 x 128, 99 k-blocks: three ways)."""
    tiles = -(-m // tile_m) * -(-n // tile_n)
    k_blocks = -(-k // TILE_K)
    if pingpong or cluster > 1 or tile_n > SPLIT_MAX_TILE_N or 2 * tiles > sm_count:
        return tiles, 1
    slice_blocks = tile_m * tile_n * 4 / ((tile_m + tile_n) * TILE_K * 2)  # a slice's bytes, in k-blocks' loads
    best, choice = SPLIT_GAIN * k_blocks, (tiles, 1)
    for splits in range(2, min(SPLIT_MAX, sm_count // tiles, k_blocks // SPLIT_MIN_BLOCKS) + 1):
        cost = -(-k_blocks // splits) + (splits + 1) * slice_blocks
        if cost < best:
            best, choice = cost, (0, splits)
    return choice


def workspace_bytes(m: int, n: int, tile_m: int, tile_n: int, split_from: int, splits: int) -> tuple[int, int]:
    """(bytes of the slices, counters) of a split launch: a tile's fp32 accumulators per split, and an int32 counter
    per split tile and consumer warpgroup; (0, 0) without splits."""
    if splits < 2:
        return 0, 0
    tail = -(-m // tile_m) * -(-n // tile_n) - split_from
    return tail * splits * tile_m * tile_n * 4, tail * (tile_m // 64)


def grid(problem: Problem, tile_n: int, cluster: int = 1, splits: int = 1, clusters: int = 0,
         tile_m: int = TILE_M, tail: tuple[int, int] | None = None) -> tuple[int, int, int]:
    """One persistent CTA an SM, never more CTAs than work units (tiles, times a wgrad's splits; a split tail's
    tiles counting their splits, `tail`: split_tail's answer).  Clusters of two:
    a unit is a pair of tiles of one tile row, and `clusters` run at once (the driver's count: 66 on the H200's 132
    SMs; 0, unknown: CUTLASS's rule, a GPC's MAX_SM_PER_GPC SMs in pairs, 63), so that no cluster waits for another
    to finish.  CUTLASS's rule cost a round where the tiles fill 132 SMs: ResNet-50's L8 fprop, 392 tiles, ran 196
    pairs in 4 rounds on 63 clusters against 3 on 66."""
    tiles_m, tiles_n = -(-problem.m // tile_m), -(-problem.n // tile_n)
    if cluster == 1:
        units = tiles_m * tiles_n * splits
        if tail is not None:
            units = tail[0] + (tiles_m * tiles_n - tail[0]) * tail[1]
        return max(1, min(problem.sm_count, units)), 1, 1
    if clusters <= 0:
        clusters = min(problem.sm_count, max(1, problem.sm_count // MAX_SM_PER_GPC) * MAX_SM_PER_GPC) // cluster
    fit = max(1, min(problem.sm_count // cluster, clusters))
    return cluster * max(1, min(fit, tiles_m * -(-tiles_n // cluster) * splits)), 1, 1


def pack_params(info: LightInfo, problem: Problem, addresses: tuple[int, int, int, int], encode, clusters: int = 0
                ) -> tuple[bytearray, tuple[int, int, int]]:
    """Params bytes of one problem and its grid.  `encode(buffer, offset, TmaArgs, address)` writes a descriptor
    (the driver's, or a recorder in tests); `clusters`: grid's."""
    p = problem
    a, b, d, bias = addresses
    tiles_m = -(-p.m // info.tile_m)
    params = bytearray(info.params_size)
    _FIELDS.pack_into(params, FIELDS, bias, p.m, p.n, p.k, p.activation, min(GROUP_ROWS, tiles_m))
    split = split_tail(p.m, p.n, p.k, info.tile_m, info.tile_n, bool(info.pingpong), info.cluster, p.sm_count)
    _SPLIT.pack_into(params, SPLIT_FIELDS, *split, 0, 0)
    buffer = (ctypes.c_char * len(params)).from_buffer(params)
    encode(buffer, TMA_A, operand_tma(bool(info.a_kmajor), p.m, p.k, p.lda, info.tile_m // info.cluster), a)
    b_n, b_k = p.n, p.k
    if p.b_rows and info.b_kmajor:
        b_n = p.b_rows
    elif p.b_rows:
        b_k = p.b_rows
    encode(buffer, info.tma_b, operand_tma(bool(info.b_kmajor), b_n, b_k, p.ldb, info.tile_n), b)
    encode(buffer, info.tma_d, output_tma(p.m, p.n, p.ldd, info.store_cols), d)
    return params, grid(p, info.tile_n, info.cluster, clusters=clusters, tile_m=info.tile_m, tail=split)


def check_problem(m: int, n: int, k: int, lda: int, ldb: int, ldd: int, addresses: tuple[int, int, int, int],
                  b_rows: int = 0, b_kmajor: bool = True) -> None:
    """What the kernel assumes and the class already guarantees, checked once per packed problem: TMA wants
    16-byte aligned operands and strides (D's too: the epilogue stores by TMA), and column pairs."""
    if min(m, n, k) < 1:
        raise ValueError(f"jitops.gemm (light sm_90a kernel): empty problem {m}x{n}x{k}")
    if not 0 <= b_rows <= (n if b_kmajor else k):
        raise ValueError(f"jitops.gemm (light sm_90a kernel): B stores {b_rows} rows, more than the {m}x{n}x{k} "
                         "problem reads")
    if n % 8 or lda % 8 or ldb % 8 or ldd % 8 or any(address % 16 for address in addresses[:3]):
        raise ValueError(f"jitops.gemm (light sm_90a kernel): N={n}, lda={lda}, ldb={ldb}, ldd={ldd} must be "
                         "multiples of 8 and A, B and D 16-byte aligned; this class should have taken CUTLASS's "
                         "kernel")


# ---- the driver ---------------------------------------------------------------------------------------------------
class _LightDriver:
    """The driver calls the light kernels' hosts make: descriptors through _TmaDriver, launches through
    jitops.launch's driver (ctypes, or CuPy's binding once the process is hot).  One a process (`get`): it probes
    the descriptor format once."""

    _instance: "_LightDriver | None" = None
    _guard = threading.Lock()

    @classmethod
    def get(cls, device_index: int) -> "_LightDriver":
        if cls._instance is None:
            with cls._guard:
                if cls._instance is None:
                    cls._instance = _LightDriver(device_index)
        return cls._instance

    def __init__(self, device_index: int) -> None:
        self._tma = _TmaDriver.get(device_index)  # which leaves this thread a current context for the probe
        self.replace = self._tma.replace
        self.set_shared_memory = self._tma.set_shared_memory
        self.ensure_context = self._tma.ensure_context
        self._driver = _Driver.get()
        self.address_field = self._find_address_field()

    def _find_address_field(self, args: TmaArgs | Im2colArgs | None = None) -> int | None:
        """Where a rank-2 descriptor (or one encoded from `args`) keeps its global address (_TmaDriver probes a
        rank-3 one; the format is the driver's, so it is probed again rather than assumed): encode, move it with
        cuTensorMapReplaceAddress, see which 8 bytes changed.  None: every patch goes through the driver."""
        probe = (ctypes.c_char * 128)()
        first, second = 0x10000000, 0x7654321000
        self.encode_into(probe, 0, args or operand_tma(True, 64, 64, 64, TILE_M), first)
        before = bytes(probe)
        scratch = (ctypes.c_char * 192)()
        aligned = (ctypes.addressof(scratch) + 63) // 64 * 64
        ctypes.memmove(aligned, probe, 128)
        if self.replace(aligned, second):
            return None
        after = ctypes.string_at(aligned, 128)
        changed = [i for i in range(128) if before[i] != after[i]]
        for at in range(0, 121, 8):
            if struct.unpack_from("<Q", before, at)[0] == first and struct.unpack_from("<Q", after, at)[0] == second \
                    and all(at <= i < at + 8 for i in changed):
                return at
        return None

    def encode_into(self, buffer: Any, offset: int, args: TmaArgs | Im2colArgs, address: int) -> None:
        """cuTensorMapEncodeTiled (or EncodeIm2col) into a 64-byte aligned scratch (the driver asks for an aligned
        tensor map; a bytearray is only 16-byte aligned), then copied into Params, which the launch copies anyway."""
        scratch = (ctypes.c_char * 192)()
        aligned = (ctypes.addressof(scratch) + 63) // 64 * 64 - ctypes.addressof(scratch)
        if isinstance(args, Im2colArgs):
            self._tma.encode_im2col_into(scratch, aligned, args, address)
        else:
            self._tma.encode_into(scratch, aligned, args, address)
        ctypes.memmove(ctypes.addressof(buffer) + offset, ctypes.addressof(scratch) + aligned, 128)

    def launch(self, function: CudaFunction, grid: tuple[int, int, int], block: int, smem: int, stream: int,
               params_address: int) -> None:
        try:
            self._driver.launch(function.handle, *grid, block, 1, 1, smem, stream, params_address, 0)
        except Exception as exc:  # noqa: BLE001 - a thread without a context is mended once; the rest re-raised
            if getattr(exc, "status", None) != _CUDA_ERROR_INVALID_CONTEXT:
                raise
            _bind_context(function.device_index)
            self._driver.launch(function.handle, *grid, block, 1, 1, smem, stream, params_address, 0)


class LightKernel:
    """A light kernel (an NVRTC cubin) with its host side.  Like Sm90Gemm, a problem's Params are packed once and
    reused; a call patches the operands' addresses.  What a problem is, how it is checked and packed: the
    subclasses (LightGemm here, light_conv.LightConv)."""

    def __init__(self, function: CudaFunction, info: LightInfo | None = None, driver: Any = None) -> None:
        self.function = function
        self.info = info or LightInfo.from_cubin(function._cubin)
        self._driver = driver or _LightDriver.get(function.device_index)
        self._lock = threading.Lock()
        self._problems: dict[tuple, _Packed] = {}
        self._attribute_set = False
        self.clusters = 0  # a cluster kernel's clusters that run at once (_prepare; grid)

    def _launch(self, key: tuple, addresses: tuple[int, int, int, int], stream: int) -> "_Packed":
        """Launch problem `key` with these (A, B, D, bias) addresses: its Params packed the first time (after
        `_check`), patched with new addresses after."""
        with self._lock:
            packed = self._problems.get(key)
            if packed is None:
                self._check(key, addresses)
                self._prepare()
                if len(self._problems) >= 1024:  # a process sweeping sizes: keep the memory bounded
                    self._problems.clear()
                params, launch_grid = self._pack(key, addresses)
                packed = self._problems[key] = _Packed(self, key, params, launch_grid, addresses,
                                                       self._workspace(key, params))
            packed.launch(*addresses, stream)
        return packed

    def _prepare(self) -> None:
        """Before a problem's first encode: the device's context (_TmaDriver), and the kernel's shared memory."""
        self._driver.ensure_context(self.function.device_index)
        if not self._attribute_set:
            self._driver.set_shared_memory(self.function, self.info.smem)
            if self.info.cluster > 1:
                self.clusters = self.function.max_active_clusters(self.info.cluster, self.info.threads,
                                                                  self.info.smem)
            self._attribute_set = True

    def _check(self, key: tuple, addresses: tuple[int, int, int, int]) -> None:
        raise NotImplementedError

    def _pack(self, key: tuple, addresses: tuple[int, int, int, int]) -> tuple[bytearray, tuple[int, int, int]]:
        raise NotImplementedError

    def _workspace(self, key: tuple, params: bytearray) -> tuple[int, int]:
        """(bytes of the slices, counters) each launch of problem `key`, packed as `params`, needs: a split
        GEMM's (LightGemm)."""
        return 0, 0

    def descriptor_address_field(self) -> int | None:
        """Where the kernel's descriptors keep their global address (None: patched through the driver)."""
        return self._driver.address_field

    def a_descriptors(self, key: tuple) -> tuple[int, ...]:
        """The offsets of the descriptors that hold A's address (a strided dgrad's phases have one each)."""
        return (TMA_A,)


class LightGemm(LightKernel):
    """The light GEMM kernel's host side: `run(...)` is one GEMM."""

    def run(self, a: int, b: int, d: int, bias: int, m: int, n: int, k: int, lda: int, ldb: int, ldd: int,
            activation: int, sm_count: int, stream: int, b_rows: int = 0) -> "_Packed":
        return self._launch((m, n, k, lda, ldb, ldd, activation, sm_count, b_rows), (a, b, d, bias), stream)

    def _workspace(self, key: tuple, params: bytearray) -> tuple[int, int]:
        split_from, splits = _SPLIT.unpack_from(params, SPLIT_FIELDS)[:2]  # split_tail's, as pack_params wrote it
        return workspace_bytes(key[0], key[1], self.info.tile_m, self.info.tile_n, split_from, splits)

    def _check(self, key: tuple, addresses: tuple[int, int, int, int]) -> None:
        check_problem(*key[:6], addresses, key[8], bool(self.info.b_kmajor))

    def _pack(self, key: tuple, addresses: tuple[int, int, int, int]) -> tuple[bytearray, tuple[int, int, int]]:
        return pack_params(self.info, Problem(*key), addresses, self._driver.encode_into, self.clusters)


class _Packed(PackedParams):
    """One problem's Params, patched with each call's addresses.  jitops/native.py's C++ host path takes a copy
    (`offered`: the config generation it was offered under, -1 before)."""

    bias_field = FIELDS

    def __init__(self, owner: LightKernel, problem: tuple, params: bytearray, grid: tuple[int, int, int],
                 addresses: tuple[int, int, int, int], workspace: tuple[int, int] = (0, 0)) -> None:
        super().__init__(params, grid)
        self.workspace = workspace  # (bytes of the slices, counters) of a split GEMM, else (0, 0)
        self.owner = owner
        self.problem = problem
        self.offered = -1
        self.addresses = addresses
        self.address_field = owner.descriptor_address_field()
        self.descriptors = (TMA_A, owner.info.tma_b, owner.info.tma_d)
        self.a_descriptors = owner.a_descriptors(problem)

    def launch(self, a: int, b: int, d: int, bias: int, stream: int) -> None:
        if (a, b, d, bias) != self.addresses:
            self._patch(a, b, d, bias)
        owner = self.owner
        nbytes, count = self.workspace
        if nbytes:  # kept until the launch is queued
            slices, counters = split_workspace(owner.function.device_index, stream, nbytes, count)
            struct.pack_into("<QQ", self.params, WORKSPACE_FIELD, slices.data_ptr(), counters.data_ptr())
        owner._driver.launch(owner.function, self.grid, owner.info.threads, owner.info.smem, stream,
                             self.kernel_params_address)

    def _patch(self, a: int, b: int, d: int, bias: int) -> None:
        if d % 16:  # a problem is checked with its first addresses; D's is new every call
            raise ValueError("jitops.gemm (light sm_90a kernel): the output must be 16-byte aligned for its TMA "
                             "store; pass a fresh output or one from torch.empty")
        driver, field = self.owner._driver, self.address_field
        if a != self.addresses[0]:
            for offset in self.a_descriptors:
                patch_descriptor(driver, self.params, self.address, offset, field, a)
        for offset, address, old in zip(self.descriptors[1:], (b, d), self.addresses[1:]):
            if address != old:
                patch_descriptor(driver, self.params, self.address, offset, field, address)
        struct.pack_into("<Q", self.params, FIELDS, bias)
        self.addresses = (a, b, d, bias)


def host(kernel: CudaFunction) -> LightGemm:
    """The host side of a loaded light kernel, made once and kept on it."""
    found = kernel.__dict__.get("light_host")
    if found is None:
        found = kernel.__dict__.setdefault("light_host", LightGemm(kernel))
    return found


def run(kernel: CudaFunction, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, bias: torch.Tensor | None,
        m: int, n: int, k: int, lda: int, ldb: int, activation: int, sm_count: int, stream: int,
        b_rows: int = 0) -> "_Packed":
    """out (M, N, row-major) = act(a . b + bias): a (M, K) and b (K, N) in the layouts of the kernel's class
    (row- or column-major each), with leading dimensions lda and ldb; b_rows (Problem.b_rows) where b is stored
    shorter than the problem.  Returns the packed problem it launched."""
    return (kernel.__dict__.get("light_host") or host(kernel)).run(
        a.data_ptr(), b.data_ptr(), out.data_ptr(), 0 if bias is None else bias.data_ptr(), m, n, k, lda, ldb, n,
        activation, sm_count, stream, b_rows)


# A split launch's counters, per device and stream: zero at launch, and the kernel leaves them zero (the last split of
# a tile resets its own), so one buffer serves every launch queued on its stream in turn.
_COUNTERS: dict[tuple[int, int], torch.Tensor] = {}
_COUNTERS_LOCK = threading.Lock()
COUNTERS_MIN = 1024  # ints: a split tail is at most half the SMs' tiles, times three consumer warpgroups


def split_workspace(device_index: int, stream: int, nbytes: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A split launch's slices, from torch's caching allocator each call (back to it once the launch is queued:
    stream-ordered reuse), and its counters (split_counters)."""
    return (torch.empty(nbytes, dtype=torch.uint8, device=device_index),
            split_counters(device_index, stream, count))


def split_counters(device_index: int, stream: int, count: int) -> torch.Tensor:
    """At least `count` zeroed int32 counters for a split launch on `stream` (the current one).  Eager launches
    share their stream's buffer, kept for the process.  A launch under CUDA-graph capture gets its own buffer from
    the graph's pool, zeroed by a captured fill on every replay: a graph keeps the addresses it captured, and two
    graphs replayed at once on two streams must not count on one buffer (the C++ host path does the same)."""
    if torch.cuda.is_current_stream_capturing():
        return torch.zeros(count, dtype=torch.int32, device=device_index)
    key = (device_index, stream)
    found = _COUNTERS.get(key)
    if found is not None and found.numel() >= count:
        return found
    with _COUNTERS_LOCK:
        found = _COUNTERS.get(key)
        if found is None or found.numel() < count:
            found = _COUNTERS[key] = torch.zeros(max(count, COUNTERS_MIN), dtype=torch.int32, device=device_index)
        return found


__all__ = ["LIGHT_GEMM", "LightGemm", "LightInfo", "LightKernel", "expected_info", "operand_tma", "output_tma",
           "pack_params", "pingpong_for", "request", "TILES", "tile_m_for", "tile_n_for",
           "unsupported"]
