"""jitops.conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1): 2-D convolution
(cross-correlation), forward and backward, with a channels_last output.

Arguments as torch.nn.functional.conv2d takes them: x [N, C, H, W] or unbatched [C, H, W] (the output then has
no batch dimension either); stride, padding and dilation an int or a pair; padding also "valid" (0) or "same"
(stride 1; where the dilated kernel's extent is even, the extra row or column goes at the bottom or right, as
torch puts it, by padding x with F.pad: one copy of x, as torch's own _convolution_same makes).  groups other
than 1 (grouped and depthwise convolutions) and float32 on CUDA run through ATen's F.conv2d (cuDNN on CUDA, TF32
per torch.backends.cudnn.allow_tf32): a documented fallback until jitops has its own kernels for them.

Layouts.  The CUDA kernels work on NHWC activations and KRSC filters (channel-contiguous), so:
- `x` may be channels_last or contiguous NCHW (any strides, in fact).  A channels_last x is used in place; any
  other layout is converted ONCE per call into an NHWC copy (one read and one write of x: for a memory-bound
  1x1 conv that copy costs about as much as the conv itself, so keep activations channels_last).
- `weight` [K, C, R, S] is copied to KRSC each call unless it is already channels_last (small: the weights).
- The output is allocated with torch.empty(..., memory_format=torch.channels_last) and the kernel writes its
  NHWC memory directly: it IS channels_last in memory (strides (P*Q*K, 1, Q*K, K)), not merely tagged.  The
  gradients follow the same rule: grad_x and grad_weight are channels_last [N, C, H, W] / [K, C, R, S].

Kernels (CUDA, fp16 and bf16, Hopper sm_90a; other GPUs run the ATen path below, i.e. cuDNN): implicit GEMMs with
TMA im2col loads and wgmma, by default the light GEMM kernel built per operator (NVRTC, under a second; jitops/
light_conv.py); JITOPS_CONV2D_SM90_KERNEL=cutlass: CUTLASS 3's, kernels/conv/ (nvcc, about 40 s each; conv_sm90.cuh
around CUTLASS's conv collectives, conv2d_sm90.cu one configuration per unit).  Three operators, each compiled on
first use per shape class:
- fprop  y  = x * w          implicit GEMM  M = N*P*Q, N = K, GEMM-K = C*R*S   (+ bias fused in the epilogue)
- dgrad  dx = dy * w^T       implicit GEMM  M = N*H*W, N = C, GEMM-K = K*R*S   (unit stride; see below)
- wgrad  dw = dy^T * x       implicit GEMM  M = K, N = C*R*S, GEMM-K = N*P*Q   (split-K into fp32 slices that
                                                one NVRTC kernel sums into dw; one slice: dw stored directly)
Filter size, stride, padding and dilation reach the kernel at run time (encoded into the TMA im2col descriptors
on the host), so one compiled kernel serves many layers; the shape class still names them, with the dtype, the
channel alignment and the plan (tile or cluster, split count, im2col, flat store) picked for the GEMM shape by
cost models fitted to the op's own benchmark sweeps (conv2d_costs.py).

Strided dgrad.  Both kernel families take unit-stride dgrad only.  A stride-s dgrad is split into s_h*s_w
phases: the rows h = a (mod s) of dx receive only the filter taps r with (a + pad - r*dil) = 0 (mod s), and
over those rows dgrad is a unit-stride dgrad with that sub-filter (dilation dil/gcd(s, dil), its own
padding).  Each phase writes every s-th pixel of dx through a strided output view; rows that no tap reaches
are zero.  `dgrad_phases` is pure and tested against torch on the CPU.

Channels that are not a multiple of 8 (TMA needs 16-byte aligned strides): C and K are zero-padded to the next
multiple of 8 in copies of x, w (and dy), and the output is computed at the padded width and copied into the
channels_last result.  Cost: one extra pass over x and the output, plus the GEMM work of the padded channels.
Aligned channels take none of this.  Layers with at most 16 (padded) input channels, like the 7x7 stem (C=3),
run fprop and wgrad as a 1x1 conv over an explicit im2col matrix instead, and dgrad as the matrix's gradient
(a 1x1 conv with fp32 output) summed into dx by col2im; both transforms are NVRTC kernels (see
IM2COL_MAX_CHANNELS).  A strided fprop or wgrad (the stem) folds only `stride` filter rows into the matrix and
convolves the rest (_plan_fold).

Patchify.  Stride equal to the filter size, padding 0, dilation 1, groups 1 (ViT's 16x16 stride-16 patch embedding)
is one GEMM over non-overlapping patches, (N*P*Q, C*R*S) x weight (K, C*R*S)^T + bias: one copy of x into that
matrix, then jitops.linear (backward: jitops.gemm), in linear's dtypes (CUDA fp16/bf16, the CPU dtypes).  The conv
kernels build only with nvcc, about 96 s for ViT-B/16's patch embedding (fprop, dgrad, wgrad: its first training
step on an empty cache waited 47.9 s); linear's sm_90a GEMM compiles through NVRTC in 0.3-2 s.  The output is
channels_last memory as above; grad_x is channels_last only for a channels_last x.  1x1 stride-1 convs stay on the
conv kernels (conv2d_plan.takes_patches says why; conv2d_run.run_patchify runs the rest).

CPU (and CUDA GPUs older than Hopper): ATen (torch.nn.functional.conv2d and torch.nn.grad), with the same
channels_last output contract, so CI exercises the shape classes, fake kernels, autograd, opcheck and
torch.compile.  CPU dtypes: fp32, fp64, fp16, bf16.
"""
from __future__ import annotations

