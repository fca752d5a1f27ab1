"""jitops.gemm(a, b, *, bias=None, activation=None | "relu" | "gelu" | "gelu_tanh", out_dtype=None)

    out = act(a @ b + bias)        a: (M, K), b: (K, N), bias: (N,), out: (M, N) row-major

bf16 and fp16 on CUDA, accumulating in fp32; out_dtype is the inputs' dtype (default) or float32.  The bias and
the activation run in the GEMM's epilogue ("gelu" is the exact erf form, torch's default; "gelu_tanh" is
F.gelu(approximate="tanh")).

Operands as torch.matmul takes them: 1-D (a vector: a row of a, a column of b, its dimension dropped from the
output), N-D with broadcast batch dimensions, empty dimensions; gradients as torch's, summed over broadcast
dimensions.  Which implementation runs a CUDA call (cuda_route):
- "kernel": bf16/fp16 operands that fold into one 2-D GEMM, i.e. b is 2-D (or 1-D, or its batch dimensions are
  all 1) and a is (..., K): jitops' 2-D kernels on a as (M = its leading sizes' product, K), the same shape
  classes and cache keys as a 2-D call; a is viewed, not copied, when its leading dimensions collapse (any
  contiguous a does).
- "cublas_batched": bf16/fp16 with batch dimensions on b (bmm, attention-style products): ATen's torch.matmul,
  i.e. cuBLAS's strided-batched GEMM, one launch for the whole batch (jitops' own batched kernel is future work;
  a loop over the 2-D kernel would pay one launch an item).
- "cublas_tf32" / "cublas_fp32": float32 operands, any shape: ATen's torch.matmul (cuBLAS), TF32 tensor cores
  when torch.backends.cuda.matmul.allow_tf32 (torch.set_float32_matmul_precision("high" or "medium")) allows
  them, full fp32 otherwise, as torch itself decides (jitops' own TF32/fp32 kernel is future work).

Layouts come from the strides: each operand may be row- or column-major (a transposed view such as `w.t()`
costs no copy), with any leading dimension.  Only a view with no unit stride (e.g. `x[::2, ::2]`) is copied.

Kernels (sources in kernels/gemm/):
- sm_90: CUTLASS 3 warp-specialized TMA + wgmma kernels, the kernel alone compiled by NVRTC for sm_90a with
  -DNDEBUG; its host side (TMA descriptors through cuTensorMapEncodeTiled, the tile scheduler's parameters, the
  cluster launch) is Python's, jitops/cutlass_host.py, checked byte for byte against CUTLASS's host code.  One
  configuration per translation unit.  TMA needs 16-byte aligned rows and addresses; other shapes take the
  sm_80 kernels below.
- sm_80, sm_86, sm_89 (and unaligned shapes on sm_90): CUTLASS 2 tensor-op kernels compiled by NVRTC in seconds;
  a __global__ wrapper builds CUTLASS 2's Params on the device, so there is no host code to compile.  An
  alignment class (8, 4, 2 or 1 elements) serves K or N that are not multiples of 8.

The shape class is (dtype, out dtype, the two operand majors, alignment class, size bucket, fused epilogue,
kernel family).  The size bucket picks the tile shape and schedule (gemm_plan.py); the bias and
activation are run-time arguments of one "fused" kernel per configuration, so they add one build, not four.

Backward: dA = dC . B^T and dB = A^T . dC with the same kernels, the transposes being stride views (no copies);
only the gradients that are needed are computed.  relu's mask comes from the saved output.  For "gelu" with a
gradient needed, jitops.gemm runs the GEMM with the bias fused, keeps that pre-activation and applies
jitops.gelu: one extra elementwise pass in the forward instead of a second GEMM in the backward (the op itself,
reached directly through torch.ops, recomputes the pre-activation instead).  The first call that needs a
gradient also starts compiling the backward's kernels in background threads while the forward runs.

CPU: a reference path through ATen (torch.matmul in fp32, or fp64 for fp64 inputs), so CI exercises the op's
registration and autograd wiring without a GPU; it accepts fp64, fp32, bf16 and fp16.
"""
from __future__ import annotations

import math

import torch

