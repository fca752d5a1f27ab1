"""jitops.grouped_gemm's launch code: operand copies, the light kernels' launches (jitops/light_grouped.py), the
calls into the CUTLASS grouped GEMM library (its workspace, error strings, tile order) and the ATen loop over
groups for the CPU and for shapes the kernels cannot read.  Declarations and shape classes are in
jitops/ops/grouped_gemm.py, the plan in grouped_gemm_plan.py.
"""
from __future__ import annotations

import ctypes
from typing import Any, Sequence

import torch

from .. import light_grouped
from ..config import config
from ..launch import current_stream, host_to_device, sm_count
from .grouped_gemm_plan import (ALIGN_BYTES, COL, LIST_SWIZZLE, NOTHING, ROW, SCHEDULE, ListClass, RaggedClass,
                                _leading, _tiling)

OFFSET_DTYPES = (torch.int32, torch.int64)


def _copy_to(t: torch.Tensor, layout: str) -> torch.Tensor:
    """A copy in ROW (contiguous) or COL (transposed-contiguous) layout, for matrices and stacks of them."""
    return t.contiguous() if layout == ROW else t.mT.contiguous().mT


def _check_call(lib: Any, status: int, what: str) -> None:
    if status:
        message = ctypes.string_at(lib.jg_error_string(status)).decode()
        raise RuntimeError(f"jitops.grouped_gemm: the CUTLASS grouped GEMM failed ({what}): {message} "
                           f"(code {status})")


_WORKSPACE: dict[tuple[int, int, int], int] = {}


def _workspace(lib: Any, groups: int, device_index: int) -> tuple[torch.Tensor, int]:
    sms = sm_count(device_index)
    key = (id(lib), groups, sms)
    size = _WORKSPACE.get(key)
    if size is None:
        size = _WORKSPACE[key] = int(lib.jg_workspace_bytes(groups, sms))
    return torch.empty(size, dtype=torch.uint8, device=torch.device("cuda", device_index)), size


# ---- ragged form ---------------------------------------------------------------------------------------------
MODES = {"M": 0, "K": 1}  # ragged N runs as ragged M on the transposed problem


def _check_offsets_dtype(offsets: torch.Tensor) -> None:
    # Not in the shape class: manifest items (JITOPS_RECORD, prewarm) give every tensor of a call one dtype.
    if offsets.dtype not in OFFSET_DTYPES:
        raise TypeError(f"jitops.grouped_gemm: argument 'offsets' has dtype "
                        f"{str(offsets.dtype).removeprefix('torch.')}; use int32 or int64")