import torch

from .. import light_conv, shapes
from ..config import config
from ..op import Impl, op, public
from ..specs import CudaKernel, CudaLibrary, Source, Target
from .conv2d_plan import (ALIGN, TILE_K, TILES, ConvClass, _ceil, _geometry, _pair, _plan_fold, _prewarm_items,
                          _uses_im2col, cached_class, light_cluster, output_size, plan_gemm, plan_wgrad, round_up,
                          takes_patches, wgrad_direct)
from .conv2d_run import (_channels_last_like, native_conv2d, patchify_calls, run_cpu, run_cuda, run_input_grad_cpu,
                         run_input_grad_cuda, run_patchify, run_weight_grad_cpu, run_weight_grad_cuda)

CUDA_DTYPES = (torch.float16, torch.bfloat16)
CPU_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
CHANNELS_LAST = torch.channels_last
_FLOAT32 = torch.float32


# ---- arguments ---------------------------------------------------------------------------------------------
def _check_rank(op_name: str, name: str, t: torch.Tensor, what: str) -> None:
    if t.dim() != 4:
        raise ValueError(f"jitops.{op_name}: argument '{name}' must be 4-D {what}, got shape {tuple(t.shape)}")


def _check_dtype(op_name: str, pairs) -> None:
    first_name, first = pairs[0]
    allowed = CPU_DTYPES if first.is_cpu else CUDA_DTYPES
    if first.dtype not in allowed:
        shapes.check_dtype(op_name, first_name, first, allowed)
    for name, t in pairs[1:]:
        if t is not None and t.dtype != first.dtype:
            shapes.check_same_dtype(op_name, (first_name, first), (name, t))


# ---- kernels -----------------------------------------------------------------------------------------------
_ARGS = ("ptr", "ptr", "ptr", "ptr", *["i32"] * 15, "i64", "i64", "i64", "i32", "i32", "i32", "ptr")
_FUNCTIONS = {"jitops_conv2d": (_ARGS, "i32"), "jitops_conv2d_info": (("i32",), "i32")}
CONV_SPECS = {name: CudaLibrary(f"conv2d_{name}", Source.file("conv/conv2d_sm90.cu"), functions=_FUNCTIONS,
                                arch_specific=True)
              for name in ("fprop", "dgrad", "wgrad", "wgrad_direct", "fprop_splitk", "dgrad_splitk")}