from .. import light_gemm, shapes
from ..config import config as settings
from ..op import Impl, op, public
from ..specs import CudaKernel, CudaLibrary, Source, Target
from .gelu import gelu, gelu_backward
from .gemm_plan import (ACTIVATIONS, BUCKET_EXAMPLES, CPU_DTYPES, CUDA_ACCEPTED, CUDA_DTYPES, GELU_APPROXIMATE,
                        INT32_MAX, KERNEL, SM90_CONFIGS, GemmClass, Sm80Config, Sm90Config, _folded_layout, _folds,
                        _layout, allow_tf32, aten_class, batch_shape, class_from_layouts, cuda_route, layout_of,
                        out_shape, sm80_config)
from .gemm_run import launch, reads_short_b, run_cpu, run_cuda, torch_gemm

CUTLASS_TYPES = {torch.bfloat16: "cutlass::bfloat16_t", torch.float16: "cutlass::half_t", torch.float32: "float"}


# ---- shape class ----------------------------------------------------------------------------------------------
def _check(a, b, bias, activation, out_dtype) -> None:
    """The slow path of the shape class: say exactly what is wrong, naming the argument."""
    shapes.check_tensor("gemm", "a", a)
    shapes.check_tensor("gemm", "b", b)
    if bias is not None:
        shapes.check_tensor("gemm", "bias", bias)
    if activation not in ACTIVATIONS:
        raise ValueError(f"jitops.gemm: argument 'activation' is {activation!r}; use None, 'relu', 'gelu' or "
                         "'gelu_tanh'")
    for name, t in (("a", a), ("b", b)):
        if t.dim() == 0:
            raise ValueError(f"jitops.gemm: argument '{name}' is a 0-d tensor; like torch.matmul, jitops.gemm takes "
                             "operands of one dimension or more (multiply by a scalar with *)")
    k, kb = a.shape[-1], b.shape[0] if b.dim() == 1 else b.shape[-2]
    if k != kb:
        raise ValueError(f"jitops.gemm: K mismatch: argument 'a' has shape {tuple(a.shape)} (K = {k}) but 'b' has "
                         f"shape {tuple(b.shape)} (K = {kb}); b must be (..., K, N) or (K,)")
    if batch_shape(a, b) is None:
        raise ValueError(f"jitops.gemm: the batch dimensions of argument 'a' {tuple(a.shape[:-2])} and 'b' "
                         f"{tuple(b.shape[:-2])} do not broadcast (shapes {tuple(a.shape)} and {tuple(b.shape)})")
    allowed = CPU_DTYPES if a.is_cpu else CUDA_ACCEPTED
    shapes.check_dtype("gemm", "a", a, allowed)
    shapes.check_same_dtype("gemm", ("a", a), ("b", b), ("bias", bias))
    if bias is not None and b.dim() == 1:
        raise ValueError("jitops.gemm: argument 'bias' is given but 'b' is 1-D (a vector): the output has no "
                         "column dimension to add a bias to; add it to the result instead")
    if bias is not None and tuple(bias.shape) != (b.shape[-1],):
        raise ValueError(f"jitops.gemm: argument 'bias' has shape {tuple(bias.shape)}, expected ({b.shape[-1]},): "
                         "one value per output column")
    if out_dtype is not None and out_dtype not in (a.dtype, torch.float32):
        raise TypeError(f"jitops.gemm: argument 'out_dtype' is {out_dtype}; use None (the inputs' dtype "
                        f"{a.dtype}) or torch.float32")
    m = math.prod(a.shape[:-1]) if _folds(b) else max(a.shape[-2:-1], default=1)
    if max(m, k, b.shape[-1]) > INT32_MAX:
        raise ValueError(f"jitops.gemm: M, N and K must each be below 2**31, got {tuple(a.shape)} x "
                         f"{tuple(b.shape)}")
    raise AssertionError("jitops.gemm: _check found nothing wrong")  # pragma: no cover - callers saw a problem


