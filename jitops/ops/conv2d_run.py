"""jitops.conv2d's launch code: layouts (NHWC views, channel padding, im2col matrices), the calls into the
CUTLASS conv library, strided dgrad phases on side streams, the wgrad reduction, and the patchify route (a conv
over non-overlapping patches as one jitops.linear call).  The op's declarations,
shape classes and kernel specs are in jitops/ops/conv2d.py, the plans in jitops/ops/conv2d_plan.py.
"""
from __future__ import annotations

import torch

from .. import light_conv, native, shapes
from ..config import config
from ..launch import SideStreams, current_stream, sm_count
from ..op import dispatcher_wanted
from .conv2d_plan import (IM2COL_SHARED_BYTES, REDUCE_BLOCK, TILE_K, ConvClass, _ceil, _fold_matrix, _geometry,
                          _im2col_shared_bytes, dgrad_phases, normalize_splits, output_size, round_up)
from .linear import linear

CHANNELS_LAST = torch.channels_last
_STATUS = {1: "the kernel cannot implement this problem (CUTLASS can_implement)",
           2: "the kernel launch failed", 3: "raising the kernel's shared-memory limit failed"}


# ---- the CUTLASS conv library's entry point ---------------------------------------------------------------------
def _call(library, op_name: str, a, b, d, bias, *args) -> None:
    # The library's function is generated for its declared C signature (launch.host_function): tensors pass
    # their data pointer with no per-argument loop, so a bare ctypes handle of its own is not needed.  A light
    # kernel (the default; a CudaFunction, no library) takes the same arguments through its Python host side; a
    # Recording's wrapper of it keeps the launch for the C++ host path to replay.
    run = getattr(library, "jitops_conv2d", None)
    if run is None:
        light = light_conv.host(library)
        if light.info.d_rows:  # a strided dgrad's kernel stores dx by rows from the bias field's address
            bias = d
        launched = light.launch(a, b, d, bias, *args)
        keep = getattr(library, "keep_params_launch", None)
        if keep is not None:
            for packed in launched:
                keep(packed, (a, b, d, bias))
        return
    status = run(a, b, d, bias, *args)
    if status:
        args = (a, b, d, bias, *args)
        raise RuntimeError(f"jitops.{op_name}: {_STATUS.get(status, f'status {status}')}; problem "
                           f"(n, h, w, c, k, r, s, pads, strides, dilations) = {args[4:19]}")


# ---- offers to the C++ host path (jitops/native.py, kernels/host/conv2d.h) -------------------------------------
# An operator's run is recorded the first time its problem runs (once the extension is loaded) and offered if it
# only allocated, viewed and launched (one CUTLASS library call, a split wgrad's reduction kernel, a folded wgrad's
# unfolding kernel): a copy or a reduction through torch (padded channels, CUTLASS's strided dgrad phases, split
# fprops) keeps the problem on the Python path.  Slots: conv2d.h's FpropSlot, DgradSlot and WgradSlot.
_FPROP, _DGRAD, _WGRAD = 0, 1, 2
_LIBRARIES = {_FPROP: ("fprop",), _DGRAD: ("dgrad",), _WGRAD: ("wgrad", "wgrad_direct")}
_offers = native.Offers()
_host = native.host


def _offered(op: int, kern, run, args: tuple, x_size, w_size, bias: bool, slots_of):
    """run(kern, *args), recorded and offered under (op, device, dtype, sizes, geometry, bias) the first time;
    `slots_of(result)` lists the call's tensors in the operator's slot order."""
    module, sample = _host.module, args[0]
    if module is None or not sample.is_cuda or not any(hasattr(kern, name) for name in _LIBRARIES[op]):
        if module is None:  # (not a Hopper GPU, or a CPU stand-in of its kernels: nothing to offer)
            _host.start()
        return run(kern, *args)
    cls = kern.shape_class
    geometry = (tuple(cls.stride), tuple(cls.padding), tuple(cls.dilation))
    key = (op, sample.get_device(), sample.dtype, tuple(int(v) for v in x_size), tuple(int(v) for v in w_size),
           geometry, bias)
    if not _offers.first(key):
        return run(kern, *args)
    recording = native.Recording(kern)
    result = recording.watched(run, *args)
    native.offer_recording(module.offer_conv2d, recording, slots_of(result), op, sample, list(key[3]), list(key[4]),
                           *geometry, bias, stream=current_stream(sample.get_device()))
    return result