_OPERATOR_CODE = {"fprop": 0, "dgrad": 1, "wgrad": 2}
_ELEMENT = {torch.float16: "cutlass::half_t", torch.bfloat16: "cutlass::bfloat16_t"}


def _request(name: str, cls: ConvClass, target: Target, fp32_out: bool = False):
    """The library of operator `name` for the class; fp32_out: the split-K form (fp32 slices) even unsplit."""
    if target.capability is None or target.capability[0] != 9:
        return {}  # the kernels need Hopper (wgmma, TMA im2col): other GPUs run ATen (cuDNN), see _aten_fallback
    if config.conv2d_sm90_kernel == "light" and light_conv.unsupported(name, cls, fp32_out) is None:
        direct = name == "wgrad" and wgrad_direct(cls)
        return {"wgrad_direct" if direct else name: light_conv.request(name, cls, fp32_out, direct)}
    tile = TILES[cls.tile]
    split = fp32_out or (name != "wgrad" and cls.splits > 1)
    defines = dict(CONV_OP=_OPERATOR_CODE[name], ELEMENT=_ELEMENT[cls.dtype], TILE_M=tile.m, TILE_N=tile.n,
                   CLUSTER_M=tile.cluster_m, CLUSTER_N=tile.cluster_n, SPLIT_K=int(split))
    if tile.taps > 1:
        defines["TILE_TAPS"] = tile.taps
    if name == "wgrad":
        defines["WGRAD_FLAT"] = int(cls.flat)
    if name == "wgrad" and wgrad_direct(cls):
        return {"wgrad_direct": CONV_SPECS["wgrad_direct"].bind(shapes.dtype_name(cls.dtype), WGRAD_DIRECT=1,
                                                                **defines)}
    spec = CONV_SPECS[f"{name}_splitk" if split else name]
    return {name: spec.bind(shapes.dtype_name(cls.dtype), **defines)}


def _no_kernels(cls: ConvClass, target: Target):
    return {}  # the CPU path is ATen


# The im2col matrix is built by one NVRTC kernel (kernels/conv/im2col.cu) that reads x through its strides.
IM2COL = CudaKernel("conv2d_im2col", Source.file("conv/im2col.cu"), "jitops::conv2d_im2col<{T}>",
                    "ptr ptr i64 i32 i32 i32 i32 i32 i32 i32 i64 i64 i64 i64 i32 i32 i32 i32 i32 i32 i32 i32")

# dgrad of those layers: the columns' gradient dy . W in fp32 as a 1x1 conv (the fprop kernel's split-K form),
# then this gather sums them into dx.
COL2IM = CudaKernel("conv2d_col2im", Source.file("conv/im2col.cu"), "jitops::conv2d_col2im<{T}, float>",
                    "ptr ptr i64 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32")


def _with_im2col(kernels: dict, cls: ConvClass) -> dict:
    if kernels and cls.im2col:
        kernels["im2col"] = IM2COL.bind(shapes.dtype_name(cls.dtype), T=shapes.CUDA_TYPES[cls.dtype])
    return kernels


