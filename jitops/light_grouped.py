"""The host side of jitops.grouped_gemm's light sm_90a kernels: the light GEMM kernel (kernels/gemm/sm90_light_gemm.cu)
built with LIGHT_GROUPED, the default (JITOPS_GROUPED_GEMM_SM90_KERNEL=cutlass takes CUTLASS's ptr-array grouped
GEMM instead, kernels/grouped_gemm/grouped_gemm.cu through nvcc).

Why: each CUTLASS grouped kernel is about 40 s of nvcc on a 2-core machine (three of them were 147 s of the 218 s an
image's prewarm spent compiling, docs/benchmarks.md); a light one compiles through NVRTC in under a second.

Three kernels, one per form (the kernel's LIGHT_GROUPED):
  - ragged M (the mixture-of-experts forward and its dx): A (T, K) through one descriptor, B (G, K, N) through a
    3-D one, D stored by rows; the group sizes stay on the device (the kernel walks the offsets);
  - ragged K (the weight gradient): A (M, T) and B (T, N), D (G, M, N) through a 3-D descriptor;
  - list: per-group descriptors and sizes in a table that the host packs and copies to the device before the
    launch (pinned memory, no wait for the stream).
Ragged N runs as ragged M on the transposes (jitops/ops/grouped_gemm_run.py).  Tiles are 128 x 256, or 128 x 128
where N is at most 128; the consumers share each tile (no pingpong: it assumes equal k-blocks per tile).

Params is the light GEMM's 448 bytes with the grouped fields after the GEMM's ints (GROUPED_FIELDS); a problem's
Params are packed once and each call patches the addresses, as jitops/light_gemm.py does.
"""
from __future__ import annotations

import ctypes
import struct
from typing import Any, NamedTuple, Sequence

import torch

from . import shapes
from .cutlass_host import SWIZZLE_128B, TMA_UINT16, PackedParams, TmaArgs, patch_descriptor
from .launch import CudaFunction, host_to_device
from .light_gemm import (FIELDS, GROUP_ROWS, IN_TYPES, LIGHT_GEMM, STORE_ROWS, TILE_K, TILE_M, TMA_A, LightInfo,
                         _FIELDS, LightKernel, operand_tma, output_tma)

MODES = {"M": 1, "K": 2, "list": 3}
CONFIGS = ("light_128x256", "light_128x128")
# Params' grouped fields (kernels/gemm/sm90_light_gemm.cu): groups_data, d_rows, groups, ldd, at the first
# 8-byte boundary after the GEMM's five ints.
GROUPED_FIELDS = (FIELDS + _FIELDS.size + 7) // 8 * 8
_GROUPED = struct.Struct("<QQii")
# The list form's table: a GroupEntry per group, the descriptors of A, B and D and then m, n, k.
ENTRY_BYTES = 448
ENTRY_A, ENTRY_B, ENTRY_D, ENTRY_SIZES = 0, 128, 256, 384
_SIZES = struct.Struct("<iii")


def config_for(n: int) -> str:
    """128 x 256 tiles, as CUTLASS's grouped kernel had them (its fastest of nine on the mixture of experts and on
    8 x 2048x4096x4096, grouped_gemm_plan.py), unless N fits one 128-wide tile."""
    return CONFIGS[1] if n <= 128 else CONFIGS[0]


def tile_n_of(config: str) -> int:
    return int(config.rsplit("x", 1)[1])


def request(kernel: Any, mode: str):
    """The build of a kernel class (grouped_gemm_plan.GemmKernelClass with a light configuration) for one form:
    'M' (ragged M or N), 'K' or 'list'.  A row-major A is K-major; a row-major B is MN-major."""
    return LIGHT_GEMM.bind(shapes.dtype_name(kernel.dtype), LIGHT_T=IN_TYPES[kernel.dtype], LIGHT_OUT=0,
                           LIGHT_TILE_N=tile_n_of(kernel.config), LIGHT_FUSED=0, LIGHT_A_KMAJOR=int(kernel.a_row),
                           LIGHT_B_KMAJOR=int(not kernel.b_row), LIGHT_PINGPONG=0, LIGHT_GROUPED=MODES[mode])


# ---- descriptors ----------------------------------------------------------------------------------------------
def stacked_operand_tma(kmajor: bool, rows: int, k: int, ld: int, step: int, groups: int, tile_n: int) -> TmaArgs:
    """B (G, K, N) of the ragged M form, group outermost: K-major, dims (K, N, G) and a box of one stage's tile;
    MN-major, dims (N, K, G) and 64 x 64 boxes (as operand_tma, one more dimension)."""
    if kmajor:
        return TmaArgs(TMA_UINT16, (k, rows, groups), (ld * 2, step * 2), (TILE_K, tile_n, 1), SWIZZLE_128B)
    return TmaArgs(TMA_UINT16, (rows, k, groups), (ld * 2, step * 2), (64, TILE_K, 1), SWIZZLE_128B)