def _ragged_out(a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor, mode: str) -> torch.Tensor:
    if mode == "M":
        return torch.empty((a.shape[0], b.shape[2]), dtype=a.dtype, device=a.device)
    if mode == "K":
        return torch.empty((offsets.shape[0], a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
    return torch.empty((b.shape[1], a.shape[1]), dtype=a.dtype, device=a.device).mT


def _group_bounds(offsets: torch.Tensor, total: int, name: str = "offsets") -> list[tuple[int, int]]:
    """[(start, end)] per group from host offsets, validated: non-decreasing, >= 0, last == total."""
    values = offsets.tolist()
    bounds, start = [], 0
    for g, end in enumerate(values):
        if end < start:
            raise ValueError(f"jitops.grouped_gemm: argument '{name}' decreases at group {g} "
                             f"({start} -> {end}); offsets are cumulative group ends and must not decrease")
        bounds.append((start, end))
        start = end
    if start != total:
        must = "the sizes must add up to it" if name == "sizes" else "offsets[-1] must equal it"
        raise ValueError(f"jitops.grouped_gemm: argument '{name}' does not add up: the groups end at {start} "
                         f"but the ragged dimension has {total} ({must})")
    return bounds


def _ragged_aten(a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor, mode: str) -> torch.Tensor:
    """The ATen loop over groups (CPU, and shapes the kernel cannot read).  Reads the offsets on the host."""
    out = _ragged_out(a, b, offsets, mode)
    if mode == "M":
        for g, (s, e) in enumerate(_group_bounds(offsets, a.shape[0])):
            torch.mm(a[s:e], b[g], out=out[s:e])
    elif mode == "K":
        for g, (s, e) in enumerate(_group_bounds(offsets, a.shape[1])):
            torch.mm(a[:, s:e], b[s:e], out=out[g])
    else:
        for g, (s, e) in enumerate(_group_bounds(offsets, b.shape[1])):
            out[:, s:e] = torch.mm(a[g], b[:, s:e])
    return out


def run_ragged_cpu(k, a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    _check_offsets_dtype(offsets)
    return _ragged_aten(a, b, offsets, k.shape_class.mode)


def run_ragged_cuda(k, a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    cls: RaggedClass = k.shape_class
    if offsets.dtype is not torch.int32:
        _check_offsets_dtype(offsets)
    lib = getattr(k, "gemm", None)
    light = getattr(k, "light", None)
    if cls.kernel.config == NOTHING:
        return _ragged_out(a, b, offsets, cls.mode).zero_()
    if lib is None and light is None:
        return _ragged_aten(a, b, offsets, cls.mode)
    out = _ragged_out(a, b, offsets, cls.mode)
    if cls.mode == "N":  # out (M, T) is the transposed view of d (T, M) = bᵀ @ aᵀ
        a, b, d, mode = b.mT, a.mT, out.mT, "M"
    else:
        d, mode = out, cls.mode
    if cls.copy_a is not None:
        a = _copy_to(a, cls.copy_a)
    if cls.copy_b is not None:
        b = _copy_to(b, cls.copy_b)
    elements = ALIGN_BYTES // a.element_size()
    kernel = cls.kernel
    layout_a = ROW if kernel.a_row else COL
    layout_b = ROW if kernel.b_row else COL
    groups = offsets.shape[0]
    if mode == "M":  # a (T, K) ragged rows, b (G, K, N), d (T, N)
        total, kk = a.shape
        m, n = 0, b.shape[2]
        a_ld = _leading(a, ROW, elements)
        a_step, b_step, b_ld = a_ld, b.stride(0), _leading(b, layout_b, elements)
        d_ld = d_step = n
        fill = 1
    else:  # a (M, T) ragged columns, b (T, N) ragged rows, d (G, M, N)
        m, total = a.shape
        n, kk = b.shape[1], 0
        a_ld = a_step = _leading(a, COL, elements)
        b_ld = b_step = _leading(b, ROW, elements)
        d_ld, d_step = n, m * n
        fill = min(max(m * n // 65536, 1), 16)
    if offsets.dtype != torch.int32:
        offsets = offsets.to(torch.int32)
    offsets = offsets.contiguous()
    device_index = a.get_device()
    if light is not None:
        if mode == "M" and groups > 1 and b_step == 0:  # a broadcast weight: TMA takes no zero stride
            b = _copy_to(b, layout_b)
            b_step = b.stride(0)
        if mode == "M" and b.shape[0] == 1:  # a lone group's step is never taken; TMA wants a plausible one
            b_step = b_ld * (b.shape[1] if layout_b == ROW else b.shape[2])  # ld times the outer extent
        problem = light_grouped.RaggedProblem(
            mode, groups, total if mode == "M" else m, n, kk if mode == "M" else total, a_ld, b_ld,
            b_step if mode == "M" else 0, d_ld, sm_count(device_index))
        light_grouped.host(light).ragged(problem, a.data_ptr(), b.data_ptr(), d.data_ptr(), offsets.data_ptr(),
                                         current_stream(device_index))
        return out
    workspace, size = _workspace(lib, groups, device_index)
    raster, swizzle = config.grouped_gemm_schedule or SCHEDULE
    status = lib.jg_run_ragged(MODES[mode], groups, offsets, total, m, n, kk, a, a_step, a_ld, b, b_step, b_ld,
                               d, d_step, d_ld, workspace, size, sm_count(device_index), fill, raster, swizzle,
                               current_stream(device_index))
    _check_call(lib, status, f"ragged {cls.mode}, {groups} groups, layouts {layout_a}/{layout_b}")
    return out


# ---- list form -----------------------------------------------------------------------------------------------
def run_list_cpu(k, As: Sequence[torch.Tensor], Bs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [torch.mm(a, b) for a, b in zip(As, Bs)]


def run_list_cuda(k, As: Sequence[torch.Tensor], Bs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    cls: ListClass = k.shape_class
    kernel = cls.kernel
    lib = getattr(k, "gemm", None)
    light = getattr(k, "light", None)
    if lib is None and light is None:  # ATen loop, or nothing to launch (every product is empty or has K = 0)
        return [torch.mm(a, b) for a, b in zip(As, Bs)]
    layout_a = ROW if kernel.a_row else COL
    layout_b = ROW if kernel.b_row else COL
    elements = ALIGN_BYTES // As[0].element_size()
    device = As[0].device
    outs, launched, keep = [], [], []
    for i, (a, b) in enumerate(zip(As, Bs)):
        (m, kk), n = a.shape, b.shape[1]
        out = torch.empty((m, n), dtype=a.dtype, device=device)
        outs.append(out)
        if m == 0 or n == 0:
            continue
        if kk == 0:
            out.zero_()
            continue
        if cls.copy_a[i]:
            a = _copy_to(a, layout_a)
            keep.append(a)
        if cls.copy_b[i]:
            b = _copy_to(b, layout_b)
            keep.append(b)
        launched.append(light_grouped.ListGroup(m, n, kk, a.data_ptr(), _leading(a, layout_a, elements), b.data_ptr(),
                                                _leading(b, layout_b, elements), out.data_ptr()))
    if not launched:
        return outs
    device_index = As[0].get_device()
    if light is not None:
        light_grouped.host(light).list(launched, device, sm_count(device_index), current_stream(device_index))
        return outs
    # CUTLASS's library: a row of 9 int64 per group (ldd = n); swizzle by LIST_SWIZZLE only where every group's
    # tile counts are multiples of LIST_SWIZZLE x cluster (nothing padded).
    tile_m, tile_n, cluster_m, cluster_n = _tiling(kernel.config)
    pad_free = all(-(-g.m // tile_m) % (LIST_SWIZZLE * cluster_m) == 0 and
                   -(-g.n // tile_n) % (LIST_SWIZZLE * cluster_n) == 0 for g in launched)
    host = torch.tensor([x for g in launched for x in (*g, g.n)], dtype=torch.int64)  # read on the host too
    rows_device = host_to_device(host, device)
    groups = len(launched)
    workspace, size = _workspace(lib, groups, device_index)
    raster, swizzle = config.grouped_gemm_schedule or ((SCHEDULE[0], LIST_SWIZZLE) if pad_free else SCHEDULE)
    status = lib.jg_run_list(groups, rows_device, host, workspace, size, sm_count(device_index), raster,
                             swizzle, current_stream(device_index))
    _check_call(lib, status, f"list of {groups} groups, layouts {layout_a}/{layout_b}")
    return outs