# ---- jitops::conv2d_input_grad: dx from dy and w ----------------------------------------------------------------
def _grad_class(op_name: str, grad: torch.Tensor, other: torch.Tensor, other_name: str, size, stride, padding,
                dilation, which: str) -> ConvClass:
    _check_rank(op_name, "grad", grad, "[N, K, P, Q]")
    _check_rank(op_name, other_name, other, "")
    _check_dtype(op_name, [("grad", grad), (other_name, other)])
    stride, padding, dilation = _geometry(op_name, stride, padding, dilation)
    size = tuple(int(s) for s in size)
    if len(size) != 4:
        raise ValueError(f"jitops.{op_name}: argument '{which}_size' must have 4 entries, got {size}")
    if which == "input":
        n, c, h, w = size
        k, _, r, s = other.shape
    else:
        k, c, r, s = size
        n, _, h, w = other.shape
    expected = (n, k, output_size(h, r, stride[0], padding[0], dilation[0]),
                output_size(w, s, stride[1], padding[1], dilation[1]))
    if tuple(grad.shape) != expected:
        raise ValueError(f"jitops.{op_name}: argument 'grad' has shape {tuple(grad.shape)}, expected {expected} "
                         "(the conv2d output's shape)")
    aligned = c % ALIGN == 0 and k % ALIGN == 0
    if grad.is_cpu:
        return ConvClass(grad.dtype, (r, s), stride, padding, dilation, aligned, "")
    if which == "input" and _uses_im2col(c, r, s):  # through the columns' gradient (a 1x1 fprop) and col2im
        p, q = expected[2], expected[3]
        tile, _ = plan_gemm("fprop", n * p * q, round_up(c * r * s), _ceil(round_up(k), TILE_K))
        return ConvClass(grad.dtype, (r, s), stride, padding, dilation, aligned, tile, 1, True)
    if which == "input":  # a strided dgrad runs stride_h * stride_w phases of about this size each
        m = n * _ceil(h, stride[0]) * _ceil(w, stride[1])
        k_tiles = _ceil(round_up(k), TILE_K) * _ceil(r, stride[0]) * _ceil(s, stride[1])
        tile, splits = plan_gemm("dgrad", m, round_up(c), k_tiles)
        return ConvClass(grad.dtype, (r, s), stride, padding, dilation, aligned, tile, splits,
                         cluster=light_cluster("dgrad", tile, splits, m, round_up(c), k_tiles, stride))
    else:
        p, q = expected[2], expected[3]
        if _uses_im2col(c, r, s):  # a wgrad over the im2col matrix (_plan_fold)
            fold, tile, splits, flat = _plan_fold("wgrad", n, p, q, k, c, r, s, stride, dilation)
            return ConvClass(grad.dtype, (r, s), stride, padding, dilation, aligned, tile, splits, True, flat, fold)
        tile, splits, flat = plan_wgrad(k, round_up(c), (r, s), _ceil(n * p * q, TILE_K))
        return ConvClass(grad.dtype, (r, s), stride, padding, dilation, aligned, tile, splits, flat=flat,
                         direct=config.conv2d_wgrad_direct and aligned)


def input_grad_shape_class(grad, weight, input_size, stride, padding, dilation) -> ConvClass:
    return cached_class(_grad_class, "conv2d_input_grad", grad, weight, "weight", input_size, stride, padding,
                        dilation, "input")


def input_grad_cuda_kernels(cls: ConvClass, target: Target):
    if cls.im2col:  # the columns' gradient in fp32 as a 1x1 fprop, then col2im sums the taps and rounds once
        kernels = _request("fprop", cls, target, fp32_out=True)
        if kernels:
            kernels["col2im"] = COL2IM.bind(shapes.dtype_name(cls.dtype), T=shapes.CUDA_TYPES[cls.dtype])
        return kernels
    return _request("dgrad", cls, target)


def _input_grad_fake(grad, weight, input_size, stride, padding, dilation):
    return _channels_last_like(tuple(input_size), grad)


conv2d_input_grad = op(
    "jitops::conv2d_input_grad(Tensor grad, Tensor weight, SymInt[4] input_size, int[2] stride=1, "
    "int[2] padding=0, int[2] dilation=1) -> Tensor",
    shape_class=input_grad_shape_class,
    cuda=Impl(input_grad_cuda_kernels, run_input_grad_cuda),
    cpu=Impl(_no_kernels, run_input_grad_cpu),
    fake=_input_grad_fake,
    doc="Gradient of jitops.conv2d with respect to x (channels_last [N, C, H, W]).",
    fallback=run_input_grad_cpu,  # ATen (cuDNN on CUDA) while the kernels compile
)


