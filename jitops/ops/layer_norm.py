"""jitops.layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5), forward and backward, and
jitops.rms_norm(x, normalized_shape, weight=None, eps=None).

Like torch.nn.functional.layer_norm: each row of n = prod(normalized_shape) trailing elements is normalized by
its mean and biased variance, then scaled by weight and shifted by bias (both shaped normalized_shape).
jitops.rms_norm is torch.nn.functional.rms_norm: each row divided by its root mean square, sqrt(mean(x^2) + eps)
(eps None: torch.finfo(x.dtype).eps), then scaled by weight.  It is the same ops and kernels with rms=True: the
mean taken as 0 (and saved as 0 in stats), the backward's dx without its mean(g) term.

Three ops carry it.  The public function calls the first when a gradient is to be recorded (and returns y),
else the third:
    jitops::layer_norm_forward(x, normalized_shape, weight, bias, eps, rms) -> (y, stats)
    jitops::layer_norm_backward(grad, x, stats, weight, normalized_shape, need_dx, need_dweight, need_dbias, rms)
        -> (dx, dweight, dbias)
    jitops::layer_norm_inference(x, normalized_shape, weight, bias, eps, rms) -> y  (same kernel, no stats written)
stats is (2, rows): the mean and 1/sqrt(var + eps) of every row, in float32 (float64 for float64 inputs),
saved for the backward.  The backward computes only the gradients autograd asks for; the ones not asked for
come back as empty tensors.  dweight and dbias are deterministic: per-block partial sums go to a workspace and
a second kernel adds them in a fixed order (no floating-point atomics), so the same inputs on the same device
give the same bits.  Double backward is not supported.

Dtypes: CUDA fp32, fp16, bf16 (statistics and arithmetic in fp32) and fp64 (NVRTC); CPU the same through the
host C++ compiler (sums in double; fp16 and bf16 by the fp32 kernel on fp32 copies, rounded once at the end).
weight and bias must have x's dtype.  n may be anything from 1 up (1, 7, 4097, 65536...), rows anything from 0
up.

Non-contiguous inputs: x, weight, bias (and the gradient in the backward) that are not contiguous are copied
to contiguous tensors first (one extra read and write of that tensor); the outputs are always contiguous.
The vector width is then chosen from the copies' alignment, so a strided x costs one copy, never a slow path.

Shape class (what changes the compiled code): dtype; the vector width, 16 bytes when every pointer and n allow
it, else the widest that they do (odd n: 1 element); the hidden-size bucket - threads per row (a power of two,
1 to 1024: many rows per block for short rows, a warp per row, or a block per row) and vectors per thread, so
that each thread keeps a tile of its row in registers between the statistics and the output (forward 128 bytes,
or 64 when 128 would leave the GPU too few threads; backward 64; fewer than SMALL_ROWS rows: one 16-byte vector a
thread, for latency), rows longer than the largest block's tiles streaming twice (the second pass from L2); and
the index width (32-bit below 2^30 elements).  The backward adds where dweight/dbias are summed: registers (rows
that fit in one tile), shared memory, or a column kernel for rows too long for either (n above about 20000 in
fp32/bf16/fp16, 10000 in fp64); and from 2 to FEW_ROWS (64) rows, a kernel that sums them column by column
straight from dy and x (no partial sums to write and reduce).  The benchmark set's buckets were measured on the
H100: docs/benchmarks.md.  See kernels/layer_norm.cu.
"""
from __future__ import annotations

import math

import torch

from .. import native, shapes
from ..config import config
from ..op import Impl, dispatcher_wanted, op, public
from ..specs import CppLibrary, CudaKernel, Source, Target
from .layer_norm_plan import (_ITEMSIZE, CPU_COMPUTE, FEW_ROWS, INT32_LIMIT, SMALL_ROWS, BackwardClass, ForwardClass,
                              _vector_width, backward_class, forward_class)
from .layer_norm_run import (STATS_DTYPE, _rows, forward_offered, run_backward_cpu, run_backward_cuda, run_cpu,
                             run_cuda, torch_backward, torch_forward)

CUDA_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
CPU_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_Tensor = torch.Tensor
_Parameter = torch.nn.Parameter