def stacked_output_tma(m: int, n: int, groups: int) -> TmaArgs:
    """D (G, M, N) of the ragged K form, contiguous: dims (N, M, G), a 64-row by 128-byte box."""
    return TmaArgs(TMA_UINT16, (n, m, groups), (n * 2, m * n * 2), (64, STORE_ROWS, 1), SWIZZLE_128B)


class RaggedProblem(NamedTuple):
    mode: str       # "M" or "K"
    groups: int
    m: int          # ragged M: T; ragged K: M
    n: int
    k: int          # ragged M: K; ragged K: T
    lda: int
    ldb: int
    b_step: int     # ragged M: B's group stride (elements)
    ldd: int
    sm_count: int


def ragged_grid(p: RaggedProblem, tile_n: int) -> tuple[int, int, int]:
    """One persistent CTA an SM, never more than the units can be: ragged M has at most ceil(T / 128) + G tile
    rows (each group wastes at most one partial row)."""
    tiles_n = -(-p.n // tile_n)
    if p.mode == "M":
        units = (-(-p.m // TILE_M) + p.groups) * tiles_n
    else:
        units = p.groups * -(-p.m // TILE_M) * tiles_n
    return max(1, min(p.sm_count, units)), 1, 1


def pack_ragged(info: LightInfo, p: RaggedProblem, addresses: tuple[int, int, int, int], encode) -> bytearray:
    """Params of a ragged problem; addresses (A, B, D, offsets)."""
    a, b, d, offsets = addresses
    params = bytearray(info.params_size)
    _FIELDS.pack_into(params, FIELDS, 0, p.m, p.n, p.k, 0, GROUP_ROWS)
    _GROUPED.pack_into(params, GROUPED_FIELDS, offsets, d if p.mode == "M" else 0, p.groups, p.ldd)
    buffer = (ctypes.c_char * len(params)).from_buffer(params)
    if p.mode == "M":  # A (T, K) K-major; D stored by rows (its descriptor is valid, and unused)
        encode(buffer, TMA_A, operand_tma(True, p.m, p.k, p.lda, TILE_M), a)
        encode(buffer, info.tma_b, stacked_operand_tma(bool(info.b_kmajor), p.n, p.k, p.ldb, p.b_step, p.groups,
                                                       info.tile_n), b)
        encode(buffer, info.tma_d, output_tma(p.m, p.n, p.ldd, info.store_cols), d)
    else:  # A (M, T) and B (T, N), both MN-major
        encode(buffer, TMA_A, operand_tma(False, p.m, p.k, p.lda, TILE_M), a)
        encode(buffer, info.tma_b, operand_tma(False, p.n, p.k, p.ldb, info.tile_n), b)
        encode(buffer, info.tma_d, stacked_output_tma(p.m, p.n, p.groups), d)
    return params


def check_ragged(p: RaggedProblem, addresses: tuple[int, int, int, int]) -> None:
    """What the kernel assumes and the shape class already guarantees (TMA: 16-byte aligned operands and strides)."""
    if min(p.groups, p.m, p.n, p.k) < 1:
        raise ValueError(f"jitops.grouped_gemm (light sm_90a kernel): empty problem {p}")
    if p.n % 8 or p.lda % 8 or p.ldb % 8 or p.b_step % 8 or p.ldd % 8 or any(x % 16 for x in addresses[:3]):
        raise ValueError(f"jitops.grouped_gemm (light sm_90a kernel): N={p.n}, lda={p.lda}, ldb={p.ldb}, "
                         f"B's group step {p.b_step} and ldd={p.ldd} must be multiples of 8 and A, B and D 16-byte "
                         "aligned; this class should have copied its operands or taken the ATen loop")


class ListGroup(NamedTuple):
    """One launched product of the list form: D (m, n, row-major, ld n) = A (m, k) . B (k, n)."""
    m: int
    n: int
    k: int
    a: int
    lda: int
    b: int
    ldb: int
    d: int


def pack_table(info: LightInfo, groups: Sequence[ListGroup], encode) -> bytearray:
    """The list form's table: a GroupEntry per group."""
    table = bytearray(ENTRY_BYTES * len(groups))
    buffer = (ctypes.c_char * len(table)).from_buffer(table)
    for i, g in enumerate(groups):
        at = i * ENTRY_BYTES
        encode(buffer, at + ENTRY_A, operand_tma(bool(info.a_kmajor), g.m, g.k, g.lda, TILE_M), g.a)
        encode(buffer, at + ENTRY_B, operand_tma(bool(info.b_kmajor), g.n, g.k, g.ldb, info.tile_n), g.b)
        encode(buffer, at + ENTRY_D, output_tma(g.m, g.n, g.n, info.store_cols), g.d)
        _SIZES.pack_into(table, at + ENTRY_SIZES, g.m, g.n, g.k)
    return table


def list_grid(groups: Sequence[ListGroup], tile_n: int, sm_count: int) -> tuple[int, int, int]:
    units = sum(-(-g.m // TILE_M) * -(-g.n // tile_n) for g in groups)
    return max(1, min(sm_count, units)), 1, 1


# ---- the host object ------------------------------------------------------------------------------------------
class LightGrouped(LightKernel):
    """A light grouped kernel with its host side: `ragged(...)` and `list(...)` are one launch each (the light
    kernels' driver, lock and first-problem preparation are LightKernel's; the Params here are the grouped
    forms')."""

    def __init__(self, function: CudaFunction, info: LightInfo | None = None, driver: Any = None) -> None:
        super().__init__(function, info, driver)
        self._ragged: dict[RaggedProblem, tuple[PackedParams, list[int]]] = {}
        self._tables: dict[tuple, tuple[bytearray, list[int], PackedParams]] = {}

    def ragged(self, p: RaggedProblem, a: int, b: int, d: int, offsets: int, stream: int) -> None:
        addresses = [a, b, d, offsets]
        with self._lock:
            found = self._ragged.get(p)
            if found is None:
                check_ragged(p, (a, b, d, offsets))
                self._prepare()
                if len(self._ragged) >= 1024:
                    self._ragged.clear()
                params = pack_ragged(self.info, p, (a, b, d, offsets), self._driver.encode_into)
                found = self._ragged[p] = (PackedParams(params, ragged_grid(p, self.info.tile_n)), addresses)
            launch, old = found
            if addresses != old:
                if d % 16:
                    raise ValueError("jitops.grouped_gemm (light sm_90a kernel): the output must be 16-byte aligned")
                for offset, new, previous in zip((TMA_A, self.info.tma_b, self.info.tma_d), addresses, old):
                    if new != previous:
                        patch_descriptor(self._driver, launch.params, launch.address, offset,
                                         self._driver.address_field, new)
                _GROUPED.pack_into(launch.params, GROUPED_FIELDS, offsets, d if p.mode == "M" else 0, p.groups,
                                   p.ldd)
                found[1][:] = addresses
            self._driver.launch(self.function, launch.grid, self.info.threads, self.info.smem, stream,
                                launch.kernel_params_address)

    def list(self, groups: Sequence[ListGroup], device: torch.device, sm_count: int, stream: int) -> None:
        """One launch over `groups`.  The table goes to the device through pinned memory on the launch's stream
        (torch's current stream), so it needs no wait; the device copy lives until the kernel has read it (the
        caching allocator reuses it only behind it on that stream).  A size pattern's table and Params are packed
        once; a call patches the addresses that moved and the table's device address."""
        sizes = tuple((g.m, g.n, g.k, g.lda, g.ldb) for g in groups)
        addresses = [x for g in groups for x in (g.a, g.b, g.d)]
        with self._lock:
            found = self._tables.get((sizes, sm_count))
            if found is None:
                for g in groups:
                    check_ragged(RaggedProblem("list", 1, g.m, g.n, g.k, g.lda, g.ldb, 8, g.n, sm_count),
                                 (g.a, g.b, g.d, 0))
                self._prepare()
                if len(self._tables) >= 256:
                    self._tables.clear()
                params = bytearray(self.info.params_size)
                _FIELDS.pack_into(params, FIELDS, 0, 0, 0, 0, 0, GROUP_ROWS)
                found = self._tables[(sizes, sm_count)] = (
                    pack_table(self.info, groups, self._driver.encode_into), addresses,
                    PackedParams(params, list_grid(groups, self.info.tile_n, sm_count)))
            table, old, launch = found
            if addresses != old:
                if any(g.d % 16 for g in groups):  # checked before any patch: the table stays whole
                    raise ValueError("jitops.grouped_gemm (light sm_90a kernel): the outputs must be 16-byte aligned")
                view = (ctypes.c_char * len(table)).from_buffer(table)
                base = ctypes.addressof(view)
                for i, (new, previous) in enumerate(zip(addresses, old)):
                    if new != previous:
                        patch_descriptor(self._driver, table, base,
                                         (i // 3) * ENTRY_BYTES + (ENTRY_A, ENTRY_B, ENTRY_D)[i % 3],
                                         self._driver.address_field, new)
                del view
                found[1][:] = addresses
            # pin_memory inside host_to_device copies the table: it may change next call
            table_device = host_to_device(torch.frombuffer(table, dtype=torch.uint8), device)
            _GROUPED.pack_into(launch.params, GROUPED_FIELDS, table_device.data_ptr(), 0, len(groups), 0)
            self._driver.launch(self.function, launch.grid, self.info.threads, self.info.smem, stream,
                                launch.kernel_params_address)


def host(kernel: Any) -> LightGrouped:
    """The host side of a loaded light grouped kernel, made once and kept on it."""
    found = kernel.__dict__.get("light_grouped_host")
    if found is None:
        found = kernel.__dict__.setdefault("light_grouped_host", LightGrouped(kernel))
    return found


__all__ = ["CONFIGS", "ListGroup", "LightGrouped", "MODES", "RaggedProblem", "config_for", "host", "pack_ragged",
           "pack_table", "request", "stacked_operand_tma", "stacked_output_tma", "tile_n_of"]
