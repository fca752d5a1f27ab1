"""How jitops.grouped_gemm picks its kernel: the light kernel's tiles (the default), CUTLASS's tile configurations
and tile orders measured on the H100, the shape classes' kernel facts (dtype, operand layouts, configuration), and
the layout rules that decide, per operand, whether the kernel reads it as it is, reads a copy, or cannot (then the
ATen loop runs).

Pure: the shape classes in jitops/ops/grouped_gemm.py call these.  Benchmarks force a configuration or a tile
order with config.scope(grouped_gemm_config=..., grouped_gemm_schedule=...) (jitops/config.py).
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

from .. import shapes
from ..config import config

ALIGN_BYTES = 16  # TMA: addresses and leading dimensions 16-byte aligned

# Tile configurations: structs in grouped_gemm.cu.  One is used: each configuration is a ~50 s nvcc compile per
# (dtype, layout of A, layout of B), and on the H100 (bench_grouped_gemm.py --sweep-only) the
# 128x256 cooperative tile with a 2x1 cluster was the fastest of nine on the mixture-of-experts case (291
# TFLOP/s; 64x256 ping-pong 290, 256x128 1x2 287, 128x128 277) and on 8 x 2048x4096x4096 (648-670; 256x128
# 1x2 639-655, 128x256 1x1 643).  With one configuration the mixture-of-experts forward, dx and dW and the
# list form's forward, dA and dB share three kernels.  The others stay for the sweep.
DEFAULT = "coop_128x256x64_c2x1"
CONFIGS = (DEFAULT, "coop_128x128x64_c1x1", "pong_64x128x64_c1x1", "coop_128x128x64_c1x2", "pong_128x128x64_c1x1",
           "coop_256x128x64_c1x1", "coop_256x128x64_c1x2", "coop_128x256x64_c1x1", "pong_64x256x64_c1x1")
# The light kernel's configurations (jitops/light_grouped.py, JITOPS_GROUPED_GEMM_SM90_KERNEL=light, the default):
# 128 x 256 tiles, the shape of CUTLASS's fastest configuration above, or 128 x 128 where N fits one such tile.
LIGHT_CONFIGS = ("light_128x256", "light_128x128")
ATEN = "aten"                    # no kernel: ATen loop (CPU, GPUs other than Hopper, shapes TMA cannot read)
NOTHING = "nothing"              # no kernel: the result is empty or zeros

# Tile order inside each group: (raster, swizzle), raster 0 = M tiles first, 1 = N tiles first.  M first was
# faster for every configuration on the mixture-of-experts case (the M tiles of one expert's N tile share its
# weight panel).  Swizzle s pads each group's M and N tile counts up to multiples of s x cluster (CUTLASS's group
# scheduler), which costs idle tiles on small groups, so the list form swizzles by 4 (648 -> 670 TFLOP/s on 8 x
# 2048x4096x4096 in the sweep) only where that pads nothing.
SCHEDULE = (0, 1)
LIST_SWIZZLE = 4
# Benchmarks time one configuration or tile order against another with config.scope(grouped_gemm_config=...,
# grouped_gemm_schedule=...) (jitops/config.py); unset, the rules above pick.

ROW, COL = "row", "col"


class GemmKernelClass(NamedTuple):
    """What a compiled grouped GEMM is specialized on."""
    dtype: torch.dtype
    a_row: bool     # A row-major (K contiguous), else column-major (M contiguous)
    b_row: bool     # B row-major (N contiguous), else column-major (K contiguous)
    config: str     # a tile configuration, or ATEN


def _config(n: int) -> str:
    """The kernel configuration for an output N columns wide (the list form: its widest)."""
    forced = config.grouped_gemm_config
    if forced is None:
        if config.grouped_gemm_sm90_kernel == "light":
            return LIGHT_CONFIGS[1] if n <= 128 else LIGHT_CONFIGS[0]
        return DEFAULT
    if forced not in CONFIGS + LIGHT_CONFIGS:
        raise ValueError(f"jitops.grouped_gemm: config.grouped_gemm_config is {forced!r}, which is no configuration "
                         f"of the light kernel ({', '.join(LIGHT_CONFIGS)}) or of kernels/grouped_gemm/grouped_gemm.cu "
                         f"({', '.join(CONFIGS)})")
    return forced


def is_light(config_name: str) -> bool:
    return config_name in LIGHT_CONFIGS


_TILINGS: dict[str, tuple[int, int, int, int]] = {}


def _tiling(name: str) -> tuple[int, int, int, int]:
    """(tile M, tile N, cluster M, cluster N) from a configuration's name, e.g. coop_128x256x64_c2x1."""
    tiling = _TILINGS.get(name)
    if tiling is None:
        _, tile, cluster = name.split("_")
        tile_m, tile_n, _ = (int(v) for v in tile.split("x"))
        cluster_m, cluster_n = (int(v) for v in cluster[1:].split("x"))
        tiling = _TILINGS[name] = (tile_m, tile_n, cluster_m, cluster_n)
    return tiling