def shape_class(a, b, bias, activation, out_dtype) -> GemmClass:
    # Runs on every call: plain comparisons first, _check (which builds the messages) only on failure.
    if (type(a) is not torch.Tensor and not isinstance(a, torch.Tensor)) or \
            (type(b) is not torch.Tensor and not isinstance(b, torch.Tensor)) or \
            a.dim() != 2 or b.dim() != 2 or activation not in ACTIVATIONS:
        return _matmul_class(a, b, bias, activation, out_dtype)
    m, k = a.shape
    k2, n = b.shape
    dtype = a.dtype
    out = dtype if out_dtype is None else out_dtype
    if k != k2 or b.dtype != dtype or (bias is not None and (bias.dtype != dtype or bias.shape != (n,))) or \
            (out is not dtype and out is not torch.float32) or m > INT32_MAX or n > INT32_MAX or k > INT32_MAX:
        _check(a, b, bias, activation, out_dtype)
    fused = bias is not None or activation is not None
    if a.is_cpu:
        return _CPU_CLASSES.get((dtype, out, fused)) or _cpu_class(a, b, bias, activation, out_dtype, fused)
    if dtype is not torch.bfloat16 and dtype is not torch.float16:
        return _matmul_class(a, b, bias, activation, out_dtype)
    if not (m and n and k):  # nothing to multiply: run_cuda needs no kernel
        return GemmClass(dtype, out, True, True, 8, "empty", fused, "auto")
    return class_from_layouts(dtype, out, m, n, k, a, _layout(a, m, k), b, _layout(b, k, n), bias, fused)


_CPU_CLASSES: dict = {}  # (dtype, out dtype, fused) -> its class: built once, not on every CPU call


def _cpu_class(a, b, bias, activation, out_dtype, fused: bool) -> GemmClass:
    if a.dtype not in CPU_DTYPES:
        _check(a, b, bias, activation, out_dtype)
    out = a.dtype if out_dtype is None else out_dtype
    cls = _CPU_CLASSES[(a.dtype, out, fused)] = GemmClass(a.dtype, out, True, True, 1, "cpu", fused, "cpu")
    return cls


def _matmul_class(a, b, bias, activation, out_dtype) -> GemmClass:
    """The class of every call but a 2-D one in 16 bits (or on the CPU): torch.matmul's operand forms (1-D, N-D,
    broadcast batch dimensions), and float32 on CUDA.  A call that folds into one 2-D GEMM gets the class of that
    2-D problem, so it shares its kernels."""
    if (type(a) is not torch.Tensor and not isinstance(a, torch.Tensor)) or \
            (type(b) is not torch.Tensor and not isinstance(b, torch.Tensor)) or \
            a.dim() == 0 or b.dim() == 0 or activation not in ACTIVATIONS:
        _check(a, b, bias, activation, out_dtype)
    k = a.shape[-1]
    n = b.shape[-1] if b.dim() > 1 else 1
    dtype = a.dtype
    out = dtype if out_dtype is None else out_dtype
    if k != (b.shape[0] if b.dim() == 1 else b.shape[-2]) or b.dtype != dtype or \
            (bias is not None and (b.dim() == 1 or bias.dtype != dtype or bias.shape != (n,))) or \
            (out is not dtype and out is not torch.float32):
        _check(a, b, bias, activation, out_dtype)
    if batch_shape(a, b) is None:
        _check(a, b, bias, activation, out_dtype)
    fused = bias is not None or activation is not None
    if a.is_cpu:
        return _CPU_CLASSES.get((dtype, out, fused)) or _cpu_class(a, b, bias, activation, out_dtype, fused)
    folds = _folds(b)
    route = cuda_route(dtype, not folds, dtype is torch.float32 and allow_tf32())
    if route is None:
        _check(a, b, bias, activation, out_dtype)
    if route != KERNEL:
        return aten_class(dtype, out, route, fused)
    m = math.prod(a.shape[:-1])
    if m > INT32_MAX or n > INT32_MAX or k > INT32_MAX:
        _check(a, b, bias, activation, out_dtype)
    if not (m and n and k):
        return GemmClass(dtype, out, True, True, 8, "empty", fused, "auto")
    la = _folded_layout(a, m, k)  # None: run_cuda copies a to a contiguous (M, K)
    if b.dim() == 2:
        lb = _layout(b, k, n)
    else:  # a column (K, 1), or (..., K, N) with batch dimensions all 1: the last two dimensions' strides
        lb = layout_of(b.stride(-1), 1, k, 1) if b.dim() == 1 else layout_of(b.stride(-2), b.stride(-1), k, n)
    return class_from_layouts(dtype, out, m, n, k, a, la, b, lb, bias, fused)


