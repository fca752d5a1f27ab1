"""jitops.layer_norm's launch code: the forward and backward launches on CUDA (grids from the occupancy of
each kernel), the C++ kernels on the CPU, and torch's own implementation, which runs while the kernels compile.
Declarations, shape classes and kernel specs are in jitops/ops/layer_norm.py, the buckets in layer_norm_plan.py.
"""
from __future__ import annotations

import math

import torch

from .. import native
from ..config import config
from ..launch import UNCAPPED_GRID, sm_count
from .layer_norm_plan import CPU_COMPUTE, _threads

FORWARD_BLOCKS_PER_SM = 16  # grid cap of the (grid-stride) forward, in blocks per SM
REDUCE_ROWS = 16            # kernels/layer_norm.cu: layer_norm_reduce_partials threads down a column
COLUMN_THREADS = 128        # kernels/layer_norm.cu: layer_norm_backward_columns block
STATS_DTYPE = {torch.float32: torch.float32, torch.float16: torch.float32, torch.bfloat16: torch.float32,
               torch.float64: torch.float64}


def _cpu_operand(t, compute: torch.dtype):
    """t as the CPU kernel reads it: contiguous, in the compute dtype.  Asked first, since a no-op .to() still
    costs 0.9 us and a no-op .contiguous() 0.1 us a call on the dev box (three operands a call)."""
    if t is None:
        return None
    if not t.is_contiguous():
        t = t.contiguous()
    return t if t.dtype is compute else t.to(compute)


def _rows(x: torch.Tensor, n: int, k: int) -> int:
    return x.numel() // n if n else math.prod(x.shape[:x.dim() - k])


def _row_length_unchecked(normalized_shape) -> int:
    return normalized_shape[0] if len(normalized_shape) == 1 else math.prod(normalized_shape)