# ---- jitops::conv2d_weight_grad: dw from dy and x ---------------------------------------------------------------
def weight_grad_shape_class(grad, x, weight_size, stride, padding, dilation) -> ConvClass:
    return cached_class(_grad_class, "conv2d_weight_grad", grad, x, "x", weight_size, stride, padding, dilation,
                        "weight")


# The split slices' sum, cast to dw's dtype and written into its KRSC memory (kernels/conv/wgrad_reduce.cu),
# for plans of two or more slices; one slice is copied into dw by torch.  config.conv2d_wgrad_reduce_kernel=False:
# torch's sum over the slices, then a copy, for every plan (bench_conv2d.py times both).  H100,
# ResNet-50 at batch 32: split layers 0.7-3.4 us faster each with the kernel (L9 28.4 against 31.7 us), unsplit
# ones 1.7-3.8 us slower (L20 40.2 against 36.4: torch's copy moves 4 elements a thread).
WGRAD_REDUCE = CudaKernel("conv2d_wgrad_reduce", Source.file("conv/wgrad_reduce.cu"),
                          "jitops::conv2d_wgrad_reduce<{T}>", "ptr ptr i32 i64 i32 i32 i32")


# A folded wgrad's slices (any number, one included) summed and unfolded into dw's KRSC memory in one kernel
# (kernels/conv/wgrad_unfold.cu): the run is then launches only, which the C++ host path replays.
WGRAD_UNFOLD = CudaKernel("conv2d_wgrad_unfold", Source.file("conv/wgrad_unfold.cu"),
                          "jitops::conv2d_wgrad_unfold<{T}>", "ptr ptr i32 i64 i32 i32 i32 i32 i32 i32")


def weight_grad_cuda_kernels(cls: ConvClass, target: Target):
    kernels = _request("wgrad", cls, target)
    dtype, T = shapes.dtype_name(cls.dtype), shapes.CUDA_TYPES[cls.dtype]
    if kernels and cls.im2col and cls.fold:
        kernels["unfold"] = WGRAD_UNFOLD.bind(dtype, T=T)
    elif kernels and cls.splits > 1:  # a single slice needs no reduction kernel (_reduce_into)
        kernels["reduce"] = WGRAD_REDUCE.bind(dtype, T=T)
    return _with_im2col(kernels, cls)


def _weight_grad_fake(grad, x, weight_size, stride, padding, dilation):
    return _channels_last_like(tuple(weight_size), grad)


conv2d_weight_grad = op(
    "jitops::conv2d_weight_grad(Tensor grad, Tensor x, SymInt[4] weight_size, int[2] stride=1, "
    "int[2] padding=0, int[2] dilation=1) -> Tensor",
    shape_class=weight_grad_shape_class,
    cuda=Impl(weight_grad_cuda_kernels, run_weight_grad_cuda),
    cpu=Impl(_no_kernels, run_weight_grad_cpu),
    fake=_weight_grad_fake,
    doc="Gradient of jitops.conv2d with respect to weight (channels_last [K, C, R, S]).",
    fallback=run_weight_grad_cpu,  # ATen (cuDNN on CUDA) while the kernels compile
)


# ---- jitops::conv2d ----------------------------------------------------------------------------------------------
def shape_class(x, weight, bias, stride, padding, dilation) -> ConvClass:
    return cached_class(_conv_class, "conv2d", x, weight, bias, stride, padding, dilation)