# ---- kernels --------------------------------------------------------------------------------------------------
# The sm_90a kernel, compiled by NVRTC (kernels/gemm/sm90_gemm_kernel.cu); its host side is Python's
# (jitops/cutlass_host.py): nvcc's host half (cudafe++ and gcc over CUTLASS's host code) was about a third of a
# 70 s build on 2 cores (docs/benchmarks.md, "CUTLASS 3 through NVRTC").
SM90_GEMM = CudaKernel(
    "gemm_sm90", Source.file("gemm/sm90_gemm_kernel.cu"), "cutlass::device_kernel<jitops_gemm::GemmKernel>", (),
    arch_specific=True, defines=True)
# The same kernel with CUTLASS's own host code, built by nvcc into a C library: the reference of the GPU test
# that compares the two bit for bit, and the stream-K scheduler of bench_gemm's sweeps (whose host logic the
# Python side does not mirror).
SM90_GEMM_REFERENCE = CudaLibrary(
    "gemm_sm90_reference", Source.file("gemm/sm90_gemm.cu"),
    functions={
        "jitops_gemm_run": (("ptr", "ptr", "ptr", "ptr", "i32", "i32", "i32", "i64", "i64", "i64", "i32", "i32",
                             "i32", "i32", "i32", "i32", "ptr", "ptr"), "i32"),
        "jitops_gemm_workspace": (("i32", "i32", "i32", "i32", "i32", "i32", "i32", "i32"), "i64"),
    },
    arch_specific=True)
SM80_GEMM = CudaKernel(
    "gemm_sm80", Source.file("gemm/sm80_gemm.cu"),
    "jitops_gemm::gemm_sm80<{T}, {OUT}, {A_KMAJOR}, {B_KMAJOR}, {TM}, {TN}, {TK}, {WM}, {WN}, {WK}, {STAGES}, "
    "{ALIGN}, {SMEM}>",
    "ptr ptr ptr ptr i32 i32 i32 i64 i64 i64 i32")


def _sm90_params(cls: GemmClass, config: Sm90Config) -> dict:
    (tm, tn, tk), (cm, cn) = config.tile, config.cluster
    return dict(
        GEMM_T=CUTLASS_TYPES[cls.dtype], GEMM_OUT=CUTLASS_TYPES[cls.out_dtype],
        GEMM_A_KMAJOR=int(cls.a_kmajor), GEMM_B_KMAJOR=int(cls.b_kmajor), GEMM_TILE_M=tm, GEMM_TILE_N=tn,
        GEMM_TILE_K=tk, GEMM_CLUSTER_M=cm, GEMM_CLUSTER_N=cn, GEMM_PINGPONG=int(config.pingpong),
        GEMM_STREAMK=int(config.streamk), GEMM_FUSED=int(cls.fused))


def sm90_request(cls: GemmClass, config: Sm90Config):
    """The NVRTC build; a stream-K configuration (bench_gemm's sweeps) gets the nvcc library, whose host code
    has CUTLASS's stream-K logic."""
    if config.streamk:
        return sm90_reference_request(cls, config)
    return SM90_GEMM.bind(shapes.dtype_name(cls.dtype), **_sm90_params(cls, config))


def sm90_reference_request(cls: GemmClass, config: Sm90Config):
    """The nvcc-built library of the same kernel with CUTLASS's host code (bit-for-bit reference)."""
    return SM90_GEMM_REFERENCE.bind(shapes.dtype_name(cls.dtype), **_sm90_params(cls, config))


def sm80_request(cls: GemmClass, config: Sm80Config):
    (tm, tn, tk), (wm, wn, wk) = config.tile, config.warp
    return SM80_GEMM.bind(
        shapes.dtype_name(cls.dtype), T=CUTLASS_TYPES[cls.dtype], OUT=CUTLASS_TYPES[cls.out_dtype],
        A_KMAJOR=str(cls.a_kmajor).lower(), B_KMAJOR=str(cls.b_kmajor).lower(), TM=tm, TN=tn, TK=tk, WM=wm,
        WN=wn, WK=wk, STAGES=config.stages, ALIGN=cls.align, SMEM=config.smem_bytes())


def uses_sm90(cls: GemmClass, target: Target) -> bool:
    return cls.family == "auto" and target.capability is not None and target.capability[0] == 9 and cls.align == 8


