"""The host side of jitops' CUTLASS 3 (sm_90a) kernels, in Python: what CUTLASS's `to_underlying_arguments`,
`get_grid_shape` and cluster launch do in C++, for the configurations jitops builds.

Why: a CUTLASS 3 kernel built by nvcc with its host code took 52-80 s, and most of it was host compilation
(cudafe++ and gcc over CUTLASS's host templates; docs/architecture.md, "CUTLASS 3 kernels without nvcc").  NVRTC
compiles the kernel alone (kernels/gemm/sm90_gemm_kernel.cu); this module builds its `Params` argument:

- the layout (where each field of Params lives) is the compiler's: the kernel source exports `offsetof`s and
  sizes as a `__constant__` array, read here from the cubin's ELF symbol table, without a GPU;
- TMA descriptors come from the driver's `cuTensorMapEncodeTiled`, with the arguments CUTLASS's `make_tma_copy`
  passes for these layouts (box, swizzle, L2 promotion, element type), and the tile scheduler's fields mirror
  `PersistentTileSchedulerSm90Params::initialize`;
- tests/test_cutlass_host.py checks every byte of Params, every descriptor's arguments and the grid against
  CUTLASS's own host code, run on the CPU over 17 configurations (tests/cutlass_host/, a committed fixture).

Per call, the packed Params of a problem (sizes, leading dimensions, epilogue, scheduler options) is reused:
only the operands' addresses change, patched into the descriptors and the bias field, then one
`cuLaunchKernelEx` launches the cluster grid on torch's current stream.
"""
from __future__ import annotations

import ctypes
import math
import struct
import threading
from typing import Any, NamedTuple

import torch

from .launch import _CUDA_ERROR_INVALID_CONTEXT, CudaFunction, DriverError, _bind_context, _Driver, ensure_context

# ---- reading a cubin --------------------------------------------------------------------------------------------


def elf_symbol(image: bytes, name: str) -> bytes:
    """The initial bytes of a defined data symbol in an ELF64 image (a cubin): a `__constant__` array's values,
    read without loading the module (so without a GPU)."""
    if image[:4] != b"\x7fELF" or image[4] != 2 or image[5] != 1:
        raise ValueError("jitops: not a little-endian ELF64 image (a cubin)")
    shoff, = struct.unpack_from("<Q", image, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", image, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", image, shoff + i * shentsize) for i in range(shnum)]
    wanted = name.encode()
    for sh_name, sh_type, _, _, sh_offset, sh_size, sh_link, _, _, sh_entsize in sections:
        if sh_type != 2:  # SHT_SYMTAB
            continue
        strtab = sections[sh_link]
        for at in range(sh_offset, sh_offset + sh_size, sh_entsize or 24):
            st_name, _, _, st_shndx, st_value, st_size = struct.unpack_from("<IBBHQQ", image, at)
            start = strtab[4] + st_name
            if image[start:image.index(b"\0", start)] == wanted and 0 < st_shndx < len(sections):
                section = sections[st_shndx]
                if section[1] == 8:  # SHT_NOBITS: no initial bytes
                    break
                return image[section[4] + st_value:section[4] + st_value + st_size]
    raise KeyError(f"jitops: symbol {name!r} not found in the cubin")


def cubin_u64_table(image: bytes, name: str, fields: tuple[str, ...], source: str) -> tuple[int, ...]:
    """A kernel's exported `__constant__ u64 name[]` (launch facts, Params offsets), checked against the fields the
    host side expects; `source` names the kernel file for the message when the two disagree."""
    raw = elf_symbol(image, name)
    values = struct.unpack(f"<{len(raw) // 8}Q", raw)
    if len(values) != len(fields):
        raise ValueError(f"jitops: the cubin's {name} has {len(values)} fields, expected {len(fields)}: {source} "
                         "and its host side disagree")
    return values