def _conv_class(op_name, x, weight, bias, stride, padding, dilation) -> ConvClass:
    if x.dim() != 4:
        _check_rank("conv2d", "x", x, "[N, C, H, W] (or, through jitops.conv2d, an unbatched [C, H, W])")
    if weight.dim() != 4:
        _check_rank("conv2d", "weight", weight, "[K, C, R, S]")
    _check_dtype("conv2d", [("x", x), ("weight", weight), ("bias", bias)])
    stride, padding, dilation = _geometry("conv2d", stride, padding, dilation)
    n, c, h, w = x.shape
    k, wc, r, s = weight.shape
    if wc != c:
        raise ValueError(f"jitops.conv2d: argument 'weight' has {wc} input channels (shape {tuple(weight.shape)}) "
                         f"but 'x' has {c} channels (shape {tuple(x.shape)}); for a grouped convolution pass "
                         "groups=")
    if bias is not None and tuple(bias.shape) != (k,):
        raise ValueError(f"jitops.conv2d: argument 'bias' has shape {tuple(bias.shape)}, expected ({k},) "
                         "(one value per output channel)")
    p = output_size(h, r, stride[0], padding[0], dilation[0])
    q = output_size(w, s, stride[1], padding[1], dilation[1])
    if p < 1 or q < 1 or r < 1 or s < 1:
        raise ValueError(f"jitops.conv2d: argument 'x' of spatial size {h}x{w} is smaller than the dilated "
                         f"{r}x{s} kernel with padding {padding} and dilation {dilation} (output {p}x{q})")
    aligned = c % ALIGN == 0 and k % ALIGN == 0
    if x.is_cpu:
        return ConvClass(x.dtype, (r, s), stride, padding, dilation, aligned, "")
    if _uses_im2col(c, r, s):
        fold, tile, splits, _ = _plan_fold("fprop", n, p, q, k, c, r, s, stride, dilation)
        return ConvClass(x.dtype, (r, s), stride, padding, dilation, aligned, tile, splits, True, fold=fold)
    k_tiles = _ceil(round_up(c), TILE_K) * r * s
    tile, splits = plan_gemm("fprop", n * p * q, round_up(k), k_tiles)
    return ConvClass(x.dtype, (r, s), stride, padding, dilation, aligned, tile, splits,
                     cluster=light_cluster("fprop", tile, splits, n * p * q, round_up(k), k_tiles))


# The conv over a folded matrix (the stem) takes its filter in the matrix's column order, built by one kernel.
FOLD_WEIGHT = CudaKernel("conv2d_fold_weight", Source.file("conv/fold_weight.cu"),
                         "jitops::conv2d_fold_weight<{T}>", "ptr ptr i32 i32 i32 i32 i32 i32 i32 i32 i64 i64 i64 i64")


def cuda_kernels(cls: ConvClass, target: Target):
    kernels = _with_im2col(_request("fprop", cls, target), cls)
    if kernels and cls.fold:
        kernels["fold_weight"] = FOLD_WEIGHT.bind(shapes.dtype_name(cls.dtype), T=shapes.CUDA_TYPES[cls.dtype])
    return kernels


def fake(x, weight, bias, stride, padding, dilation):
    stride, padding, dilation = _geometry("conv2d", stride, padding, dilation)
    n, _, h, w = x.shape
    k, _, r, s = weight.shape
    return _channels_last_like((n, k, output_size(h, r, stride[0], padding[0], dilation[0]),
                                output_size(w, s, stride[1], padding[1], dilation[1])), x)


# ---- autograd: dgrad for x, wgrad for weight, a reduction for bias; each only when needed ----------------------
def setup_context(ctx, inputs, output) -> None:
    x, weight, bias, stride, padding, dilation = inputs
    ctx.geometry = (stride, padding, dilation)
    ctx.input_size = tuple(x.shape)
    ctx.weight_size = tuple(weight.shape)
    need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    ctx.save_for_backward(x if need_w else None, weight if need_x else None)


def backward(ctx, grad: torch.Tensor):
    x, weight = ctx.saved_tensors
    stride, padding, dilation = ctx.geometry
    dx = dw = db = None
    if ctx.needs_input_grad[0]:
        dx = conv2d_input_grad(grad, weight, ctx.input_size, stride, padding, dilation)
    if ctx.needs_input_grad[1]:
        dw = conv2d_weight_grad(grad, x, ctx.weight_size, stride, padding, dilation)
    if ctx.needs_input_grad[2]:
        db = grad.sum(dim=(0, 2, 3))
    return dx, dw, db


# Manifest items for `cache_tools prewarm --all-builtin`: ResNet-50's conv layers.
PREWARM = _prewarm_items()