def cuda_kernels(cls: GemmClass, target: Target):
    if cls.bucket == "empty" or cls.family == "aten":  # nothing to multiply, or cuBLAS (cuda_route)
        return {}
    if uses_sm90(cls, target):
        if settings.gemm_sm90_kernel == "light" and light_gemm.unsupported(cls) is None:  # the default
            return {"sm90_light": light_gemm.request(cls)}
        return {"sm90": sm90_request(cls, SM90_CONFIGS[cls.bucket])}
    return {"sm80": sm80_request(cls, sm80_config(cls))}


# ---- run: gemm_run.py; here the launch on kernels already loaded, and the CPU's (nothing to compile) ----------
def product_if_loaded(a: torch.Tensor, la: tuple[bool, int], b: torch.Tensor, lb: tuple[bool, int], m: int, n: int,
                      k: int, shape: tuple[int, ...], b_rows: int = 0,
                      load_as: tuple | None = None) -> torch.Tensor | None:
    """a . b as a new tensor of `shape` (M x N elements, row-major), launched straight on the kernels this
    process already loaded for the problem's class; None when they are not loaded (the caller then takes
    jitops.gemm, which loads them), or when b is stored shorter than the problem (b_rows: gemm_run.launch) and
    they cannot read it so.  load_as: the arguments of the jitops.gemm call this product stands for
    (placeholders will do); given, kernels not loaded yet are loaded as that call would load them (Op.load).
    For backward passes on real CUDA tensors they made themselves: no views, no input checks, no routing (the
    linear backward's two GEMMs skip 4 tensor views and two public calls)."""
    cls = class_from_layouts(a.dtype, a.dtype, m, n, k, a, la, b, lb, None, False)
    device = a.get_device()
    kernels = _op.op.loaded(device, cls)
    if kernels is None and load_as is not None:
        kernels = _op.op.load(device, cls, load_as)
    if kernels is None or (b_rows and not reads_short_b(kernels)):
        return None
    out = a.new_empty(shape)
    launch(kernels, a, b, out, None, m, n, k, la[1], lb[1], 0, b_rows)
    return out


def cpu_kernels(cls: GemmClass, target: Target):
    return {}  # ATen: nothing to compile


def fake(a, b, bias, activation, out_dtype):
    return a.new_empty(out_shape(a, b), dtype=out_dtype or a.dtype)


# ---- autograd -------------------------------------------------------------------------------------------------
def setup_context(ctx, inputs, output) -> None:
    a, b, bias, activation, out_dtype = inputs
    ctx.activation = activation
    ctx.out_dtype = out_dtype
    ctx.bias_dtype = bias.dtype if bias is not None else None
    # dA needs B, dB needs A; relu's mask comes from the output; gelu recomputes its pre-activation.  (Only
    # tensors are saved: AOTAutograd drops saved Nones.)
    extra = output if activation == "relu" else bias if activation in GELU_APPROXIMATE and bias is not None else None
    ctx.save_for_backward(a, b, *([] if extra is None else [extra]))


def backward(ctx, grad: torch.Tensor):
    a, b, *extra = ctx.saved_tensors
    out = extra[0] if ctx.activation == "relu" else None
    bias = extra[0] if ctx.activation in GELU_APPROXIMATE and extra else None
    # Under AOTAutograd an omitted trailing bias is not an input at all: pad to (a, b, bias).
    need_a, need_b, need_bias = (tuple(ctx.needs_input_grad) + (False, False, False))[:3]
    if ctx.activation == "relu":
        grad = torch.where(out > 0, grad, torch.zeros((), dtype=grad.dtype, device=grad.device))
    elif ctx.activation in GELU_APPROXIMATE:  # through torch.ops only; jitops.gemm keeps the pre-activation
        z = _op(a, b, bias=bias, out_dtype=ctx.out_dtype)
        approximate = GELU_APPROXIMATE[ctx.activation]
        grad = torch.ops.aten.gelu_backward(grad, z, approximate=approximate) if grad.is_cpu else \
            gelu_backward(grad, z, approximate)
    grad_in = grad if grad.dtype == a.dtype else grad.to(a.dtype)
    if a.dim() == 2 and b.dim() == 2:
        grad_a = _op(grad_in, b.t()) if need_a else None    # (M, N) x (N, K): B^T is a stride view
        grad_b = _op(a.t(), grad_in) if need_b else None    # (K, M) x (M, N): A^T is a stride view
    else:
        grad_a, grad_b = _matmul_grads(grad_in, a, b, need_a, need_b)
    grad_bias = None
    if need_bias:  # summed over every dimension but the last (the output's columns)
        acc = torch.float32 if grad.dtype != torch.float64 else torch.float64
        grad_bias = grad.to(acc) if grad.dim() == 1 else grad.sum(tuple(range(grad.dim() - 1)), dtype=acc)
        grad_bias = grad_bias.to(ctx.bias_dtype)
    return grad_a, grad_b, grad_bias