# ---- input checks (every error names the argument) -----------------------------------------------------------
def _row_length(op_name: str, x: torch.Tensor, normalized_shape) -> int:
    """n = prod(normalized_shape), which must equal x's trailing dimensions."""
    if len(normalized_shape) == 1 and x.dim() >= 1 and x.shape[-1] == normalized_shape[0]:
        return normalized_shape[0]
    k = len(normalized_shape)
    if k == 0 or x.dim() < k or tuple(x.shape[x.dim() - k:]) != tuple(normalized_shape):
        raise ValueError(f"jitops.{op_name}: argument 'normalized_shape' is {list(normalized_shape)} but 'x' has "
                         f"shape {tuple(x.shape)}; normalized_shape must be non-empty and equal x's last "
                         f"{max(k, 1)} dimension(s)")
    return math.prod(normalized_shape)


def _check_param(op_name: str, name: str, t: torch.Tensor, x: torch.Tensor, normalized_shape) -> None:
    if t.dtype != x.dtype:
        shapes.check_same_dtype(op_name, ("x", x), (name, t))
    if tuple(t.shape) != tuple(normalized_shape):
        raise ValueError(f"jitops.{op_name}: argument '{name}' has shape {tuple(t.shape)}, expected "
                         f"{tuple(normalized_shape)} (normalized_shape)")


def _check_dtype(op_name: str, name: str, t: torch.Tensor) -> None:
    allowed = CPU_DTYPES if t.is_cpu else CUDA_DTYPES
    if t.dtype not in allowed:
        shapes.check_dtype(op_name, name, t, allowed)


def _check_inputs(op_name: str, x: torch.Tensor, normalized_shape, params) -> int:
    """Every check of x, normalized_shape and the (name, tensor) params; returns n.  Plain comparisons
    first (this runs on every call); the helpers that build the messages only on failure."""
    dtype = x.dtype
    if dtype not in CUDA_DTYPES or (dtype not in CPU_DTYPES and x.is_cpu):
        _check_dtype(op_name, "x", x)
    k = len(normalized_shape)
    if k == 1:
        n = normalized_shape[0]
        if x.dim() == 0 or x.shape[-1] != n:
            n = _row_length(op_name, x, normalized_shape)
        for name, t in params:
            if t is not None and (t.dtype != dtype or t.dim() != 1 or t.shape[0] != n):
                _check_param(op_name, name, t, x, normalized_shape)
        return n
    n = _row_length(op_name, x, normalized_shape)
    for name, t in params:
        if t is not None and (t.dtype != dtype or tuple(t.shape) != tuple(normalized_shape)):
            _check_param(op_name, name, t, x, normalized_shape)
    return n


# ---- jitops::layer_norm_forward --------------------------------------------------------------------------------
def _concrete(x: torch.Tensor) -> bool:
    """A real (or meta) tensor: its class can be computed.  Fake tensors under torch.compile/opcheck may have
    symbolic sizes; the fake path only needs the input checks."""
    return type(x) is torch.Tensor or type(x) is torch.nn.Parameter


def shape_class(x: torch.Tensor, normalized_shape, weight, bias, eps: float, rms: bool = False) -> ForwardClass:
    """The forward's class.  Runs on every call, so the common call (a contiguous CUDA x or a CPU x, one
    normalized dimension, weight and bias absent or vectors of x's dtype, contiguous on CUDA) takes a short
    path: a dozen tensor queries where the general checks below make ~30 (1.9-2.8 us against 5.6 on the lent
    H100's hosts).  Anything else, bad inputs included, takes the general path, which gives the same class or
    the error."""
    if type(x) is not _Tensor or len(normalized_shape) != 1:
        return _checked_shape_class(x, normalized_shape, weight, bias, eps, rms)
    if x.is_cuda and x.is_contiguous():
        n = normalized_shape[0]
        shape = x.shape
        dtype = x.dtype
        itemsize = _ITEMSIZE.get(dtype)
        if itemsize and n and shape and shape[-1] == n:
            row = (n,)
            address = x.data_ptr()
            plain = True
            # weight and bias are nn.Parameters in a model (LayerNorm's): they take this path too.
            if weight is not None:
                plain = ((type(weight) is _Tensor or type(weight) is _Parameter) and weight.dtype is dtype and
                         weight.shape == row and weight.is_contiguous())
                if plain:
                    address |= weight.data_ptr()
            if bias is not None and plain:
                plain = ((type(bias) is _Tensor or type(bias) is _Parameter) and bias.dtype is dtype and
                         bias.shape == row and bias.is_contiguous())
                if plain:
                    address |= bias.data_ptr()
            if plain:
                numel = x.numel()
                width = 16 // itemsize
                while width > 1 and (n % width or address % (width * itemsize)):
                    width >>= 1
                return forward_class(dtype, n, width, numel // n, "int" if numel < INT32_LIMIT else "long long",
                                     rms)
    elif x.is_cpu:  # the CPU kernel's class is the dtype's: only the checks (1.5 us through _check_inputs)
        n = normalized_shape[0]
        shape = x.shape
        dtype = x.dtype
        cls = _CPU_CLASSES.get(dtype)
        if cls is not None and shape and shape[-1] == n and \
                (weight is None or ((type(weight) is _Tensor or type(weight) is _Parameter) and
                                    weight.dtype is dtype and weight.shape == (n,))) and \
                (bias is None or ((type(bias) is _Tensor or type(bias) is _Parameter) and
                                  bias.dtype is dtype and bias.shape == (n,))):
            return cls
    return _checked_shape_class(x, normalized_shape, weight, bias, eps, rms)