# ---- the GEMM's Params layout ------------------------------------------------------------------------------------
# The order of JITOPS_GEMM_LAYOUT in kernels/gemm/sm90_gemm.cuh.
GEMM_LAYOUT_FIELDS = (
    "size", "align", "mode", "problem_shape", "tma_a", "tma_b", "mainloop_bytes", "bytes_mk", "bytes_nk",
    "thread", "thread_size", "tma_d", "epilogue_bytes", "epilogue_bytes_value", "hw_info", "scheduler", "smem",
    "threads")


class GemmLayout(NamedTuple):
    size: int
    align: int
    mode: int
    problem_shape: int
    tma_a: int
    tma_b: int
    mainloop_bytes: int
    bytes_mk: int
    bytes_nk: int
    thread: int
    thread_size: int
    tma_d: int
    epilogue_bytes: int
    epilogue_bytes_value: int
    hw_info: int
    scheduler: int
    smem: int
    threads: int

    @staticmethod
    def from_cubin(cubin: bytes) -> "GemmLayout":
        return GemmLayout(*cubin_u64_table(cubin, "jitops_gemm_layout", GEMM_LAYOUT_FIELDS,
                                           "kernels/gemm/sm90_gemm.cuh"))


# ---- what CUTLASS's make_tma_copy passes to cuTensorMapEncodeTiled ---------------------------------------------
# CUtensorMapDataType: the mainloop moves 16-bit operands as UINT16 (CUTLASS's TmaInternalType), the epilogue
# stores its element type.
TMA_UINT16, TMA_FLOAT16, TMA_FLOAT32, TMA_BFLOAT16 = 1, 6, 7, 9
TMA_TYPES = {torch.bfloat16: TMA_BFLOAT16, torch.float16: TMA_FLOAT16, torch.float32: TMA_FLOAT32}
SWIZZLE_NONE, SWIZZLE_32B, SWIZZLE_64B, SWIZZLE_128B = 0, 1, 2, 3
L2_PROMOTION_128B = 2  # CUTLASS: CU_TENSOR_MAP_L2_PROMOTION_L2_128B for every TMA


class TmaArgs(NamedTuple):
    """The arguments of one cuTensorMapEncodeTiled call (byte strides, the first one implicit)."""
    dtype: int
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    box: tuple[int, ...]
    swizzle: int
    l2: int = L2_PROMOTION_128B


class Im2colArgs(NamedTuple):
    """The arguments of one cuTensorMapEncodeIm2col call: an NHWC tensor as dims (C, W, H, N) with byte strides
    (the first implicit), the bounding box's corners (W, H) for a filter offset of 0, and what one load brings:
    `pixels` pixels of `channels` channels, stepping through the box by `element_strides` (C, W, H, N)."""
    dtype: int
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    lower: tuple[int, ...]
    upper: tuple[int, ...]
    channels: int
    pixels: int
    element_strides: tuple[int, ...]
    swizzle: int
    l2: int = L2_PROMOTION_128B


def _swizzle_of(inner_bytes: int) -> int:
    """The widest swizzle whose 16-byte-unit pattern a row of `inner_bytes` fills (CUTLASS's smem selectors pick
    the widest layout atom that divides the tile)."""
    for size, mode in ((128, SWIZZLE_128B), (64, SWIZZLE_64B), (32, SWIZZLE_32B)):
        if inner_bytes % size == 0:
            return mode
    return SWIZZLE_NONE