def _as_matrices(grad, a, b):
    """torch.matmul's operands as (..., M, K) and (..., K, N), and the output gradient as (..., M, N): a 1-D a
    is a row, a 1-D b a column (their dimension is missing from the output)."""
    g = grad.unsqueeze(-1) if b.dim() == 1 else grad
    g = g.unsqueeze(-2) if a.dim() == 1 else g
    return g, (a.unsqueeze(0) if a.dim() == 1 else a), (b.unsqueeze(-1) if b.dim() == 1 else b)


def _matmul_grads(grad, a, b, need_a: bool, need_b: bool):
    """torch.matmul's gradients: dA = dC . B^T and dB = A^T . dC on the matrices, summed over the batch
    dimensions each operand was broadcast along.  Where the call folds into one 2-D GEMM, so do both products:
    dB is one (K, M) x (M, N) GEMM over all of a's rows (the sum over the batch inside the GEMM)."""
    g, a2, b2 = _as_matrices(grad, a, b)
    grad_a = grad_b = None
    if need_a:  # (..., M, N) x (N, K), b2^T a stride view
        grad_a = _summed_product(g, b2.mT, a2.shape).reshape(a.shape)
    if need_b:
        if _folds(b):  # a's rows, all batches at once: (K, rows) x (rows, N)
            k, n = a2.shape[-1], b2.shape[-1]
            rows = math.prod(a2.shape[:-1])
            grad_b = _op(a2.reshape(rows, k).t(), g.reshape(rows, n)).reshape(b.shape)
        else:  # (..., K, M) x (..., M, N), a2^T a stride view
            grad_b = _summed_product(a2.mT, g, b2.shape).reshape(b.shape)
    return grad_a, grad_b


def _wide_dtype(x, y, shape) -> torch.dtype | None:
    """The out_dtype of x . y in a gradient of `shape`: float32 where 16-bit products are summed over broadcast
    batch dimensions afterwards, so that the gradient is rounded once, as torch's (rounding each product first
    put 5 of 50 elements of a bf16 OpInfo sample outside one bf16 rounding of the float64 reference)."""
    if x.dtype in CUDA_DTYPES and math.prod(out_shape(x, y)) != math.prod(shape):  # a real sum, not a view
        return torch.float32
    return None


def _summed_product(x, y, shape) -> torch.Tensor:
    """x . y summed to `shape`: over the batch dimensions the operand of that shape was broadcast along."""
    wide = _wide_dtype(x, y, shape)
    return _op(x, y, out_dtype=wide).sum_to_size(shape).to(x.dtype)


# ---- the backward's calls, for manifests and for compiling them while the forward runs ------------------------
def companions(a, b, bias, activation, out_dtype, *, needs):
    """The GEMMs (and gelu's backward) that backward() above runs, assuming a contiguous (M, N) output gradient."""
    need_a, need_b = needs[0], needs[1]
    calls = []
    shape = out_shape(a, b)
    if activation in GELU_APPROXIMATE and (need_a or need_b or needs[2]):  # the pre-activation, recomputed
        calls.append((_op, (a, b, bias, None, out_dtype)))
        if not a.is_cpu:
            z = shapes.placeholder(a, shape, dtype=out_dtype or a.dtype)
            calls.append((gelu_backward, (shapes.placeholder(z, shape), z, GELU_APPROXIMATE[activation])))
    grad = shapes.placeholder(a, shape)  # the gradient reaches the GEMMs in the inputs' dtype
    if a.dim() == 2 and b.dim() == 2:
        if need_a:
            calls.append((_op, (grad, b.detach().t(), None, None, None)))    # dA = dC . B^T
        if need_b:
            calls.append((_op, (a.detach().t(), grad, None, None, None)))    # dB = A^T . dC
        return calls
    g, a2, b2 = _as_matrices(grad, a.detach(), b.detach())  # as _matmul_grads calls them
    if need_a:
        calls.append((_op, (g, b2.mT, None, None, _wide_dtype(g, b2.mT, a2.shape))))
    if need_b:
        if _folds(b):
            rows = math.prod(a2.shape[:-1])
            calls.append((_op, (shapes.placeholder(a, (rows, a2.shape[-1])).t(),
                                shapes.placeholder(a, (rows, b2.shape[-1])), None, None, None)))
        else:
            calls.append((_op, (a2.mT, g, None, None, _wide_dtype(a2.mT, g, b2.shape))))
    return calls