# The CPU kernel takes every shape: its class is the dtype's (what _checked_shape_class builds on the CPU); rms is
# an argument of its calls.
_CPU_CLASSES = {dtype: ForwardClass(dtype, 0, 0, 0, "") for dtype in CPU_DTYPES}


def _checked_shape_class(x: torch.Tensor, normalized_shape, weight, bias, eps: float,
                         rms: bool = False) -> ForwardClass:
    n = _check_inputs("rms_norm" if rms else "layer_norm", x, normalized_shape, (("weight", weight), ("bias", bias)))
    if x.is_cpu or not _concrete(x):
        return ForwardClass(x.dtype, 0, 0, 0, "")
    aligned = [t for t in (x, weight, bias) if t is not None and t.is_contiguous()]
    numel = x.numel()
    return forward_class(x.dtype, n, _vector_width(n, x.element_size(), aligned), numel // n if n else 0,
                         "int" if numel < INT32_LIMIT else "long long", rms)


LN_FORWARD = CudaKernel("layer_norm_forward", Source.file("layer_norm.cu"),
                        "jitops::layer_norm_forward<{T}, {VEC}, {TPR}, {ITERS}, {I}, {RMS}>",
                        "ptr ptr ptr ptr ptr i64 i64 f64")
LN_BACKWARD = CudaKernel("layer_norm_backward", Source.file("layer_norm.cu"),
                         "jitops::layer_norm_backward<{T}, {VEC}, {TPR}, {ITERS}, {I}, {PARAMS}, {RMS}>",
                         "ptr ptr ptr ptr ptr ptr ptr ptr i64 i64")
LN_COLUMNS = CudaKernel("layer_norm_backward_columns", Source.file("layer_norm.cu"),
                        "jitops::layer_norm_backward_columns<{T}, {VEC}, {I}>", "ptr ptr ptr ptr i64 i64 i64")
LN_REDUCE = CudaKernel("layer_norm_reduce_partials", Source.file("layer_norm.cu"),
                       "jitops::layer_norm_reduce_partials<{T}>", "ptr ptr ptr i64 i64")
LN_PARAM_GRADS = CudaKernel("layer_norm_param_grads", Source.file("layer_norm.cu"),
                            "jitops::layer_norm_param_grads<{T}>", "ptr ptr ptr ptr ptr i64 i64")