def native_conv2d(x, weight, bias, stride, padding, dilation):
    """The call through the C++ host path (a CUDA call, groups 1, geometry as torch takes it), or None: then the
    Python path runs it (and offers its operators)."""
    module = _host.module
    if module is None or not getattr(x, "is_cuda", False) or type(padding) is str or dispatcher_wanted():
        return None
    try:
        st, pad, dil = _geometry("conv2d", stride, padding, dilation)
        return module.conv2d(x, weight, bias, st, pad, dil, config.generation)
    except (TypeError, ValueError):  # not tensors or a malformed geometry: the Python path says so
        return None


def run_cuda(kern, x, weight, bias, stride, padding, dilation) -> torch.Tensor:
    return _offered(_FPROP, kern, _fprop_cuda, (x, weight, bias, stride, padding, dilation), x.shape, weight.shape,
                    bias is not None, lambda y: (x, weight, bias, y))


def run_input_grad_cuda(kern, grad, weight, input_size, stride, padding, dilation) -> torch.Tensor:
    return _offered(_DGRAD, kern, _input_grad_cuda, (grad, weight, input_size, stride, padding, dilation),
                    input_size, weight.shape, False, lambda dx: (grad, weight, dx))


def run_weight_grad_cuda(kern, grad, x, weight_size, stride, padding, dilation) -> torch.Tensor:
    return _offered(_WGRAD, kern, _weight_grad_cuda, (grad, x, weight_size, stride, padding, dilation), x.shape,
                    weight_size, False, lambda dw: (grad, x, dw))


# ---- layouts ---------------------------------------------------------------------------------------------------
IM2COL_BLOCK = 256


def _folded_im2col(kern, x: torch.Tensor, cls: ConvClass, p: int, q: int) -> tuple[torch.Tensor, int]:
    """The matrix of cls.fold filter rows [N, P + taps - 1, Q, round_up(fold*S*C)] for a conv of `taps` =
    ceil(R/fold) taps at unit stride (_plan_fold), and that tap count."""
    fold, (r, s), c = cls.fold, cls.kernel, x.shape[1]
    rows, _, taps, _ = _fold_matrix(x.shape[0], p, q, c, r, s, fold)
    matrix = _im2col(kern, x, fold, s, (fold, cls.stride[1]), cls.padding, (1, cls.dilation[1]), rows, q)
    return matrix, taps