# ---- declaration ----------------------------------------------------------------------------------------------
_op = op(
    "jitops::gemm(Tensor a, Tensor b, Tensor? bias=None, str? activation=None, ScalarType? out_dtype=None) -> Tensor",
    shape_class=shape_class,
    cuda=Impl(cuda_kernels, run_cuda),
    cpu=Impl(cpu_kernels, run_cpu),
    fake=fake,
    setup_context=setup_context,
    backward=backward,
    keyword_only=("bias", "activation", "out_dtype"),
    companions=companions,
    doc=__doc__,
    fallback=torch_gemm,
)


def gemm(a, b, *, bias=None, activation=None, out_dtype=None):
    try:
        needs_grad = torch.is_grad_enabled() and (a.requires_grad or b.requires_grad or
                                                  (bias is not None and bias.requires_grad))
    except AttributeError:  # not tensors: the op names the argument
        needs_grad = False
    if needs_grad and activation in GELU_APPROXIMATE and not a.is_cpu:
        return gelu(_op(a, b, bias=bias, out_dtype=out_dtype), GELU_APPROXIMATE[activation])
    return _op(a, b, bias=bias, activation=activation, out_dtype=out_dtype)


gemm.__doc__ = __doc__
gemm.op = _op.op  # type: ignore[attr-defined]


def _public_calls(entry, args, grad):
    """What gemm() above calls: with a gradient to record, "gelu" on a GPU runs the GEMM with the bias fused and
    then jitops.gelu on its output."""
    a, b, bias, activation, out_dtype = args
    if grad and activation in GELU_APPROXIMATE and not a.is_cpu:
        z = shapes.placeholder(a, out_shape(a, b), dtype=out_dtype or a.dtype)
        return [(_op, (a, b, bias, None, out_dtype)), (gelu, (z, GELU_APPROXIMATE[activation]))]
    return [(_op, args)]


public("gemm", gemm, entries=(_op,), calls=_public_calls)

# `cache_tools prewarm --all-builtin`: every size bucket (BUCKET_EXAMPLES) in bf16 and fp16, in the layouts of a
# Linear layer's training step -- x @ w.t() (the forward, plain and with a fused bias+activation epilogue), dy @ w
# (the input gradient) and dy.t() @ x (the weight gradient) -- and x @ w with the fused epilogue, the forward of
# transformers' Conv1D, whose weight is stored (K, N) (GPT-2's; its first patched step compiled two kernels the
# list had missed).  Each item is one exact call (grad false: the backward's layouts are listed themselves, not
# derived from one forward's sizes); on sm_90a each is a light kernel through NVRTC (about a second on 2 cores:
# docs/benchmarks.md); `prewarm --all-builtin --list` names them.
def _prewarm_item(m: int, n: int, k: int, layout: str, fused: bool) -> dict:
    a_strides = [1, m] if layout == "tn" else [k, 1]      # dy.t(): a column-major (M, K) view
    b_strides = [1, k] if layout == "nt" else [n, 1]      # w.t(): a column-major (K, N) view
    return {"op": "gemm", "dtypes": ["bf16", "fp16"], "grad": False,
            "shapes": [[[m, k], [k, n], [n] if fused else None]], "strides": [[a_strides, b_strides, None]],
            "kwargs": {"activation": "gelu_tanh" if fused else None, "out_dtype": None}}


PREWARM = [_prewarm_item(m, n, k, layout, fused) for m, n, k in BUCKET_EXAMPLES.values()
           for layout, fused in (("nt", False), ("nt", True), ("nn", False), ("nn", True), ("tn", False))]