def companions(x, weight, bias, stride, padding, dilation, *, needs):
    """The backward's calls (see backward above), for manifests and prefetching: dy shaped like the output."""
    if not (needs[0] or needs[1]):
        return []
    (n, _, h, w), (k, _, r, s) = x.shape, weight.shape
    st, pad, dil = _geometry("conv2d", stride, padding, dilation)
    grad = shapes.placeholder(x, (n, k, output_size(h, r, st[0], pad[0], dil[0]),
                                  output_size(w, s, st[1], pad[1], dil[1])))
    calls = []
    if needs[0]:
        calls.append((conv2d_input_grad, (grad, weight, list(x.shape), stride, padding, dilation)))
    if needs[1]:
        calls.append((conv2d_weight_grad, (grad, x, list(weight.shape), stride, padding, dilation)))
    return calls


_conv2d = op(
    "jitops::conv2d(Tensor x, Tensor weight, Tensor? bias=None, int[2] stride=1, int[2] padding=0, "
    "int[2] dilation=1) -> Tensor",
    shape_class=shape_class,
    cuda=Impl(cuda_kernels, run_cuda),
    cpu=Impl(_no_kernels, run_cpu),
    fake=fake,
    setup_context=setup_context,
    backward=backward,
    companions=companions,
    doc=__doc__,
    fallback=run_cpu,  # ATen (cuDNN on CUDA) while the kernels compile
)