def operand_tma(kmajor: bool, mn: int, k: int, ld: int, tile_mn: int, tile_k: int, multicast: int,
                element_size: int) -> TmaArgs:
    """A or B of the mainloop: (MN, K) with leading dimension `ld`, loaded tile_mn x tile_k per stage, the MN
    extent of the box split among the `multicast` CTAs of the cluster that share the tile.

    K-major: CUTLASS's tile is one 128-byte swizzle atom wide in K (64 16-bit elements), so the box is the whole
    tile: (tile_k, tile_mn / multicast).  MN-major: the 128-byte atom runs along MN (64 elements), the TMA box
    covers one atom of MN by the tile's K, and the copy issues one box per atom."""
    if kmajor:
        return TmaArgs(TMA_UINT16, (k, mn, 1), (ld * element_size, 0), (tile_k, tile_mn // multicast, 1),
                       _swizzle_of(tile_k * element_size))
    atom = 128 // element_size
    box_mn = min(atom, tile_mn)
    return TmaArgs(TMA_UINT16, (mn, k, 1), (ld * element_size, 0), (box_mn, tile_k // multicast, 1),
                   _swizzle_of(box_mn * element_size))


# ---- the persistent tile scheduler ----------------------------------------------------------------------------
def _log2(x: int) -> int:
    return x.bit_length() - 1


def fast_divmod_u64(divisor: int) -> tuple[int, int, int, int]:
    """cutlass::FastDivmodU64(divisor): (divisor, multiplier, shift_right, round_up)."""
    if not divisor:
        return 0, 0, 0, 0
    shift = _log2(divisor)
    if divisor & (divisor - 1) == 0:
        return divisor, 0, shift, 0
    power = 1 << shift
    multiplier_lo = (power << 64) // divisor  # uint128_t(0, power) / divisor: power in the high word
    multiplier = ((power << 64) | power) // divisor
    round_up = 1 if multiplier_lo == multiplier else 0
    return divisor, multiplier & (2**64 - 1), shift, round_up


def _log_swizzle(tiles_m: int, tiles_n: int, max_swizzle: int) -> int:
    smaller = min(tiles_m, tiles_n)
    if max_swizzle >= 8 and smaller >= 6:
        return 3
    if max_swizzle >= 4 and smaller >= 3:
        return 2
    if max_swizzle >= 2 and smaller >= 2:
        return 1
    return 0


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


class Schedule(NamedTuple):
    fields: bytes          # PersistentTileSchedulerSm90Params, packed
    grid: tuple[int, int, int]


# PersistentTileSchedulerSm90Params: FastDivmodU64Pow2 x2 (u64, u32 + pad), FastDivmodU64 x2 (u64, u64, u32,
# u32), blocks_per_problem (u64), log_swizzle (i32), raster (i32), tiles m, n, l, cluster m, n (u32).
_SCHEDULER = struct.Struct("<QI4xQI4xQQIIQQIIQiiIIIII")
ALONG_M, ALONG_N = 0, 1  # RasterOrder
MAX_SM_PER_GPC = 18      # CUTLASS's H100 occupancy rule (get_max_cta_occupancy)


def persistent_schedule(m: int, n: int, tile: tuple[int, int], cluster: tuple[int, int], sm_count: int,
                        max_swizzle: int, raster_option: int) -> Schedule:
    """PersistentTileSchedulerSm90Params::initialize and get_grid_shape (data-parallel tiles, one batch).
    raster_option: 0 CUTLASS's heuristic, 1 along M, 2 along N."""
    cm, cn = cluster
    blocks_m = _round_up(-(-m // tile[0]), cm)
    blocks_n = _round_up(-(-n // tile[1]), cn)
    log_swizzle = _log_swizzle(blocks_m, blocks_n, max_swizzle)
    blocks_m = _round_up(blocks_m, (1 << log_swizzle) * cm)
    blocks_n = _round_up(blocks_n, (1 << log_swizzle) * cn)
    if raster_option == 0:
        raster = ALONG_M if blocks_n > blocks_m else ALONG_N
    else:
        raster = ALONG_N if raster_option == 2 else ALONG_M
    if raster == ALONG_N:
        major, minor, blk_major = cn, cm, blocks_n // cn
    else:
        major, minor, blk_major = cm, cn, blocks_m // cm
    fields = _SCHEDULER.pack(major, _log2(major), minor, _log2(minor), *fast_divmod_u64(blocks_m * blocks_n),
                             *fast_divmod_u64(blk_major), blocks_m * blocks_n, log_swizzle, raster,
                             blocks_m // cm, blocks_n // cn, 1, cm, cn)
    # get_grid_shape (no max_active_clusters): the whole device, or fewer CTAs than tiles.
    total = blocks_m * blocks_n
    size = cm * cn
    if size == 1:
        ctas = min(sm_count, total)
        grid = (1, ctas, 1) if raster == ALONG_N else (ctas, 1, 1)
    else:
        gpcs = 1 if sm_count < MAX_SM_PER_GPC else sm_count // MAX_SM_PER_GPC
        per_device = gpcs * (MAX_SM_PER_GPC - MAX_SM_PER_GPC % size)
        residual = 0 if sm_count < MAX_SM_PER_GPC else sm_count % MAX_SM_PER_GPC
        per_device = min(sm_count, per_device + residual - residual % size)
        if raster == ALONG_N:
            grid = (cm, min(per_device // cm, total // cm), 1)
        else:
            grid = (min(per_device // cn, total // cn), cn, 1)
    return Schedule(fields, grid)


# ---- the driver ----------------------------------------------------------------------------------------------
class _LaunchAttribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint * 16)]


class _LaunchConfig(ctypes.Structure):
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_mem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


_CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4
_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_U64 = ctypes.c_uint64
_U32 = ctypes.c_uint32


class _TmaDriver:
    """cuTensorMapEncodeTiled, cuTensorMapReplaceAddress and cuLaunchKernelEx through ctypes."""

    _instance: "_TmaDriver | None" = None
    _guard = threading.Lock()

    def __init__(self) -> None:
        lib = _Driver.get().lib
        self.encode = lib.cuTensorMapEncodeTiled
        self.encode.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
                                ctypes.POINTER(_U64), ctypes.POINTER(_U64), ctypes.POINTER(_U32),
                                ctypes.POINTER(_U32), ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        self.encode.restype = ctypes.c_int
        self.encode_im2col = lib.cuTensorMapEncodeIm2col
        self.encode_im2col.argtypes = [
            ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, ctypes.POINTER(_U64),
            ctypes.POINTER(_U64), ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int), ctypes.c_uint32,
            ctypes.c_uint32, ctypes.POINTER(_U32), ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        self.encode_im2col.restype = ctypes.c_int
        self.replace = lib.cuTensorMapReplaceAddress
        self.replace.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        self.replace.restype = ctypes.c_int
        self.launch = lib.cuLaunchKernelEx
        self.launch.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        self.launch.restype = ctypes.c_int
        self.address_field = self._find_address_field()

    @classmethod
    def get(cls, device_index: int) -> "_TmaDriver":
        """The process's driver, with a current context on this thread (host sides probe and encode right after:
        a light kernel first used on autograd's device thread, after a CUTLASS kernel had made the instance on
        the main thread, raised CUDA_ERROR_INVALID_CONTEXT when only the first caller got one; H100)."""
        ensure_context(device_index)  # 0.05 us once this thread has one
        if cls._instance is None:
            with cls._guard:
                if cls._instance is None:
                    cls._instance = _TmaDriver()
        return cls._instance

    # Before a new problem's descriptors are encoded: cuTensorMapEncodeTiled needs a current context, which
    # autograd's device threads start without (a Linear's first backward raised CUDA_ERROR_INVALID_CONTEXT).
    ensure_context = staticmethod(ensure_context)

    def set_shared_memory(self, function: CudaFunction, size: int) -> None:
        """The kernel's dynamic shared-memory limit (CUTLASS 3 kernels take 100-227 KB)."""
        ensure_context(function.device_index)
        driver = _Driver.get()
        driver.check("cuFuncSetAttribute", driver.lib.cuFuncSetAttribute(
            function.handle, _CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, size))

    def encode_into(self, buffer: Any, offset: int, args: TmaArgs, address: int) -> None:
        rank = len(args.dims)
        status = self.encode(
            ctypes.addressof(buffer) + offset, args.dtype, rank, address, (_U64 * rank)(*args.dims),
            (_U64 * max(rank - 1, 1))(*args.strides), (_U32 * rank)(*args.box), (_U32 * rank)(*([1] * rank)),
            0, args.swizzle, args.l2, 0)
        if status:
            raise DriverError(f"cuTensorMapEncodeTiled{tuple(args)}", status)

    def encode_im2col_into(self, buffer: Any, offset: int, args: Im2colArgs, address: int) -> None:
        rank = len(args.dims)
        spatial = rank - 2
        status = self.encode_im2col(
            ctypes.addressof(buffer) + offset, args.dtype, rank, address, (_U64 * rank)(*args.dims),
            (_U64 * (rank - 1))(*args.strides), (ctypes.c_int * spatial)(*args.lower),
            (ctypes.c_int * spatial)(*args.upper), args.channels, args.pixels, (_U32 * rank)(*args.element_strides),
            0, args.swizzle, args.l2, 0)
        if status:
            raise DriverError(f"cuTensorMapEncodeIm2col{tuple(args)}", status)

    def _find_address_field(self) -> int | None:
        """Where a descriptor keeps its global address, if it is a plain little-endian field: encode one, move
        it with cuTensorMapReplaceAddress and see which bytes changed.  None: replace through the driver on
        every call (a 128-byte descriptor format is the driver's, not documented)."""
        probe = (ctypes.c_char * 256)()
        args = TmaArgs(TMA_UINT16, (64, 64, 1), (128, 0), (64, 64, 1), SWIZZLE_128B)
        base = (ctypes.addressof(probe) + 63) // 64 * 64 - ctypes.addressof(probe)
        first, second = 0x10000000, 0x7654321000
        self.encode_into(probe, base, args, first)
        before = bytes(probe[base:base + 128])
        if self.replace(ctypes.addressof(probe) + base, second):
            return None
        after = bytes(probe[base:base + 128])
        changed = [i for i in range(128) if before[i] != after[i]]
        for at in range(0, 121, 8):
            if (struct.unpack_from("<Q", before, at)[0] == first and struct.unpack_from("<Q", after, at)[0] == second
                    and all(at <= i < at + 8 for i in changed)):
                return at
        return None


# ---- jitops.gemm's sm_90a kernel ------------------------------------------------------------------------------
class GemmConfig(NamedTuple):
    """The compile-time facts the host side needs (jitops/ops/gemm.py's class and configuration)."""
    element_size: int
    out_dtype: torch.dtype
    a_kmajor: bool
    b_kmajor: bool
    tile: tuple[int, int, int]
    cluster: tuple[int, int]
    fused: bool
    epilogue_tile: tuple[int, int]  # (M, N) of one epilogue store: CUTLASS's EpilogueTileAuto


def epilogue_tile(tile: tuple[int, int, int], pingpong: bool, out_dtype: torch.dtype) -> tuple[int, int]:
    """CUTLASS's EpilogueTileAuto for sm_90 TMA epilogues (sm90_compute_tile_shape_or_override): up to 128 rows
    when cooperative, 64 with ping-pong, by 32 columns (16- and 32-bit D; the gcd with the tile's N)."""
    rows = min(64 if pingpong else 128, tile[0])
    return rows, math.gcd(min(32, tile[1]), tile[1])


class Problem(NamedTuple):
    m: int
    n: int
    k: int
    lda: int
    ldb: int
    ldd: int
    activation: int
    has_bias: bool
    swizzle: int
    raster: int
    sm_count: int


def pack_params(layout: GemmLayout, config: GemmConfig, problem: Problem, addresses: tuple[int, int, int, int],
                encode) -> tuple[bytearray, tuple[int, int, int]]:
    """Params bytes of one problem, and its grid.  `encode(buffer, offset, TmaArgs, address)` writes a
    descriptor (the driver's, or a recorder in tests); padding and unset fields stay zero."""
    p = problem
    a, b, d, bias = addresses
    es = config.element_size
    out_size = torch.empty((), dtype=config.out_dtype).element_size()
    params = bytearray(layout.size)
    struct.pack_into("<i", params, layout.mode, 0)  # GemmUniversalMode::kGemm
    struct.pack_into("<iiii", params, layout.problem_shape, p.m, p.n, p.k, 1)
    tm, tn, tk = config.tile
    cm, cn = config.cluster
    descriptors = [
        (layout.tma_a, operand_tma(config.a_kmajor, p.m, p.k, p.lda, tm, tk, cn, es), a),
        (layout.tma_b, operand_tma(config.b_kmajor, p.n, p.k, p.ldb, tn, tk, cm, es), b),
    ]
    em, en = config.epilogue_tile
    descriptors.append((layout.tma_d, TmaArgs(TMA_TYPES[config.out_dtype], (p.n, p.m, 1), (p.ldd * out_size, 0),
                                              (en, em, 1), _swizzle_of(en * out_size)), d))
    struct.pack_into("<III", params, layout.mainloop_bytes, layout.bytes_mk + layout.bytes_nk, layout.bytes_mk,
                     layout.bytes_nk)
    struct.pack_into("<I", params, layout.epilogue_bytes, layout.epilogue_bytes_value)
    for offset, value_format, value in _thread_fields(config, p, bias):
        struct.pack_into(value_format, params, layout.thread + offset, value)
    struct.pack_into("<iii", params, layout.hw_info, 0, p.sm_count, 0)
    schedule = persistent_schedule(p.m, p.n, (tm, tn), config.cluster, p.sm_count, p.swizzle, p.raster)
    params[layout.scheduler:layout.scheduler + len(schedule.fields)] = schedule.fields
    buffer = (ctypes.c_char * len(params)).from_buffer(params)
    for offset, args, address in descriptors:
        encode(buffer, offset, args, address)
    return params, schedule.grid


# The epilogue's run-time fields, at their offsets in Params.epilogue.thread (a tuple of the fusion tree's node
# parameters, children first; checked against CUTLASS's bytes by tests/test_cutlass_host.py):
# - no fusion, CUTLASS's Sm90LinearCombination, beta * C + alpha * acc: two Sm90ScalarBroadcast nodes of
#   {float scalar, pointer, int64 batch stride}, beta's at 0 and alpha's at 32; alpha = 1, the rest zero;
# - jitops' act(acc + bias): the accumulator fetch (empty), Sm90RowBroadcast {bias pointer at 8, null default
#   (the bias element, zero) at 16}, Sm90Compute's ActivationArguments {activation at 24}.
LINEAR_ALPHA = 32
FUSED_BIAS = 8
FUSED_ACTIVATION = 24


def _thread_fields(config: GemmConfig, p: Problem, bias: int) -> list[tuple[int, str, Any]]:
    if not config.fused:
        return [(LINEAR_ALPHA, "<f", 1.0)]
    return [(FUSED_BIAS, "<Q", bias), (FUSED_ACTIVATION, "<i", p.activation)]


class Sm90Gemm:
    """jitops.gemm's sm_90a kernel (an NVRTC cubin) with its host side: `run(...)` is one GEMM."""

    def __init__(self, function: CudaFunction, config: GemmConfig, layout: GemmLayout | None = None,
                 driver: "_TmaDriver | None" = None) -> None:
        self.function = function
        self.config = config
        self.layout = layout or GemmLayout.from_cubin(function._cubin)
        self._driver = driver or _TmaDriver.get(function.device_index)
        self._lock = threading.Lock()
        self._problems: dict[tuple, _Packed] = {}
        self._attribute_set = False
        self._attribute = ctypes.c_int()

    def _pack(self, problem: Problem, addresses: tuple[int, int, int, int]) -> "_Packed":
        self._driver.ensure_context(self.function.device_index)
        if not self._attribute_set:
            self._driver.set_shared_memory(self.function, self.layout.smem)
            self._attribute_set = True
        params, grid = pack_params(self.layout, self.config, problem, addresses, self._driver.encode_into)
        return _Packed(self, params, grid, addresses)

    def run(self, a: int, b: int, d: int, bias: int, m: int, n: int, k: int, lda: int, ldb: int, ldd: int,
            activation: int, swizzle: int, raster: int, sm_count: int, stream: int) -> None:
        # A plain tuple as the key: building the Problem NamedTuple cost twice as much, on every call.
        key = (m, n, k, lda, ldb, ldd, activation, bias != 0, swizzle, raster, sm_count)
        with self._lock:
            packed = self._problems.get(key)
            if packed is None:
                if len(self._problems) >= 1024:  # a process sweeping sizes: keep the memory bounded
                    self._problems.clear()
                packed = self._problems[key] = self._pack(Problem(*key), (a, b, d, bias))
            packed.launch(a, b, d, bias, stream)


def patch_descriptor(driver: Any, params: Any, params_address: int, offset: int, field: int | None,
                     address: int) -> None:
    """Point the descriptor at `offset` of `params` (a writable buffer at `params_address`) to `address`: a plain
    write of its address field where the probe found one (`field`), else cuTensorMapReplaceAddress."""
    if field is not None:
        struct.pack_into("<Q", params, offset + field, address)
        return
    status = driver.replace(params_address + offset, address)
    if status:
        raise DriverError("cuTensorMapReplaceAddress", status)


class PackedParams:
    """A kernel's one Params argument, packed (CUTLASS's kernel and the light kernels): its buffer (a call patches
    it in place), its address, the launch's argument array pointing at it, and the grid."""

    def __init__(self, params: bytearray, grid: tuple[int, int, int]) -> None:
        self.params = (ctypes.c_char * len(params)).from_buffer(params)
        self._keep = params
        self.address = ctypes.addressof(self.params)
        self.kernel_params = (ctypes.c_void_p * 1)(self.address)
        self.kernel_params_address = ctypes.addressof(self.kernel_params)
        self.grid = grid


class _Packed(PackedParams):
    """One problem's Params and launch configuration; a call patches the four addresses and launches."""

    def __init__(self, owner: Sm90Gemm, params: bytearray, grid: tuple[int, int, int],
                 addresses: tuple[int, int, int, int]) -> None:
        super().__init__(params, grid)
        layout, driver = owner.layout, owner._driver
        cm, cn = owner.config.cluster
        self.attribute = _LaunchAttribute(id=_CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
        self.attribute.value[0:3] = (cm, cn, 1)
        self.config = _LaunchConfig(grid=(ctypes.c_uint * 3)(*grid), block=(ctypes.c_uint * 3)(layout.threads, 1, 1),
                                    shared_mem=layout.smem, attrs=ctypes.pointer(self.attribute), num_attrs=1)
        self._config_address = ctypes.addressof(self.config)
        self._launch = driver.launch
        self._function = owner.function.handle
        self._device = owner.function.device_index
        self._driver = driver
        self._field = driver.address_field
        self._descriptors = (layout.tma_a, layout.tma_b, layout.tma_d)
        self._bias = layout.thread + FUSED_BIAS if owner.config.fused else None
        self._addresses = addresses  # what the descriptors were encoded with

    def launch(self, a: int, b: int, d: int, bias: int, stream: int) -> None:
        if (a, b, d, bias) != self._addresses:
            self._patch(a, b, d, bias)
        self.config.stream = stream
        status = self._launch(self._config_address, self._function, self.kernel_params, None)
        if status:
            self._launch_failed(status)

    def _launch_failed(self, status: int) -> None:
        """A thread without a current context (autograd's device threads) is bound to the primary context and
        the launch retried once; anything else is raised."""
        if status == _CUDA_ERROR_INVALID_CONTEXT:
            _bind_context(self._device)
            status = self._launch(self._config_address, self._function, self.kernel_params, None)
        if status:
            raise DriverError(f"cuLaunchKernelEx (grid {self.grid}, cluster {tuple(self.attribute.value[0:3])})",
                              status)

    def _patch(self, a: int, b: int, d: int, bias: int) -> None:
        for offset, address in zip(self._descriptors, (a, b, d)):
            patch_descriptor(self._driver, self.params, self.address, offset, self._field, address)
        if self._bias is not None:
            struct.pack_into("<Q", self.params, self._bias, bias)
        self._addresses = (a, b, d, bias)


__all__ = ["GemmConfig", "GemmLayout", "PackedParams", "Sm90Gemm", "TmaArgs", "elf_symbol", "pack_params",
           "patch_descriptor", "persistent_schedule", "epilogue_tile"]