def _forward_cuda(k, x: torch.Tensor, normalized_shape, weight, bias, eps: float, save_stats: bool):
    """y, and the statistics if save_stats (else None: the kernel skips writing them)."""
    cls = k.shape_class
    if not x.is_contiguous():
        x = x.contiguous()
    if weight is not None and not weight.is_contiguous():
        weight = weight.contiguous()
    if bias is not None and not bias.is_contiguous():
        bias = bias.contiguous()
    if len(normalized_shape) == 1:
        n = normalized_shape[0]
        rows = x.numel() // n if n else _rows(x, n, 1)
    else:
        n = math.prod(normalized_shape)
        rows = _rows(x, n, len(normalized_shape))
    y = torch.empty_like(x)
    stats = x.new_empty((2, rows), dtype=STATS_DTYPE[cls.dtype]) if save_stats else None
    if rows and n:
        tpr = cls.tpr
        threads = tpr if tpr > 128 else 128  # _threads(tpr), inline
        grid = -(-rows // (threads // tpr))
        if grid > UNCAPPED_GRID:
            cap = config.layer_norm_tuning.get("forward_blocks_per_sm", FORWARD_BLOCKS_PER_SM)
            grid = min(grid, sm_count(x.get_device()) * cap)
        k.forward.launch(grid, threads, x, weight, bias, y, stats, rows, n, eps)
    return y, stats


# ---- offers to the C++ host path (jitops/native.py, kernels/host/layer_norm.h) ----------------------------------
# A call's tensors in the order of layer_norm.h's ForwardSlot and BackwardSlot.
_FORWARD, _INFERENCE, _BACKWARD = 0, 1, 2  # layer_norm.h's LayerNormStage
_offers = native.Offers()
_host = native.host


def _offerable(tensors) -> bool:
    """The C++ path replays a recording on the call's own tensors: it may only record calls that copied none of
    them (a copy would be taken for a workspace) and had rows to launch for."""
    return all(t is None or t.is_contiguous() for t in tensors)


def _alignment(tensors) -> int:
    address = 0
    for t in tensors:
        if t is not None:
            address |= t.data_ptr()
    return address & 15


def forward_offered(k, x: torch.Tensor, normalized_shape, weight, bias, eps: float, save_stats: bool,
                    rms: bool = False):
    """_forward_cuda, recorded and offered to the C++ host path the first time its problem runs (once the
    extension is loaded)."""
    module = _host.module
    if module is None:
        _host.start()
    elif len(normalized_shape) == 1 and x.numel() and normalized_shape[0] and _offerable((x, weight, bias)):
        stage, n = (_FORWARD if save_stats else _INFERENCE), normalized_shape[0]
        key = (stage, x.get_device(), x.dtype, x.numel() // n, n, weight is not None, bias is not None,
               _alignment((x, weight, bias)), eps, rms)
        (y, stats), recording = native.run_recorded_once(_offers, key, k, _forward_cuda, x, normalized_shape,
                                                           weight, bias, eps, save_stats)
        if recording is not None:
            native.offer_recording(module.offer_layer_norm, recording, (x, weight, bias, y, stats), stage, x,
                                   key[3], n, key[5], key[6], key[7], eps, False, False, False, rms)
        return y, stats
    return _forward_cuda(k, x, normalized_shape, weight, bias, eps, save_stats)


def run_cuda(k, x: torch.Tensor, normalized_shape, weight, bias, eps: float, rms: bool = False):
    return forward_offered(k, x, normalized_shape, weight, bias, eps, True, rms)


def run_cpu(k, x: torch.Tensor, normalized_shape, weight, bias, eps: float, rms: bool = False):
    dtype, compute = x.dtype, CPU_COMPUTE[x.dtype]
    x, weight, bias = _cpu_operand(x, compute), _cpu_operand(weight, compute), _cpu_operand(bias, compute)
    n = _row_length_unchecked(normalized_shape)
    rows = _rows(x, n, len(normalized_shape))
    y = torch.empty_like(x)
    stats = x.new_empty((2, rows), dtype=STATS_DTYPE[dtype])
    if rows and n:
        k.cpu.layer_norm_forward(x, weight, bias, y, stats, rows, n, eps, int(rms))
    return (y if dtype is compute else y.to(dtype)), stats


def torch_forward(k, x: torch.Tensor, normalized_shape, weight, bias, eps: float, rms: bool = False):
    """(y, stats) through ATen, stats laid out as the kernels write them: background mode's fallback."""
    if rms:
        dims = tuple(range(x.dim() - len(normalized_shape), x.dim()))
        rstd = torch.rsqrt(x.to(STATS_DTYPE[x.dtype]).square().mean(dims) + eps)
        y = torch.nn.functional.rms_norm(x, list(normalized_shape), weight, eps)
        return y.contiguous(), torch.stack((torch.zeros_like(rstd).reshape(-1), rstd.reshape(-1)))
    y, mean, rstd = torch.native_layer_norm(x, list(normalized_shape), weight, bias, eps)
    stats = torch.stack((mean.reshape(-1), rstd.reshape(-1))).to(STATS_DTYPE[x.dtype])
    return y.contiguous(), stats


_OCCUPANCY: dict[tuple[int, int, int], int] = {}


def _grad_outputs(x: torch.Tensor, normalized_shape, need_dx: bool, need_dweight: bool, need_dbias: bool):
    """dx, dweight, dbias for the backward kernels to fill; an empty tensor where a gradient is not needed."""
    return (torch.empty_like(x) if need_dx else x.new_empty((0,)),
            x.new_empty(normalized_shape) if need_dweight else x.new_empty((0,)),
            x.new_empty(normalized_shape) if need_dbias else x.new_empty((0,)))


def _blocks_per_sm(kernel, threads: int, shared_mem: int) -> int:
    """The backward's persistent grid is this times the SM count: one wave, every block summing many rows."""
    key = (kernel.handle, threads, shared_mem)
    blocks = _OCCUPANCY.get(key)
    if blocks is None:
        blocks = _OCCUPANCY[key] = max(1, kernel.max_active_blocks(threads, shared_mem))
    return blocks


def run_backward_cuda(k, grad: torch.Tensor, x: torch.Tensor, stats: torch.Tensor, weight, normalized_shape,
                      need_dx: bool, need_dweight: bool, need_dbias: bool, rms: bool = False):
    """The backward's launches; recorded and offered to the C++ host path the first time its problem runs (once
    the extension is loaded)."""
    module = _host.module
    if module is not None and len(normalized_shape) == 1 and x.numel() and normalized_shape[0] and \
            _offerable((grad, x, stats, weight)):
        n = normalized_shape[0]
        key = (_BACKWARD, x.get_device(), x.dtype, x.numel() // n, n, weight is not None,
               _alignment((grad, x, weight)), need_dx, need_dweight, need_dbias, rms)
        (dx, dw, db), recording = native.run_recorded_once(_offers, key, k, _backward_cuda, grad, x, stats, weight,
                                                             normalized_shape, need_dx, need_dweight, need_dbias)
        if recording is not None:
            native.offer_recording(module.offer_layer_norm, recording, (grad, x, stats, weight, dx, dw, db),
                                   _BACKWARD, x, key[3], n, key[5], False, key[6], 0.0, need_dx, need_dweight,
                                   need_dbias, rms)
        return dx, dw, db
    return _backward_cuda(k, grad, x, stats, weight, normalized_shape, need_dx, need_dweight, need_dbias)


def _backward_cuda(k, grad: torch.Tensor, x: torch.Tensor, stats: torch.Tensor, weight, normalized_shape,
                   need_dx: bool, need_dweight: bool, need_dbias: bool):
    cls = k.shape_class
    if not grad.is_contiguous():
        grad = grad.contiguous()
    if not x.is_contiguous():
        x = x.contiguous()
    if weight is not None and not weight.is_contiguous():
        weight = weight.contiguous()
    n = _row_length_unchecked(normalized_shape)
    rows = _rows(x, n, len(normalized_shape))
    dx, dw, db = _grad_outputs(x, normalized_shape, need_dx, need_dweight, need_dbias)
    params = need_dweight or need_dbias
    if not rows or not n:
        if params:  # sums over no rows
            dw.zero_()
            db.zero_()
        return dx, dw, db
    device = x.get_device()
    threads = _threads(cls.tpr)
    rpb = threads // cls.tpr
    fused = params and cls.params in (1, 2)  # dweight/dbias summed by the main kernel
    partial, parts = None, 0
    if need_dx or fused:
        shared = 2 * rpb * n * stats.element_size() if fused and (cls.params == 2 or rpb > 1) else 0
        grid = min(-(-rows // rpb), sm_count(device) * _blocks_per_sm(k.backward, threads, shared))
        direct = fused and grid == 1  # one block: it writes dweight/dbias itself, no second kernel
        if fused and not direct:
            parts = grid
            partial = x.new_empty((2, parts, n), dtype=stats.dtype)
        k.backward.launch(grid, threads, grad, x, stats, weight, dx if need_dx else None, partial,
                          dw if direct and need_dweight else None, db if direct and need_dbias else None, rows, n,
                          shared_mem=shared)
    if params and cls.params == 3:
        k.param_grads.launch(-(-n // 32), 32 * REDUCE_ROWS, grad, x, stats, dw if need_dweight else None,
                             db if need_dbias else None, rows, n)
        return dx, dw, db
    if params and not cls.params:
        column_blocks = -(-(n // cls.vec) // COLUMN_THREADS)
        parts = max(1, min(rows, 65535, -(-4 * sm_count(device) // column_blocks)))
        rows_per_part = -(-rows // parts)
        parts = -(-rows // rows_per_part)
        partial = x.new_empty((2, parts, n), dtype=stats.dtype)
        k.columns.launch((column_blocks, parts), COLUMN_THREADS, grad, x, stats, partial, rows, n, rows_per_part)
    if partial is not None:
        k.reduce.launch(-(-n // 32), 32 * REDUCE_ROWS, partial, dw if need_dweight else None,
                        db if need_dbias else None, parts, n)
    return dx, dw, db


def run_backward_cpu(k, grad: torch.Tensor, x: torch.Tensor, stats: torch.Tensor, weight, normalized_shape,
                     need_dx: bool, need_dweight: bool, need_dbias: bool, rms: bool = False):
    dtype, compute = x.dtype, CPU_COMPUTE[x.dtype]
    grad, x, weight = _cpu_operand(grad, compute), _cpu_operand(x, compute), _cpu_operand(weight, compute)
    if not stats.is_contiguous():
        stats = stats.contiguous()
    n = _row_length_unchecked(normalized_shape)
    rows = _rows(x, n, len(normalized_shape))
    dx, dw, db = _grad_outputs(x, normalized_shape, need_dx, need_dweight, need_dbias)
    if rows and n:
        k.cpu.layer_norm_backward(grad, x, stats, weight, dx if need_dx else None, dw if need_dweight else None,
                                  db if need_dbias else None, rows, n, int(rms))
    elif need_dweight or need_dbias:
        dw.zero_()
        db.zero_()
    if dtype is compute:
        return dx, dw, db
    return dx.to(dtype), dw.to(dtype), db.to(dtype)


def torch_backward(k, grad: torch.Tensor, x: torch.Tensor, stats: torch.Tensor, weight, normalized_shape,
                   need_dx: bool, need_dweight: bool, need_dbias: bool, rms: bool = False):
    """The backward through torch ops from the saved statistics, in their precision: background mode's
    fallback."""
    dims = len(normalized_shape)
    lead = x.dim() - dims
    row_dims, norm_dims = tuple(range(lead)), tuple(range(lead, x.dim()))
    view = (*x.shape[:lead], *([1] * dims))
    mean, rstd = stats[0].reshape(view), stats[1].reshape(view)
    g = grad.to(stats.dtype)
    xhat = (x.to(stats.dtype) - mean) * rstd
    empty = x.new_empty((0,))
    dw = (g * xhat).sum(row_dims).to(x.dtype) if need_dweight else empty
    db = g.sum(row_dims).to(x.dtype) if need_dbias else empty
    dx = empty
    if need_dx:
        gw = g * weight.to(stats.dtype) if weight is not None else g
        centred = gw if rms else gw - gw.mean(norm_dims, keepdim=True)  # rms: the mean is 0
        dx = rstd * (centred - xhat * (gw * xhat).mean(norm_dims, keepdim=True))
        dx = dx.to(x.dtype).contiguous()
    return dx, dw, db