# -ffp-contract=off: dx subtracts mean(g) from g = dy * w, and a fused multiply-add there leaves the product's
# rounding error where the difference is exactly 0 (all of dx when n == 1).  x86-64's baseline has no FMA, but
# where it is (aarch64, -march=native) GCC fuses by default.
LN_CPU = CppLibrary("layer_norm_cpu", Source.file("cpu/layer_norm.cpp"), functions={
    "layer_norm_forward": (("ptr", "ptr", "ptr", "ptr", "ptr", "i64", "i64", "f64", "i64"), "void"),
    "layer_norm_backward": (("ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "i64", "i64", "i64"), "void"),
}, options=("-O3", "-ffp-contract=off"))


def cuda_kernels(cls: ForwardClass, target: Target):
    return {"forward": LN_FORWARD.bind(shapes.dtype_name(cls.dtype), T=shapes.CUDA_TYPES[cls.dtype], VEC=cls.vec,
                                       TPR=cls.tpr, ITERS=cls.iters, I=cls.index, RMS=_RMS[cls.rms])}


def cpu_kernels(cls, target: Target):
    compute = CPU_COMPUTE[cls.dtype]
    return {"cpu": LN_CPU.bind(shapes.dtype_name(compute), SCALAR_T=shapes.CPU_TYPES[compute])}


_RMS = {False: "false", True: "true"}


def fake(x: torch.Tensor, normalized_shape, weight, bias, eps: float, rms: bool = False):
    n = math.prod(normalized_shape)
    rows = _rows(x, n, len(normalized_shape))
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            x.new_empty((2, rows), dtype=STATS_DTYPE.get(x.dtype, torch.float32)))


def setup_context(ctx, inputs, output) -> None:
    x, normalized_shape, weight, bias = inputs[:4]
    _, stats = output
    ctx.mark_non_differentiable(stats)
    # stats never gets a gradient: without this autograd allocates and fills a zero one for every backward.
    # (backward() below takes None for either gradient.)
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(x, stats, weight)
    ctx.normalized_shape = list(normalized_shape)
    ctx.has_weight, ctx.has_bias = weight is not None, bias is not None
    ctx.rms = len(inputs) > 5 and bool(inputs[5])


def backward(ctx, grad: torch.Tensor | None, grad_stats: torch.Tensor | None):
    x, stats, weight = ctx.saved_tensors
    need_dx = ctx.needs_input_grad[0]
    need_dw = ctx.has_weight and ctx.needs_input_grad[2]
    need_db = ctx.has_bias and ctx.needs_input_grad[3]
    if grad is None or not (need_dx or need_dw or need_db):
        return None, None, None
    dx, dw, db = layer_norm_backward(grad, x, stats, weight, ctx.normalized_shape, need_dx, need_dw, need_db,
                                     ctx.rms)
    return dx if need_dx else None, dw if need_dw else None, db if need_db else None


# ---- jitops::layer_norm_backward -------------------------------------------------------------------------------
_CPU_BACKWARD_CLASSES = {dtype: BackwardClass(dtype, 0, 0, 0, "", 0) for dtype in CPU_DTYPES}


def backward_shape_class(grad: torch.Tensor, x: torch.Tensor, stats: torch.Tensor, weight, normalized_shape,
                         need_dx: bool, need_dweight: bool, need_dbias: bool, rms: bool = False) -> BackwardClass:
    n = _check_inputs("layer_norm_backward", x, normalized_shape, (("weight", weight),))
    if grad.dtype != x.dtype:
        shapes.check_same_dtype("layer_norm_backward", ("x", x), ("grad", grad))
    if grad.shape != x.shape:
        shapes.check_same_shape("layer_norm_backward", ("x", x), ("grad", grad))
    numel = x.numel()
    rows = numel // n if n else _rows(x, n, len(normalized_shape))
    if stats.dim() != 2 or stats.shape[0] != 2 or stats.shape[1] != rows:
        shapes.check_shape("layer_norm_backward", "stats", stats, (2, rows), "mean and rstd of every row")
    if x.is_cpu:
        return _CPU_BACKWARD_CLASSES[x.dtype]  # (the dtype was checked above)
    if not _concrete(x):
        return BackwardClass(x.dtype, 0, 0, 0, "", 0, rms)
    aligned = [t for t in (grad, x, weight) if t is not None and t.is_contiguous()]
    return backward_class(x.dtype, n, _vector_width(n, x.element_size(), aligned), rows < SMALL_ROWS,
                          "int" if numel < INT32_LIMIT else "long long", 1 < rows <= FEW_ROWS, rms)


def backward_cuda_kernels(cls: BackwardClass, target: Target):
    dtype, ctype, rms = shapes.dtype_name(cls.dtype), shapes.CUDA_TYPES[cls.dtype], _RMS[cls.rms]
    if cls.params == 3:  # the row kernel computes dx only; layer_norm_param_grads does dweight/dbias
        return {"backward": LN_BACKWARD.bind(dtype, T=ctype, VEC=cls.vec, TPR=cls.tpr, ITERS=cls.iters, I=cls.index,
                                             PARAMS=0, RMS=rms),
                "param_grads": LN_PARAM_GRADS.bind(dtype, T=ctype)}
    kernels = {
        "backward": LN_BACKWARD.bind(dtype, T=ctype, VEC=cls.vec, TPR=cls.tpr, ITERS=cls.iters, I=cls.index,
                                     PARAMS=cls.params, RMS=rms),
        "reduce": LN_REDUCE.bind(dtype, T=ctype),
    }
    if cls.params == 0:
        kernels["columns"] = LN_COLUMNS.bind(dtype, T=ctype, VEC=cls.vec, I=cls.index)
    return kernels


def backward_fake(grad, x, stats, weight, normalized_shape, need_dx, need_dweight, need_dbias, rms=False):
    return (torch.empty_like(x, memory_format=torch.contiguous_format) if need_dx else x.new_empty((0,)),
            x.new_empty(normalized_shape) if need_dweight else x.new_empty((0,)),
            x.new_empty(normalized_shape) if need_dbias else x.new_empty((0,)))


layer_norm_backward = op(
    "jitops::layer_norm_backward(Tensor grad, Tensor x, Tensor stats, Tensor? weight, int[] normalized_shape, "
    "bool need_dx=True, bool need_dweight=True, bool need_dbias=True, bool rms=False) -> (Tensor, Tensor, Tensor)",
    shape_class=backward_shape_class,
    cuda=Impl(backward_cuda_kernels, run_backward_cuda),
    cpu=Impl(cpu_kernels, run_backward_cpu),
    fake=backward_fake,
    doc="Gradients of jitops.layer_norm: (dx, dweight, dbias); the ones not asked for are empty tensors.",
    fallback=torch_backward,
)


def companions(x, normalized_shape, weight, bias, eps, rms=False, *, needs):
    """The backward's call (see backward above), for manifests and prefetching: dy like y (contiguous), the
    saved statistics."""
    need_dx, need_dw, need_db = needs[0], needs[1] and weight is not None, needs[2] and bias is not None
    if not (need_dx or need_dw or need_db):
        return []
    n = math.prod(normalized_shape)
    stats = shapes.placeholder(x, (2, x.numel() // n if n else 0), dtype=STATS_DTYPE.get(x.dtype, torch.float32))
    return [(layer_norm_backward, (shapes.placeholder(x, x.shape), x, stats, weight, list(normalized_shape),
                                   need_dx, need_dw, need_db, rms))]


layer_norm_forward = op(
    "jitops::layer_norm_forward(Tensor x, int[] normalized_shape, Tensor? weight=None, Tensor? bias=None, "
    "float eps=1e-05, bool rms=False) -> (Tensor, Tensor)",
    shape_class=shape_class,
    cuda=Impl(cuda_kernels, run_cuda),
    cpu=Impl(cpu_kernels, run_cpu),
    fake=fake,
    setup_context=setup_context,
    backward=backward,
    companions=companions,
    doc="jitops.layer_norm's op: returns (y, stats) where stats is (2, rows): mean and rstd of every row.",
    fallback=torch_forward,
)


# ---- jitops::layer_norm_inference: the forward when no gradient is recorded --------------------------------------
def run_inference_cuda(k, x: torch.Tensor, normalized_shape, weight, bias, eps: float,
                       rms: bool = False) -> torch.Tensor:
    return forward_offered(k, x, normalized_shape, weight, bias, eps, False, rms)[0]


def run_inference_cpu(k, x: torch.Tensor, normalized_shape, weight, bias, eps: float,
                      rms: bool = False) -> torch.Tensor:
    return run_cpu(k, x, normalized_shape, weight, bias, eps, rms)[0]


def torch_inference(k, x: torch.Tensor, normalized_shape, weight, bias, eps: float, rms: bool = False):
    if rms:
        return torch.nn.functional.rms_norm(x, list(normalized_shape), weight, eps).contiguous()
    return torch.nn.functional.layer_norm(x, list(normalized_shape), weight, bias, eps).contiguous()


layer_norm_inference = op(
    "jitops::layer_norm_inference(Tensor x, int[] normalized_shape, Tensor? weight=None, Tensor? bias=None, "
    "float eps=1e-05, bool rms=False) -> Tensor",
    shape_class=shape_class,
    cuda=Impl(cuda_kernels, run_inference_cuda),
    cpu=Impl(cpu_kernels, run_inference_cpu),
    fake=lambda x, normalized_shape, weight, bias, eps, rms=False: torch.empty_like(
        x, memory_format=torch.contiguous_format),
    doc="jitops.layer_norm when no gradient is recorded: y only (the CUDA kernel skips the statistics).",
    fallback=torch_inference,
)


_native = native.host


def _normalize(x: torch.Tensor, normalized_shape, weight, bias, eps: float, rms: bool) -> torch.Tensor:
    if type(normalized_shape) is int:
        normalized_shape = (normalized_shape,)
    # The C++ host path first (jitops/native.py): it serves a plain CUDA call over the last dimension whose
    # launches the Python path below recorded before, and answers None for anything else.  Modes, the profiler
    # and torch.compile see the op in the dispatcher instead.
    host = _native.module
    if host is not None and getattr(x, "is_cuda", False) and len(normalized_shape) == 1 and not dispatcher_wanted():
        try:
            y = host.layer_norm(x, normalized_shape[0], weight, bias, eps, rms, config.generation)
        except TypeError:  # not tensors, or a shape that is not an int: the Python path says so
            y = None
        if y is not None:
            return y
    # With a gradient to record, the forward op saves each row's statistics for the backward; without one the
    # inference op skips them: one allocation (2.6-3.1 us of a 12-19 us call on the H100 machine's host) and 8
    # bytes a row fewer.
    if torch.is_grad_enabled() and (getattr(x, "requires_grad", False) or getattr(weight, "requires_grad", False)
                                    or getattr(bias, "requires_grad", False)):
        return layer_norm_forward(x, normalized_shape, weight, bias, eps, rms)[0]
    return layer_norm_inference(x, normalized_shape, weight, bias, eps, rms)


def layer_norm(x: torch.Tensor, normalized_shape, weight: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, eps: float = 1e-5) -> torch.Tensor:
    return _normalize(x, normalized_shape, weight, bias, eps, False)


def rms_norm(x: torch.Tensor, normalized_shape, weight: torch.Tensor | None = None,
             eps: float | None = None) -> torch.Tensor:
    """torch.nn.functional.rms_norm through jitops.layer_norm's ops and kernels (rms=True); see the module's
    docstring.  eps None is torch's default, torch.finfo(x.dtype).eps."""
    if eps is None:
        dtype = getattr(x, "dtype", None)
        eps = torch.finfo(dtype).eps if isinstance(dtype, torch.dtype) and dtype.is_floating_point else 0.0
    return _normalize(x, normalized_shape, weight, None, eps, True)


layer_norm.__doc__ = __doc__
layer_norm.op = layer_norm_forward.op  # type: ignore[attr-defined]


# One public name for the three ops: what the functions above call with a gradient recorded and without one.
def _bind(x, normalized_shape, weight=None, bias=None, eps=1e-5, rms=False):
    shape = [normalized_shape] if type(normalized_shape) is int else list(normalized_shape)
    return layer_norm_forward, (x, shape, weight, bias, eps, rms)


def _bind_rms(x, normalized_shape, weight=None, eps=None):
    if eps is None:
        eps = torch.finfo(x.dtype).eps
    return _bind(x, normalized_shape, weight, None, eps, True)


def _calls(entry, args, grad):
    return [(layer_norm_forward if grad else layer_norm_inference, args)]


public("layer_norm", layer_norm, entries=(layer_norm_forward, layer_norm_inference), parts=(layer_norm_backward,),
       calls=_calls, bind=_bind)
# A manifest item {"op": "rms_norm", ...} is written in layer_norm_forward's arguments, rms=True whatever it says.
public("rms_norm", rms_norm, entries=(layer_norm_forward, layer_norm_inference), parts=(layer_norm_backward,),
       calls=_calls, bind=_bind_rms, shared=True,
       form=lambda shapes, kwargs: (layer_norm_forward, shapes, {**kwargs, "rms": True}))

# Common shape classes, for `cache_tools prewarm --all-builtin` (manifest items; each builds the forward, the
# backward and the no-grad path).
PREWARM = [
    {"op": "layer_norm", "dtypes": ["fp32", "fp16", "bf16"],
     "shapes": [[[4096, n], [n], [n]]], "kwargs": {"normalized_shape": [n], "eps": 1e-5}}
    for n in (768, 1024, 2048, 4096, 8192)
] + [  # rms_norm (Llama-style models: a weight, no bias)
    {"op": "rms_norm", "dtypes": ["fp32", "fp16", "bf16"],
     "shapes": [[[4096, n], [n], None]], "kwargs": {"normalized_shape": [n], "eps": 1e-6}}
    for n in (1024, 2048, 4096, 8192)
]