# ---- the public function: torch's argument forms, reduced to what the op takes --------------------------------
def _same_padding(weight, stride, dilation) -> tuple[tuple[int, int], list[int]]:
    """padding="same": (symmetric padding, F.pad's [left, right, top, bottom] for the odd extra row/column).
    The dilated kernel's extent minus one, d * (k - 1), is split in two; an odd remainder goes at the end
    (bottom, right), as torch's _convolution_same puts it."""
    if _pair("conv2d", "stride", stride) != (1, 1):
        raise ValueError(f"jitops.conv2d: argument 'padding' is 'same' but 'stride' is {stride!r}; torch and jitops "
                         "take padding='same' for stride 1 only: give the padding as ints")
    if not isinstance(weight, torch.Tensor):
        shapes.check_tensor("conv2d", "weight", weight)
    if weight.dim() != 4:
        _check_rank("conv2d", "weight", weight, "[K, C, R, S]")
    dilation = _geometry("conv2d", 1, 0, dilation)[2]
    total = [dilation[i] * (weight.shape[2 + i] - 1) for i in range(2)]
    extra = [0, total[1] % 2, 0, total[0] % 2]
    return (total[0] // 2, total[1] // 2), extra if any(extra) else []


def _aten_conv2d(x, weight, bias, stride, padding, dilation, groups):
    """groups != 1 (grouped, depthwise) and float32 on CUDA: ATen's F.conv2d (cuDNN on CUDA, TF32 as
    torch.backends.cudnn.allow_tf32 says), output channels_last as jitops.conv2d's (4-D x; a no-op where ATen
    made it so).  A documented fallback (docs/semantics.md) until jitops has its own kernels for these."""
    shapes.check_tensor("conv2d", "x", x)
    shapes.check_tensor("conv2d", "weight", weight)
    if type(groups) is not int or groups < 1 or x.dim() not in (3, 4) or weight.dim() != 4 or \
            x.shape[-3] != weight.shape[1] * groups:
        raise ValueError(f"jitops.conv2d: argument 'groups' is {groups!r} with x of shape {tuple(x.shape)} and weight "
                         f"of shape {tuple(weight.shape)}; groups must be a positive int with x's channels = groups "
                         "x weight's input channels")
    shapes.check_dtype("conv2d", "x", x, CPU_DTYPES if x.is_cpu else CUDA_DTYPES + (torch.float32,))
    shapes.check_same_dtype("conv2d", ("x", x), ("weight", weight), ("bias", bias))
    y = torch.nn.functional.conv2d(x, weight, bias, stride, padding, dilation, groups)
    return y.contiguous(memory_format=CHANNELS_LAST) if y.dim() == 4 else y


def _patch_filter(x, weight, bias, stride, padding, dilation) -> tuple[int, int] | None:
    """(R, S) where this groups-1 call convolves non-overlapping patches (takes_patches) with arguments the op
    accepts, in a dtype jitops.linear runs on x's device; else None: the conv op runs it (and names a bad one)."""
    if not isinstance(weight, torch.Tensor) or weight.dim() != 4:
        return None
    _, c, r, s = weight.shape
    if not takes_patches(r, s, stride, padding, dilation):  # first: it turns most convs away in under a microsecond
        return None
    if not isinstance(x, torch.Tensor) or x.dim() not in (3, 4) or weight.dtype is not x.dtype or \
            x.dtype not in (CPU_DTYPES if x.is_cpu else CUDA_DTYPES) or weight.device != x.device or \
            x.shape[-3] != c or x.shape[-2] < r or x.shape[-1] < s or \
            (bias is not None and (not isinstance(bias, torch.Tensor) or bias.dtype is not x.dtype or
                                   bias.device != x.device or tuple(bias.shape) != (weight.shape[0],))):
        return None
    return r, s


def _public_calls(entry, args, grad):
    """What conv2d() below calls, for a call given as jitops::conv2d's arguments (x 4-D)."""
    size = _patch_filter(*args)
    return [(entry, args)] if size is None else patchify_calls(args[0], args[1], args[2], *size)


def _op_call(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """(jitops::conv2d's arguments, whether x is unbatched) for a call of jitops.conv2d (groups 1)."""
    if groups != 1:
        raise ValueError(f"jitops.conv2d: argument 'groups' is {groups!r}; grouped and depthwise convolutions run "
                         "through ATen (docs/semantics.md) and build no jitops kernel")
    if type(padding) is str:
        if padding == "valid":
            padding = 0
        elif padding == "same":
            padding, extra = _same_padding(weight, stride, dilation)
            if extra and isinstance(x, torch.Tensor):
                x = torch.nn.functional.pad(x, extra)
        else:
            raise ValueError(f"jitops.conv2d: argument 'padding' is {padding!r}; use an int, a pair of ints, "
                             "'same' or 'valid'")
    unbatched = isinstance(x, torch.Tensor) and x.dim() == 3
    if unbatched:  # [C, H, W]: a batch of one
        x = x.unsqueeze(0)
    return (x, weight, bias, stride, padding, dilation), unbatched


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    if groups == 1:
        size = _patch_filter(x, weight, bias, stride, padding, dilation)
        if size is not None:  # a conv over non-overlapping patches: one jitops.linear call
            return run_patchify(x, weight, bias, *size)
        if (y := native_conv2d(x, weight, bias, stride, padding, dilation)) is not None:  # the C++ host path
            return y
    if groups == 1 and type(padding) is not str and (not isinstance(x, torch.Tensor) or
                                                    x.dim() != 3 and (x.dtype is not _FLOAT32 or x.is_cpu)):
        return _conv2d(x, weight, bias, stride, padding, dilation)  # the op's own arguments
    if groups != 1 or (isinstance(x, torch.Tensor) and x.dtype is _FLOAT32 and not x.is_cpu):
        return _aten_conv2d(x, weight, bias, stride, padding, dilation, groups)
    args, unbatched = _op_call(x, weight, bias, stride, padding, dilation, groups)
    y = _conv2d(*args)
    return y.squeeze(0) if unbatched else y


conv2d.__doc__ = __doc__
conv2d.op = _conv2d.op  # type: ignore[attr-defined]
# calls: a patchify call makes jitops.linear's calls.  linear is not among parts: it is a public op of its own.
public("conv2d", conv2d, entries=(_conv2d,), parts=(conv2d_input_grad, conv2d_weight_grad), calls=_public_calls,
       bind=lambda *args, **kwargs: (_conv2d, _op_call(*args, **kwargs)[0]))