# ---- layouts -------------------------------------------------------------------------------------------------
def _pad(n: int, elements: int) -> int:
    return max((n + elements - 1) // elements * elements, elements)


def _leading_dim(layout: str, rows: int, cols: int, s_rows: int, s_cols: int, elements: int) -> int | None:
    """The leading dimension with which the kernel reads a (rows, cols) matrix with these strides in `layout`
    (ROW: cols contiguous; COL: rows contiguous), or None if it cannot.  A dimension of extent 1 has no
    meaningful stride: it gets a padded one."""
    if layout == ROW:
        if (s_cols == 1 or cols <= 1) and (rows <= 1 or s_rows >= cols):
            return s_rows if rows > 1 else _pad(cols, elements)
        return None
    if (s_rows == 1 or rows <= 1) and (cols <= 1 or s_cols >= rows):
        return s_cols if cols > 1 else _pad(rows, elements)
    return None


def _as_is(t: torch.Tensor, rows: int, cols: int, elements: int, grouped: bool = False) -> tuple[str, ...]:
    """The layouts in which the kernel reads `t` (a matrix, or a stack of them if `grouped`) without a copy:
    16-byte aligned start, leading dimension, group step and contiguous extent."""
    s = t.stride()
    if shapes._address(t) % ALIGN_BYTES or grouped and t.shape[0] > 1 and s[0] % elements:
        return ()
    readable = []
    for layout in (ROW, COL):
        ld = _leading_dim(layout, rows, cols, s[-2], s[-1], elements)
        if ld is not None and ld % elements == 0 and (cols if layout == ROW else rows) % elements == 0:
            readable.append(layout)
    return tuple(readable)


def _decide(readable: Sequence[tuple[str, ...] | None], copyable: dict[str, bool],
            required: str | None = None) -> tuple[str | None, tuple[bool, ...]]:
    """One layout for an operand of every group (None marks a group that is not launched), and which groups
    must be copied to it: a layout every group has as is, else one every group can be copied to (a copy's
    contiguous extent must be a multiple of 16 bytes).  `required` fixes the layout: a ragged operand's
    ragged dimension must be the strided one.  (None, ()) if no layout works."""
    candidates = (required,) if required else (ROW, COL)
    for layout in candidates:
        if all(r is None or layout in r for r in readable):
            return layout, (False,) * len(readable)
    for layout in candidates:
        if copyable[layout]:
            return layout, tuple(r is not None and layout not in r for r in readable)
    return None, ()


def _leading(t: torch.Tensor, layout: str, elements: int) -> int:
    s = t.stride()
    ld = _leading_dim(layout, t.shape[-2], t.shape[-1], s[-2], s[-1], elements)
    assert ld is not None, "the shape class promised this layout"
    return ld


# ---- the shape classes: the kernel, and which operands are copied to its layouts ------------------------------
class RaggedClass(NamedTuple):
    mode: str                 # "M", "K" or "N"
    kernel: GemmKernelClass
    copy_a: str | None        # layout to copy the kernel's A operand to, if any
    copy_b: str | None


class ListClass(NamedTuple):
    kernel: GemmKernelClass
    copy_a: tuple[bool, ...]   # per group: copy A_i to the kernel's layout
    copy_b: tuple[bool, ...]