def _fold_weight(kern, weight: torch.Tensor, fold: int, k8: int, columns: int) -> torch.Tensor:
    """w [K, C, R, S] (any strides) -> [k8, ceil(R/fold), 1, columns] (KRSC): tap j's channels are filter rows
    j*fold .. j*fold + fold - 1 in (row, s, c) order, as the folded matrix's columns; missing rows and padding
    zero (kernels/conv/fold_weight.cu)."""
    k, c, r, s = weight.shape
    taps = _ceil(r, fold)
    out = torch.empty((k8, taps, 1, columns), dtype=weight.dtype, device=weight.device)
    elements = out.numel()
    kern.fold_weight.launch(-(-elements // IM2COL_BLOCK), IM2COL_BLOCK, weight, out, elements, k, c, r, s, fold,
                            taps, columns, *weight.stride())
    return out


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
    """t [N, C, H, W] (any strides) as NHWC memory with `channels` channels, channel-contiguous and 16-byte
    aligned, for the kernels, which take only its address: t itself when it is channels_last, aligned and
    channels == C, else an NHWC copy [N, H, W, channels] whose channels beyond C are zero.  (No permuted view:
    each view costs an aten call, 4 us on the H100's host, and a ResNet-50 step made 423 of them.)"""
    if channels == t.shape[1] and t.is_contiguous(memory_format=CHANNELS_LAST) and t.data_ptr() % 16 == 0:
        return t
    n, c, h, w = t.shape
    out = torch.empty((n, h, w, channels), dtype=t.dtype, device=t.device)
    out[..., :c].copy_(t.permute(0, 2, 3, 1))
    if channels > c:
        out[..., c:].zero_()
    return out


def _krsc(weight: torch.Tensor, c8: int, k8: int) -> torch.Tensor:
    """The filter's KRSC memory [k8, R, S, c8] for the kernels (only its address is read): a channels_last,
    16-byte aligned weight with C == c8 and K == k8 itself, else a copy whose padded filters and channels are
    zero."""
    k, c, r, s = weight.shape
    if (c8, k8) == (c, k) and weight.is_contiguous(memory_format=CHANNELS_LAST) and weight.data_ptr() % 16 == 0:
        return weight
    out = torch.zeros((k8, r, s, c8), dtype=weight.dtype, device=weight.device)
    out[:k, :, :, :c].copy_(weight.permute(0, 2, 3, 1))
    return out


def _channels_last_like(shape, like: torch.Tensor) -> torch.Tensor:
    return torch.empty(shape, dtype=like.dtype, device=like.device, memory_format=CHANNELS_LAST)


def _launch_args(t: torch.Tensor):
    index = t.get_device()
    return index, sm_count(index), current_stream(index)


# ---- dgrad ---------------------------------------------------------------------------------------------------
def _input_grad_cuda(kern, grad, weight, input_size, stride, padding, dilation) -> torch.Tensor:
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
    p, q = grad.shape[2], grad.shape[3]
    if cls.im2col:
        return _input_grad_through_columns(kern, dy, p, q, weight, dx, k8)
    krsc = _krsc(weight, c8, k8)  # dgrad's B operand is the filter viewed as (C, (K, S, R))
    out = dx if c8 == c else torch.empty((n, h, w, c8), dtype=dx.dtype, device=dx.device)  # NHWC memory
    device, sms, stream = _launch_args(grad)
    if tuple(cls.stride) != (1, 1) and _phases_in_kernel(kern.dgrad):
        # The light kernel runs a strided dgrad's phases itself, all of dx (zeros included) in one launch, so the
        # call only launches (the C++ host path replays it).
        (pad_h, pad_w), (stride_h, stride_w), (dil_h, dil_w) = cls.padding, cls.stride, cls.dilation
        _call(kern.dgrad, "conv2d_input_grad", dy, krsc, out, None, n, h, w, c8, k8, r, s, pad_h, pad_h, pad_w, pad_w,
              stride_h, stride_w, dil_h, dil_w, h * w * c8, w * c8, c8, 1, device, sms, stream)
    else:
        _dgrad_in_phases(kern, cls, dy, krsc, out, (n, h, w, c8, k8, r, s), (int(p), int(q)), device, sms, stream)
    if c8 != c:
        dx.permute(0, 2, 3, 1).copy_(out[..., :c])
    return dx


def _phases_in_kernel(library) -> bool:
    """Whether the dgrad kernel is the light one built for strided dgrads (LIGHT_D_ROWS: its phases in one
    launch); CUTLASS's library runs one phase a call."""
    return getattr(library, "jitops_conv2d", None) is None and bool(light_conv.host(library).info.d_rows)


def _dgrad_in_phases(kern, cls, dy, krsc, out, dims, dy_hw, device, sms, stream) -> None:
    """A dgrad as unit-stride phases a call each (all of it in one, at unit stride; CUTLASS's kernels)."""
    n, h, w, c8, k8, r, s = dims
    phases, full = dgrad_phases((h, w), dy_hw, (r, s), cls.stride, cls.padding, cls.dilation)
    if not full:
        out.zero_()
    # The phases write disjoint pixels of dx.  Their filters are cut first, on the caller's stream; then several
    # phases run each on a side stream forked from it and joined back, so that their short kernels overlap instead
    # of each leaving the SMs to drain (config.conv2d_dgrad_phase_streams).  A split phase's reduction is a torch
    # op on the current stream, so split plans run in order on the caller's stream.
    filters = [_sub_filter(krsc, rows, cols, dims) for rows, cols in phases]
    if len(phases) > 1 and config.conv2d_dgrad_phase_streams and cls.splits == 1 and out.is_cuda:
        with SideStreams.of(device).forked(stream, len(phases)) as streams:
            for (rows, cols), sub, on in zip(phases, filters, streams):
                _dgrad_phase(kern, cls, dy, sub, out, rows, cols, dims, device, sms, on)
    else:
        for (rows, cols), sub in zip(phases, filters):
            _dgrad_phase(kern, cls, dy, sub, out, rows, cols, dims, device, sms, stream)


def _sub_filter(krsc: torch.Tensor, rows, cols, dims) -> torch.Tensor:
    """The KRSC memory of a phase's taps: all of the filter at unit stride; else its evenly spaced taps, one
    strided view of that memory (no index tensor, so CUDA graphs can capture this; slicing a permuted view took
    four aten calls more) copied contiguous for TMA."""
    c8, k8, r, s = dims[3], dims[4], dims[5], dims[6]
    if len(rows.taps) == r and len(cols.taps) == s:
        return krsc
    step_r = rows.taps[1] - rows.taps[0] if len(rows.taps) > 1 else 1
    step_s = cols.taps[1] - cols.taps[0] if len(cols.taps) > 1 else 1
    view = krsc.as_strided((k8, len(rows.taps), len(cols.taps), c8), (r * s * c8, step_r * s * c8, step_s * c8, 1),
                           krsc.storage_offset() + (rows.taps[0] * s + cols.taps[0]) * c8)
    return view.contiguous()


def _dgrad_phase(kern, cls, dy, sub, out, rows, cols, dims, device, sms, stream) -> None:
    """One phase of a dgrad (all of it at unit stride): dx's pixels of these rows and columns from the taps
    that reach them.  `out` holds dx's NHWC memory [n, h, w, c8]; a phase writes every stride-th pixel from
    (rows.start, cols.start) through one strided view (slicing it took six aten calls)."""
    n, h, w, c8, k8, r, s = dims
    sn, sh, sw = h * w * c8, cls.stride[0] * w * c8, cls.stride[1] * c8
    view = out
    if cls.splits > 1 or rows.count != h or cols.count != w:
        view = out.as_strided((n, rows.count, cols.count, c8), (sn, sh, sw, 1),
                              out.storage_offset() + (rows.start * w + cols.start) * c8)
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
        _call(kern.dgrad, "conv2d_input_grad", dy, sub, view, None, *problem, sn, sh, sw, 1, device, sms, stream)


def _input_grad_through_columns(kern, dy: torch.Tensor, p: int, q: int, weight: torch.Tensor, dx: torch.Tensor,
                                k8: int):
    """Few input channels (the stem): columns [N, P, Q, R*S*C padded] = dy . W, a 1x1 conv with the filter as
    R*S*C output channels over K input channels (one k-step for K=64, where the direct dgrad's 64-wide tile
    carries 8 padded channels: 963 us for the stem against cuDNN's 474), then col2im sums them into dx.  The
    columns are fp32 (the split-K kernel, one slice), so each pixel's taps are rounded once, as torch rounds."""
    cls = kern.shape_class
    n, c, h, w = dx.shape
    k, _, r, s = weight.shape
    width = round_up(r * s * c)
    w_columns = torch.zeros((width, 1, 1, k8), dtype=weight.dtype, device=weight.device)
    w_columns[:r * s * c, 0, 0, :k].copy_(weight.permute(2, 3, 1, 0).reshape(r * s * c, k))  # rows (r, s, c)
    columns = torch.empty((n, p, q, width), dtype=torch.float32, device=dx.device)
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


# ---- wgrad ---------------------------------------------------------------------------------------------------
def _summed_slices(partial: torch.Tensor, taps: int, width: int) -> torch.Tensor:
    """The torch reduction (config.conv2d_wgrad_reduce_kernel=False, or one slice): partial's slices
    [splits][K8][taps][width] (contiguous, any shape) summed into [K8][taps][width]."""
    slices = partial.view(partial.shape[0], partial.shape[1], taps, width)
    return slices[0] if partial.shape[0] == 1 else slices.sum(0)


def _reduce_into(kern, partial: torch.Tensor, dw: torch.Tensor, taps: int, width: int) -> None:
    """dw (channels_last [K, C, R, S], i.e. KRSC memory, seen as [K, taps, channels]) = the sum over partial's
    slices [splits][K8][taps][width] (contiguous, any shape) of its first K rows and `channels` channels per tap."""
    splits, k8 = partial.shape[0], partial.shape[1]
    k = dw.shape[0]
    channels = dw.numel() // (k * taps)
    if not config.conv2d_wgrad_reduce_kernel or splits == 1:
        dw.permute(0, 2, 3, 1).view(k, taps, channels).copy_(_summed_slices(partial, taps, width)[:k, :, :channels])
        return
    rows = k * taps
    if rows * channels >= 2**31:
        raise ValueError(f"jitops.conv2d_weight_grad: the weight gradient has {rows * channels} elements; the "
                         "reduction kernel indexes it with 32 bits (at most 2**31 - 1)")
    kern.reduce.launch(-(-rows * channels // REDUCE_BLOCK), REDUCE_BLOCK, partial, dw, splits, k8 * taps * width,
                       rows, channels, width)


def _weight_grad_cuda(kern, grad, x, weight_size, stride, padding, dilation) -> torch.Tensor:
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
        if config.conv2d_wgrad_reduce_kernel:
            if dw.numel() >= 2**31:
                raise ValueError(f"jitops.conv2d_weight_grad: the weight gradient has {dw.numel()} elements; the "
                                 "unfolding kernel indexes it with 32 bits (at most 2**31 - 1)")
            kern.unfold.launch(-(-dw.numel() // REDUCE_BLOCK), REDUCE_BLOCK, partial, dw, splits,
                               k8 * taps * width, k, r, s * c, fold, taps, width)
            return dw
        total = _summed_slices(partial, taps, width)
        folded = total[:k, :, :fold * s * c].reshape(k, taps * fold, s, c)[:, :r]
        dw.permute(0, 2, 3, 1).copy_(folded)
        return dw
    if cls.im2col:  # dw as a 1x1 wgrad over the im2col matrix: [K, R*S*C] -> KRSC
        columns = _im2col(kern, x, r, s, cls.stride, cls.padding, cls.dilation, p, q)
        width = columns.shape[-1]
        partial = torch.empty((splits, k8, 1, 1, width), dtype=torch.float32, device=grad.device)
        _call(kern.wgrad, "conv2d_weight_grad", _nhwc(grad, k8), columns, partial, None, n, p, q, width, k8, 1, 1,
              0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, splits, device, sms, stream)
        _reduce_into(kern, partial, dw, 1, width)  # the columns are (r, s, c): KRSC order
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
    _reduce_into(kern, partial, dw, r * s, c8)
    return dw


def run_weight_grad_cpu(kern, grad, x, weight_size, stride, padding, dilation) -> torch.Tensor:
    cls = kern.shape_class
    dw = torch.nn.grad.conv2d_weight(x, [int(v) for v in weight_size], grad, stride=cls.stride,
                                     padding=cls.padding, dilation=cls.dilation)
    return dw.contiguous(memory_format=CHANNELS_LAST)


# ---- fprop ---------------------------------------------------------------------------------------------------
def _fprop_cuda(kern, x, weight, bias, stride, padding, dilation) -> torch.Tensor:
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
        w_krsc = _fold_weight(kern, weight, cls.fold, k8, x.shape[1])
        c, h, w, r, s, c8 = x.shape[1], x.shape[2], q, taps, 1, x.shape[1]
        cls = cls._replace(stride=(1, 1), padding=(0, 0), dilation=(1, 1))
    elif cls.im2col:  # a 1x1 conv over the im2col matrix [N, P, Q, R*S*C]: x and w become (R*S*C)-channel tensors
        x = _im2col(kern, x, r, s, cls.stride, cls.padding, cls.dilation, p, q).permute(0, 3, 1, 2)
        weight = weight.permute(0, 2, 3, 1).reshape(k, r * s * c, 1, 1)
        c, h, w, r, s, c8 = r * s * c, p, q, 1, 1, x.shape[1]
        cls = cls._replace(stride=(1, 1), padding=(0, 0), dilation=(1, 1))
    if w_krsc is None:
        w_krsc = _krsc(weight, c8, k8)
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
    out = y if k8 == k else torch.empty((n, p, q, k8), dtype=x.dtype, device=x.device)  # NHWC memory
    _call(kern.fprop, "conv2d", _nhwc(x, c8), w_krsc, out, bias, *problem, 1, *_launch_args(x))
    if k8 != k:
        y.permute(0, 2, 3, 1).copy_(out[..., :k])
    return y


def run_cpu(kern, x, weight, bias, stride, padding, dilation) -> torch.Tensor:
    cls = kern.shape_class
    y = torch.nn.functional.conv2d(x, weight, bias, stride=cls.stride, padding=cls.padding, dilation=cls.dilation)
    return y.contiguous(memory_format=CHANNELS_LAST)


# ---- patchify: a conv over non-overlapping patches as one jitops.linear call ---------------------------------------
def patch_matrices(x: torch.Tensor, weight: torch.Tensor, r: int, s: int):
    """(patches (N*P*Q, C*R*S), weight (K, C*R*S) in the same column order, P, Q) for a 4-D x whose stride is the
    R x S filter: one copy of x.  Rows and columns past the last whole patch are dropped, as the conv drops them.
    The columns are (R, S, C) where channels are x's innermost dimension (channels_last: the copy reads runs of C
    contiguous elements) and (C, R, S) otherwise (NCHW: runs of S); the weight is a free view in that order
    when it is laid out the same way, else a copy of the (small) weight."""
    n, c, h, w = x.shape
    k = weight.shape[0]
    p, q = h // r, w // s
    if p * r != h or q * s != w:
        x = x[:, :, :p * r, :q * s]
    if c > 1 and x.stride(1) < x.stride(3):
        # (N, P, R, Q, S, C) from x's NHWC view, so that the backward's copy makes grad_x NHWC (channels_last) too
        blocks = x.permute(0, 2, 3, 1).unflatten(2, (q, s)).unflatten(1, (p, r))
        patches = blocks.permute(0, 1, 3, 2, 4, 5).reshape(n * p * q, r * s * c)
        return patches, weight.permute(0, 2, 3, 1).reshape(k, r * s * c), p, q
    blocks = x.unflatten(3, (q, s)).unflatten(2, (p, r))  # (N, C, P, R, Q, S): a view whatever x's strides
    return blocks.permute(0, 2, 4, 1, 3, 5).reshape(n * p * q, c * r * s), weight.reshape(k, c * r * s), p, q


def run_patchify(x: torch.Tensor, weight: torch.Tensor, bias, r: int, s: int) -> torch.Tensor:
    """The conv as jitops.linear over the patch matrix; gradients flow through linear's backward (jitops.gemm)
    and the views' (a copy for grad_x).  The (N*P*Q, K) result viewed as (N, K, P, Q) is channels_last memory,
    as the conv op's output is.  x: 4-D or unbatched 3-D."""
    unbatched = x.dim() == 3
    if unbatched:
        x = x.unsqueeze(0)
    patches, w2, p, q = patch_matrices(x, weight, r, s)
    y = linear(patches, w2, bias).view(x.shape[0], p, q, weight.shape[0]).permute(0, 3, 1, 2)
    return y.squeeze(0) if unbatched else y


def patchify_calls(x: torch.Tensor, weight: torch.Tensor, bias, r: int, s: int) -> list:
    """The op call run_patchify makes for a 4-D x (manifests, prefetch): jitops.linear on contiguous operands."""
    (n, c, h, w), k = x.shape, weight.shape[0]
    patches = shapes.placeholder(x, (n * (h // r) * (w // s), c * r * s))
    return [(linear, (patches, shapes.placeholder(weight, (k, c * r * s)), bias, None))]
