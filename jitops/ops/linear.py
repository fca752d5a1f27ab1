"""jitops.linear(x, weight, bias=None, *, activation=None): F.linear on jitops.gemm's kernels.

    y = act(x . weight^T + bias)      x: (*, K), weight: (N, K), bias: (N,), y: (*, N)

The semantics of torch.nn.functional.linear: any number of leading dimensions (none too: x of shape (K,)), and
gradients for x, weight and bias.  activation is None, "relu", "gelu" (erf) or "gelu_tanh" (approximate="tanh"),
run in the GEMM's epilogue.

Features that are not multiples of 8 (an LM head over GPT-2's 50257 tokens) rule out the TMA kernels, whose
rows must be 16-byte multiples: the CUTLASS 2 kernels that take them, and cuBLAS, run such a layer at a fraction of
the speed (torch.matmul took 3.46 ms for (4096, 1024) x (1024, 50257) bf16 on the H100, 122 TFLOP/s).  Such
a call runs the TMA kernel on the problem padded to N8 (and K8): the weight's N rows read in place as N8 (the
light kernel's loads read zeros past them; CUTLASS's kernels take a zero-padded copy), the output written to an
(M, N8) buffer whose valid columns are copied out, and the backward's dy zero-padded to (M, N8): memory-bound
passes over the output and its gradient.  A K that is not a multiple of 8 pads x and the weight too.

No views and no copies on the way in: the leading dimensions of a contiguous x are the GEMM's M, and weight^T is
read in place as the column-major (K, N) operand, so a call lands on the same shape classes (and cached kernels)
as jitops.gemm(x.view(-1, K), weight.t()) without making either view.  A weight that is itself a transposed view
(transformers' Conv1D keeps its weight as (K, N): jitops.patch passes weight.t()) is read in place too, and its
gradient is produced in the parameter's own layout, so autograd never copies it into place.

Backward: dx = dy . weight and dweight = dy^T . x (or its transpose, in the parameter's layout) with jitops.gemm,
dbias = dy summed over the rows; each only when needed.  With a gradient to record, a GELU activation runs as the
GEMM with the bias fused followed by jitops.gelu (which keeps the pre-activation its backward needs); without one,
it is fused into the epilogue.

CUDA: bf16 and fp16 (fp32 accumulation) on jitops' kernels; float32 through ATen's F.linear (cuBLAS: TF32 tensor
cores when torch.backends.cuda.matmul.allow_tf32 allows them, full fp32 otherwise; jitops.gemm's cuda_route),
until jitops has its own fp32/TF32 kernel.  CPU: fp64, fp32, bf16, fp16 through ATen (a reference path).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import native, shapes
from ..config import config
from ..op import Impl, dispatcher_wanted, op, public
from .gelu import gelu, gelu_backward
from .gemm import cuda_kernels, product_if_loaded
from .gemm import gemm as _gemm
from .gemm_plan import (ACTIVATIONS, CPU_DTYPES, CUDA_ACCEPTED, CUDA_DTYPES, GELU_APPROXIMATE, INT32_MAX, GemmClass,
                        allow_tf32, aten_class, class_from_layouts, cuda_route, layout_of)
from .gemm_run import activate, epilogue_only, launch, reads_short_b

_Tensor = torch.Tensor
_Parameter = torch.nn.Parameter


# ---- shape class ----------------------------------------------------------------------------------------------
def _check(x, weight, bias, activation) -> None:
    """The slow path of the shape class: say exactly what is wrong, naming the argument."""
    shapes.check_tensor("linear", "x", x)
    shapes.check_tensor("linear", "weight", weight)
    if bias is not None:
        shapes.check_tensor("linear", "bias", bias)
    if activation not in ACTIVATIONS:
        raise ValueError(f"jitops.linear: argument 'activation' is {activation!r}; use None, 'relu', 'gelu' or "
                         "'gelu_tanh'")
    if weight.dim() != 2:
        raise ValueError(f"jitops.linear: argument 'weight' must be a 2-D (out_features, in_features) matrix, got "
                         f"shape {tuple(weight.shape)}")
    if x.dim() < 1:
        raise ValueError("jitops.linear: argument 'x' must have at least one dimension (in_features), got a 0-d "
                         "tensor")
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"jitops.linear: argument 'x' has shape {tuple(x.shape)} (in_features = {x.shape[-1]}) "
                         f"but 'weight' has shape {tuple(weight.shape)} (in_features = {weight.shape[1]})")
    allowed = CPU_DTYPES if x.is_cpu else CUDA_ACCEPTED
    shapes.check_dtype("linear", "x", x, allowed)
    shapes.check_same_dtype("linear", ("x", x), ("weight", weight), ("bias", bias))
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"jitops.linear: argument 'bias' has shape {tuple(bias.shape)}, expected "
                         f"({weight.shape[0]},): one value per output feature")
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if max(rows, weight.shape[0], weight.shape[1]) > INT32_MAX:
        raise ValueError(f"jitops.linear: rows, in_features and out_features must each be below 2**31, got x "
                         f"{tuple(x.shape)} and weight {tuple(weight.shape)}")
    raise AssertionError("jitops.linear: _check found nothing wrong")  # pragma: no cover - callers saw a problem


def _rows_view(x: torch.Tensor, k: int) -> tuple[torch.Tensor, tuple[bool, int] | None]:
    """x as the GEMM's (M, K) operand and its layout: a contiguous x is read as it is (no view is made); other
    inputs are reshaped (a view where the leading dimensions collapse, else a copy)."""
    if x.is_contiguous():
        return x, layout_of(k, 1, x.numel() // k, k)
    x2 = x if x.dim() == 2 else x.reshape(-1, k)
    return x2, layout_of(x2.stride(0), x2.stride(1), x2.shape[0], k)


def shape_class(x, weight, bias, activation) -> GemmClass:
    # Runs on every call: plain comparisons first, _check (which builds the messages) only on failure.
    if (type(x) is not _Tensor and not isinstance(x, _Tensor)) or \
            (type(weight) is not _Tensor and not isinstance(weight, _Tensor)) or \
            weight.dim() != 2 or x.dim() < 1 or activation not in ACTIVATIONS:
        _check(x, weight, bias, activation)
    n, k = weight.shape
    dtype = x.dtype
    if x.shape[-1] != k or weight.dtype != dtype or \
            (bias is not None and (bias.dtype != dtype or bias.shape != (n,))):
        _check(x, weight, bias, activation)
    m = x.numel() // k if k else 0
    fused = bias is not None or activation is not None
    if x.is_cpu:
        if dtype not in CPU_DTYPES:
            _check(x, weight, bias, activation)
        return GemmClass(dtype, dtype, True, True, 1, "cpu", fused, "cpu")
    if dtype is not torch.bfloat16 and dtype is not torch.float16:
        if dtype is not torch.float32:
            _check(x, weight, bias, activation)
        return aten_class(dtype, dtype, cuda_route(dtype, False, allow_tf32()), fused)  # cuBLAS (run_cuda)
    if not (m and n and k):  # nothing to multiply: run_cuda needs no kernel
        return GemmClass(dtype, dtype, True, True, 8, "empty", fused, "auto")
    if m > INT32_MAX or n > INT32_MAX or k > INT32_MAX:
        _check(x, weight, bias, activation)
    if n % 8 or k % 8:  # padded operands, allocated by run_cuda (16-byte rows)
        n8, k8 = _round8(n), _round8(k)
        if k8 == k:
            a, la = _rows_view(x, k)
        else:
            a, la = None, (True, k8)
        return class_from_layouts(dtype, dtype, m, n8, k8, a, la, None, (False, k8), None, fused)
    a, la = _rows_view(x, k)
    s0, s1 = weight.stride()
    return class_from_layouts(dtype, dtype, m, n, k, a, la, weight, layout_of(s1, s0, k, n), bias, fused)


def _round8(n: int) -> int:
    return -(-n // 8) * 8


# ---- running --------------------------------------------------------------------------------------------------
def run_cuda(kernels, x, weight, bias, activation) -> torch.Tensor:
    if kernels.shape_class.family == "aten":  # float32: F.linear (cuBLAS), as jitops.gemm's cuda_route says
        return torch_linear(kernels, x, weight, bias, activation)
    n, k = weight.shape
    out = x.new_empty((*x.shape[:-1], n))
    m = out.numel() // n if n else 0
    if m == 0 or n == 0:
        return out
    if k == 0:
        epilogue_only(out.view(m, n), bias, activation)
        return out
    if n % 8 or k % 8:
        return _run_padded(kernels, x, weight, bias, activation, out, m, n, k)
    a, la = _rows_view(x, k)
    if la is None:
        a, lda = a.contiguous(), k
    else:
        lda = la[1]
    s0, s1 = weight.stride()
    lb = layout_of(s1, s0, k, n)
    if lb is None:  # no unit stride: the (K, N) operand is copied row-major, as jitops.gemm copies it
        b, ldb = weight.t().contiguous(), n
    else:
        b, ldb = weight, lb[1]
    launch(kernels, a, b, out, bias, m, n, k, lda, ldb, ACTIVATIONS[activation])
    return out


def _padded_x(x, k: int) -> tuple[torch.Tensor, int]:
    """x as the padded problem's (M, K8) rows and their leading dimension: zero-padded where K is not a multiple
    of 8 (the padding adds zeros to every dot product)."""
    k8 = _round8(k)
    a = x.reshape(-1, k)  # a view for a contiguous x: the backward's GEMMs take 2-D operands
    if k8 != k:
        return F.pad(a, (0, k8 - k)), k8
    if a.stride(1) != 1 or a.stride(0) < k:
        a = a.contiguous()
    return a, a.stride(0)


def _padded_weight(weight, n: int, k: int) -> torch.Tensor:
    """weight zero-padded to (N8, K8): extra output columns that are dropped."""
    return F.pad(weight, (0, _round8(k) - k, 0, _round8(n) - n))


def _short_weight(weight, k: int) -> bool:
    """Whether the padded problems can read the weight unpadded, N rows where they read N8 (gemm_run.launch's
    b_rows; the light kernel's TMA loads read zeros past them): a row-major (N, K) weight whose rows TMA can
    take.  F.pad of GPT-2's 100 MB head weight cost 34 us of host time (H200), twice a training step."""
    return k % 8 == 0 and weight.stride(1) == 1 and weight.stride(0) >= k and weight.stride(0) % 8 == 0 and \
        weight.data_ptr() % 16 == 0


def _run_padded(kernels, x, weight, bias, activation, out, m: int, n: int, k: int) -> torch.Tensor:
    n8, k8 = _round8(n), _round8(k)
    a, lda = _padded_x(x, k)
    bp = F.pad(bias, (0, n8 - n)) if bias is not None else None
    padded = x.new_empty((m, n8))
    if reads_short_b(kernels) and _short_weight(weight, k):
        launch(kernels, a, weight, padded, bp, m, n8, k8, lda, weight.stride(0), ACTIVATIONS[activation], n)
    else:
        launch(kernels, a, _padded_weight(weight, n, k), padded, bp, m, n8, k8, lda, k8, ACTIVATIONS[activation])
    out.view(m, n).copy_(padded[:, :n])
    return out


def run_cpu(kernels, x, weight, bias, activation) -> torch.Tensor:
    """The reference semantics through ATen: fp32 accumulation (fp64 for fp64), one rounding at the end."""
    if x.dtype is torch.float32 or x.dtype is torch.float64:  # already the accumulation type: no no-op .to()s
        z = F.linear(x, weight, bias)
        return z.contiguous() if activation is None else activate(z, activation).contiguous()
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    z = F.linear(x.to(acc), weight.to(acc), bias.to(acc) if bias is not None else None)
    return activate(z, activation).to(x.dtype).contiguous()


def torch_linear(kernels, x, weight, bias, activation) -> torch.Tensor:
    """F.linear (cuBLAS on CUDA): the float32 route (cuda_route) and background mode's fallback."""
    return activate(F.linear(x, weight, bias), activation)


def cpu_kernels(cls: GemmClass, target) -> dict:
    return {}  # ATen: nothing to compile


def fake(x, weight, bias, activation):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


# ---- autograd -------------------------------------------------------------------------------------------------
def setup_context(ctx, inputs, output) -> None:
    x, weight, bias, activation = inputs
    ctx.activation = activation
    # relu's mask comes from the output; a GELU's pre-activation is recomputed (only reached through torch.ops:
    # jitops.linear itself keeps it).  Only tensors are saved: AOTAutograd drops saved Nones.
    extra = output if activation == "relu" else bias if activation in GELU_APPROXIMATE and bias is not None else None
    ctx.save_for_backward(x, weight, *([] if extra is None else [extra]))


def backward(ctx, grad: torch.Tensor):
    x, weight, *extra = ctx.saved_tensors
    need_x, need_w, need_b = (tuple(ctx.needs_input_grad) + (False, False, False))[:3]
    if ctx.activation == "relu":
        grad = torch.where(extra[0] > 0, grad, torch.zeros((), dtype=grad.dtype, device=grad.device))
    elif ctx.activation in GELU_APPROXIMATE:
        z = _linear(x, weight, extra[0] if extra else None)
        approximate = GELU_APPROXIMATE[ctx.activation]
        grad = torch.ops.aten.gelu_backward(grad, z, approximate=approximate) if grad.is_cpu else \
            gelu_backward(grad, z, approximate)
    n, k = weight.shape
    transposed = weight.stride(1) != 1 and weight.stride(0) == 1  # a view of a (K, N) parameter (Conv1D)
    grad_x = grad_w = grad_b = None
    if (n % 8 or k % 8) and (grad.is_cuda or grad.is_meta) and grad.dtype in CUDA_DTYPES:
        return _padded_backward(grad, x, weight, n, k, need_x, need_w, need_b)
    if _direct(grad, x, weight):
        grad_x, grad_w = _backward_products(grad, x, weight, n, k, need_x, need_w, transposed)
    g = grad.reshape(-1, n)
    if need_x and grad_x is None:
        grad_x = _gemm(g, weight).view(x.shape)          # (M, N) . (N, K)
    if need_w and grad_w is None:
        x2 = x.reshape(-1, k)
        # In the parameter's own layout, so that autograd copies nothing into place.
        grad_w = _gemm(x2.t(), g).t() if transposed else _gemm(g.t(), x2)
    if need_b:
        grad_b = g.sum(0)
    return grad_x, grad_w, grad_b


def _padded_backward(grad, x, weight, n: int, k: int, need_x: bool, need_w: bool, need_b: bool):
    """The backward of a padded problem: the output gradient zero-padded to (M, N8) once, then both GEMMs on
    padded operands (the weight unpadded where the loaded kernel reads it so: _short_weight), and the valid block
    of each result."""
    n8 = _round8(n)
    g = grad.reshape(-1, n)
    gp = F.pad(g, (0, n8 - n))
    a, _ = _padded_x(x, k)
    grad_x = grad_w = None
    if need_x:  # (M, N8) . (N8, K8)
        if type(grad) is _Tensor and grad.is_cuda and _short_weight(weight, k) and \
                not torch.compiler.is_compiling():
            # The call it stands for, jitops.gemm(gp, padded weight): so that a first step loads the kernels
            # and launches (offers) the problem that later steps run in C++.
            load_as = (gp, shapes.placeholder(weight, (n8, k)), None, None, None)
            grad_x = product_if_loaded(gp, (True, n8), weight, (True, weight.stride(0)), gp.shape[0], k, n8,
                                       x.shape, b_rows=n, load_as=load_as)
        if grad_x is None:
            grad_x = _gemm(gp, _padded_weight(weight, n, k))[:, :k].reshape(x.shape)
    if need_w:
        if weight.stride(1) != 1 and weight.stride(0) == 1:  # a (K, N) parameter's view: its layout
            grad_w = _gemm(a.t(), gp)[:k, :n].contiguous().t()              # (K8, M) . (M, N8)
        else:
            grad_w = _gemm(gp.t(), a)[:n, :k].contiguous()                  # (N8, M) . (M, K8)
    grad_b = g.sum(0) if need_b else None
    return grad_x, grad_w, grad_b


def _direct(grad, x, weight) -> bool:
    """Plain contiguous CUDA tensors of one dtype, not traced: the backward's GEMMs can launch directly."""
    return type(grad) is _Tensor and grad.is_cuda and grad.is_contiguous() and x.is_contiguous() and \
        grad.dtype is x.dtype and weight.dtype is x.dtype and x.dtype in CUDA_DTYPES and x.numel() > 0 and \
        grad.numel() > 0 and weight.shape[1] > 0 and not torch.compiler.is_compiling()


def _backward_products(grad, x, weight, n: int, k: int, need_x: bool, need_w: bool, transposed: bool):
    """dx and dweight on the loaded gemm kernels (None where they are not loaded yet, or not needed)."""
    m = grad.numel() // n
    s0, s1 = weight.stride()
    grad_x = grad_w = None
    if need_x:  # (M, N) . (N, K): grad row-major, weight as the (N, K) operand in its own layout
        lw = layout_of(s0, s1, n, k)
        if lw is not None:
            grad_x = product_if_loaded(grad, layout_of(n, 1, m, n), weight, lw, m, k, n, (*x.shape[:-1], k))
    if need_w:
        if transposed:  # (K, M) . (M, N) = dweight^T, stored (K, N) as the parameter is
            dw_t = product_if_loaded(x, layout_of(1, k, k, m), grad, layout_of(n, 1, m, n), k, n, m, (k, n))
            grad_w = dw_t.t() if dw_t is not None else None
        else:  # (N, M) . (M, K)
            grad_w = product_if_loaded(grad, layout_of(1, n, n, m), x, layout_of(k, 1, m, k), n, k, m, (n, k))
    return grad_x, grad_w


# ---- the backward's calls, for manifests and for compiling them while the forward runs ---------------------------
def companions(x, weight, bias, activation, *, needs):
    """The calls backward() above makes, assuming a contiguous output gradient."""
    need_x, need_w, need_b = needs
    n, k = weight.shape
    lead = tuple(x.shape[:-1])
    calls = []
    if activation in GELU_APPROXIMATE and (need_x or need_w or need_b):  # the pre-activation, recomputed
        calls.append((_linear, (x, weight, bias, None)))
        if not x.is_cpu:
            z = shapes.placeholder(x, (*lead, n))
            calls.append((gelu_backward, (shapes.placeholder(z, (*lead, n)), z, GELU_APPROXIMATE[activation])))
    m = x.numel() // k if k else 0
    if not (m and n and k):
        return calls
    if (n % 8 or k % 8) and not x.is_cpu:  # the padded problem's GEMMs
        n8, k8 = _round8(n), _round8(k)
        gp = shapes.placeholder(x, (m, n8))
        xp = shapes.placeholder(x, (m, k8))
        if need_x:
            calls.append((_gemm, (gp, shapes.placeholder(x, (n8, k8)), None, None, None)))
        if need_w:
            transposed = weight.stride(1) != 1 and weight.stride(0) == 1
            calls.append((_gemm, (xp.t(), gp, None, None, None) if transposed else (gp.t(), xp, None, None, None)))
        return calls
    g = shapes.placeholder(x, (m, n))
    x2 = shapes.placeholder(x, (m, k))
    if need_x:
        calls.append((_gemm, (g, weight.detach(), None, None, None)))              # (M, N) . (N, K)
    if need_w:
        transposed = weight.stride(1) != 1 and weight.stride(0) == 1
        calls.append((_gemm, (x2.t(), g, None, None, None) if transposed else (g.t(), x2, None, None, None)))
    return calls


# ---- declaration ----------------------------------------------------------------------------------------------
_linear = op(
    "jitops::linear(Tensor x, Tensor weight, Tensor? bias=None, str? activation=None) -> Tensor",
    shape_class=shape_class,
    cuda=Impl(cuda_kernels, run_cuda),
    cpu=Impl(cpu_kernels, run_cpu),
    fake=fake,
    setup_context=setup_context,
    backward=backward,
    keyword_only=("activation",),
    doc=__doc__,
    fallback=torch_linear,
    companions=companions,
)


_native = native.host


# Under torch.compile a Linear whose widths are not multiples of 8 (GPT-2's 50257-wide head) is traced as torch's
# op: inductor pads it inside the graph, fused with its neighbours, where this op copies padded operands and slices
# its output around its kernels.  In eager mode jitops' padded kernels win by far: cuBLAS on the unaligned rows is
# slow (GPU time of GPT-2's step on the H100: docs/benchmarks.md, "models").
_compiling = torch.compiler.is_compiling


def _traced_as_torch(x, weight) -> bool:
    # the shapes first: is_compiling() costs about 116 ns a call (dev box), which aligned Linears skip
    return isinstance(weight, _Tensor) and weight.dim() == 2 and bool(weight.shape[0] % 8 or weight.shape[1] % 8) \
        and isinstance(x, _Tensor) and not x.is_cpu and _compiling()


def linear(x, weight, bias=None, *, activation=None):
    # The C++ host path first (jitops/native.py): it serves a plain CUDA call whose problems the Python path
    # below has launched before, and answers None for anything else.  CPU and meta calls (a model's prefetch)
    # never reach it; modes, the profiler and torch.compile see the op in the dispatcher instead.
    host = _native.module
    if host is not None and getattr(x, "is_cuda", False) and not dispatcher_wanted():
        try:
            y = host.linear(x, weight, bias, ACTIVATIONS.get(activation, -1), config.generation)
        except TypeError:  # weight or bias not tensors (or an unhashable activation): the Python path says so
            y = None
        if y is not None:
            return y
    if _traced_as_torch(x, weight):
        return activate(F.linear(x, weight, bias), activation)
    if activation is None:  # the common call: straight to the op (the model's prefetch found its kernels)
        return _linear(x, weight, bias)
    if activation in GELU_APPROXIMATE and torch.is_grad_enabled() and not getattr(x, "is_cpu", True) and \
            (getattr(x, "requires_grad", False) or getattr(weight, "requires_grad", False) or
             getattr(bias, "requires_grad", False)):
        # Training: the GEMM with the bias fused, then jitops.gelu, which saves the pre-activation.  The
        # backward's dgelu then needs no second GEMM.
        return gelu(_linear(x, weight, bias), GELU_APPROXIMATE[activation])
    return _linear(x, weight, bias, activation=activation)


linear.__doc__ = __doc__
linear.op = _linear.op  # type: ignore[attr-defined]


def _public_calls(entry, args, grad):
    """What linear() above calls: with a gradient to record, a GELU on a GPU runs the GEMM with the bias fused
    and then jitops.gelu on its output."""
    x, weight, bias, activation = args
    if grad and activation in GELU_APPROXIMATE and not x.is_cpu:
        z = shapes.placeholder(x, (*x.shape[:-1], weight.shape[0]))
        return [(_linear, (x, weight, bias, None)), (gelu, (z, GELU_APPROXIMATE[activation]))]
    return [(_linear, args)]


public("linear", linear, entries=(_linear,), calls=_public_calls)
