"""jitops.gemm without a GPU: the CPU path (ATen) against a float64 reference for every transpose combination,
bias, activation and out_dtype, gradients of every input (gradcheck in float64), opcheck and
torch.compile(fullgraph=True); input errors; the shape classes and kernel choices for each arch (on meta
tensors); and builds of the CUDA sources here (NVRTC for sm_80 and for one sm_90a configuration)."""
from __future__ import annotations

import importlib
import itertools
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import jitops
from jitops import light_gemm as L
from jitops.specs import Target
from jitops.testing import check_op

from jitops.ops import gemm as G
from jitops.ops import gemm_plan as P
from jitops.ops import gemm_run as R


def gemm_positional(a, b, bias, activation, out_dtype):
    return jitops.gemm(a, b, bias=bias, activation=activation, out_dtype=out_dtype)


gemm_positional.op = jitops.gemm.op  # check_op runs opcheck on the op behind the function


def reference(a, b, bias, activation, out_dtype):
    z = a @ b
    if bias is not None:
        z = z + bias
    return torch.relu(z) if activation == "relu" else F.gelu(z) if activation == "gelu" else z


def matrix(rows, cols, transposed, dtype, generator):
    """A (rows, cols) operand, as a transposed view of a (cols, rows) matrix when `transposed`."""
    if transposed:
        return torch.randn(cols, rows, generator=generator, dtype=dtype).t()
    return torch.randn(rows, cols, generator=generator, dtype=dtype)


def samples(dtype, device):
    g = torch.Generator().manual_seed(0)
    out = []
    for (a_t, b_t), (m, k, n) in itertools.product(itertools.product([False, True], repeat=2),
                                                  [(7, 33, 5), (1, 8, 16)]):
        out.append((matrix(m, k, a_t, dtype, g).to(device), matrix(k, n, b_t, dtype, g).to(device), None, None, None))
    for bias, activation in itertools.product([False, True], [None, "relu", "gelu"]):
        out.append((torch.randn(9, 13, generator=g, dtype=dtype), torch.randn(13, 6, generator=g, dtype=dtype),
                    torch.randn(6, generator=g, dtype=dtype) if bias else None, activation, None))
    if dtype != torch.float64:  # an fp32 output of fp64 inputs would only lose precision in gradcheck
        out.append((torch.randn(4, 3, generator=g, dtype=dtype), torch.randn(3, 5, generator=g, dtype=dtype),
                    torch.randn(5, generator=g, dtype=dtype), "relu", torch.float32))
    return out


def test_gemm_cpu_against_float64_reference():
    report = check_op(gemm_positional, reference, samples=samples, dtypes=[torch.float32, torch.float64],
                      device="cpu", compile=True)
    assert len(report.checked) > 50


def test_gemm_cpu_half_types():
    for dtype in (torch.bfloat16, torch.float16):
        g = torch.Generator().manual_seed(1)
        a = torch.randn(17, 40, generator=g).to(dtype)
        b = torch.randn(40, 9, generator=g).to(dtype).t().contiguous().t()
        bias = torch.randn(9, generator=g).to(dtype)
        out = jitops.gemm(a, b, bias=bias, activation="gelu")
        assert out.dtype == dtype
        want = reference(a.double(), b.double(), bias.double(), "gelu", None)
        torch.testing.assert_close(out.double(), want, rtol=1.6e-2, atol=1.6e-2 * want.abs().max().item())
        out32 = jitops.gemm(a, b, out_dtype=torch.float32)
        assert out32.dtype == torch.float32
        torch.testing.assert_close(out32.double(), a.double() @ b.double(), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("needs", [(True, False, False), (False, True, False), (False, False, True),
                                   (True, True, True)])
def test_only_needed_gradients(needs, monkeypatch):
    a, b, bias = (torch.randn(s, dtype=torch.float64) for s in ((6, 4), (4, 3), (3,)))
    leaves = [t.requires_grad_(n) for t, n in zip((a, b, bias), needs)]
    calls = []
    real = G._op
    monkeypatch.setattr(G, "_op", lambda *args, **kw: calls.append(args) or real(*args, **kw))
    out = jitops.gemm(a, b, bias=bias, activation="relu")
    assert out.grad_fn is not None
    calls.clear()
    out.sum().backward()
    assert [t.grad is not None for t in leaves] == list(needs)
    assert len(calls) == int(needs[0]) + int(needs[1])  # one GEMM per operand gradient, none for the bias


def test_gelu_gradient_through_the_op_recomputes_the_preactivation():
    a, b, bias = (torch.randn(s, dtype=torch.float64, requires_grad=True) for s in ((5, 7), (7, 3), (3,)))
    assert torch.autograd.gradcheck(lambda *t: torch.ops.jitops.gemm(*t, "gelu", None), (a, b, bias))


@pytest.mark.parametrize("call, error, pattern", [
    (lambda a, b: jitops.gemm(a, b[:3]), ValueError, r"K mismatch.*'a'.*'b'"),
    (lambda a, b: jitops.gemm(a, b.double()), TypeError, r"'b' has dtype float64 but 'a' has float32"),
    (lambda a, b: jitops.gemm(a.int(), b.int()), TypeError, r"'a' has dtype int32 on cpu"),
    (lambda a, b: jitops.gemm(a, b, bias=torch.zeros(3)), ValueError, r"'bias' has shape \(3,\), expected \(5,\)"),
    (lambda a, b: jitops.gemm(a, b, bias=torch.zeros(5, dtype=torch.float64)), TypeError, r"'bias' has dtype"),
    (lambda a, b: jitops.gemm(a, b, activation="tanh"), ValueError, r"'activation' is 'tanh'"),
    (lambda a, b: jitops.gemm(a, b, out_dtype=torch.float16), TypeError, r"'out_dtype'"),
    (lambda a, b: jitops.gemm(a[0, 0], b), ValueError, r"'a' is a 0-d tensor"),
    (lambda a, b: jitops.gemm(a.expand(2, 4, 6), b.expand(3, 6, 5)), ValueError,
     r"batch dimensions of argument 'a' \(2,\) and 'b' \(3,\) do not broadcast"),
    (lambda a, b: jitops.gemm(a, b[:, 0], bias=torch.zeros(1)), ValueError, r"'bias' is given but 'b' is 1-D"),
    (lambda a, b: jitops.gemm(a[None], b.t()), ValueError, r"K mismatch.*\(1, 4, 6\).*b must be \(\.\.\., K, N\)"),
    (lambda a, b: jitops.gemm(a, b.to("meta")), ValueError, r"'b' is on meta but 'a' is on cpu"),
    (lambda a, b: jitops.gemm(a, 3), TypeError, r"'b' must be a torch.Tensor"),
])
def test_bad_inputs_name_the_argument(call, error, pattern):
    with pytest.raises(error, match=pattern):
        call(torch.randn(4, 6), torch.randn(6, 5))


# ---- torch.matmul's operand forms: 1-D, N-D, broadcast batch dimensions, empty dimensions ----------------------
# (a shape, b shape, bias): awkward sizes (1, 7, 1000), each form torch.matmul takes.
MATMUL_SHAPES = [((7,), (7,), False), ((7,), (7, 5), True), ((5, 7), (7,), False), ((3, 5, 7), (7, 4), True),
                 ((2, 3, 1, 7), (7, 1), False), ((3, 5, 7), (7,), False), ((7,), (3, 7, 4), False),
                 ((2, 1, 4, 7), (3, 7, 5), True), ((4, 7), (3, 7, 5), False), ((3, 5, 7), (1, 7, 4), True),
                 ((1, 1000), (2, 1000, 7), False), ((2, 0, 7), (7, 3), True), ((3, 2, 0), (0, 5), False),
                 ((1, 4, 7), (2, 7, 0), False)]


def matmul_samples(dtype, device):
    g = torch.Generator().manual_seed(4)
    out = []
    for i, (a_shape, b_shape, bias) in enumerate(MATMUL_SHAPES):
        a = torch.randn(a_shape, generator=g, dtype=dtype).to(device)
        b = torch.randn(b_shape, generator=g, dtype=dtype).to(device)
        bias_t = torch.randn(b_shape[-1], generator=g, dtype=dtype).to(device) if bias else None
        out.append((a, b, bias_t, "relu" if bias and i % 2 else None, None))
    return out


def test_matmul_forms_against_float64_reference_with_gradcheck_and_opcheck():
    """Forward and every gradient against torch.matmul in float64, contiguous and strided inputs, gradcheck in
    float64, opcheck (schema, fake tensors, autograd registration, AOT dispatch), torch.compile."""
    report = check_op(gemm_positional, reference, samples=matmul_samples, dtypes=[torch.float32, torch.float64],
                      device="cpu", compile=True)
    assert len(report.checked) > 100
    assert sum(c.startswith("gradcheck") for c in report.checked) >= 10
    assert sum(c.startswith("opcheck") for c in report.checked) == 2 * len(MATMUL_SHAPES)


def _magnitude(t):
    return max(t.abs().max().item(), 1.0) if t.numel() else 1.0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_matmul_forms_in_half_types(dtype):
    for a, b, bias, activation, _ in matmul_samples(dtype, "cpu"):
        a, b = a.requires_grad_(), b.requires_grad_()
        out = jitops.gemm(a, b, bias=bias, activation=activation)
        want = reference(a.double(), b.double(), bias.double() if bias is not None else None, activation, None)
        assert out.dtype == dtype and out.shape == want.shape
        torch.testing.assert_close(out.double(), want, rtol=1.6e-2, atol=1.6e-2 * _magnitude(want))
        grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        got = torch.autograd.grad(out, (a, b), grad.to(dtype))
        a64, b64 = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
        wanted = torch.autograd.grad(reference(a64, b64, bias.double() if bias is not None else None, activation,
                                               None), (a64, b64), grad)
        for g_, w in zip(got, wanted):
            assert g_.dtype == dtype and g_.shape == w.shape
            torch.testing.assert_close(g_.double(), w, rtol=1.6e-2, atol=1.6e-2 * _magnitude(w))


def test_broadcast_gradients_are_summed_over_the_broadcast_dimensions():
    """b broadcast along a's batch of 3 (and a along b's): their gradients sum over it, exactly as torch's."""
    a = torch.randn(3, 1, 5, 7, dtype=torch.float64, requires_grad=True)
    b = torch.randn(1, 4, 7, 2, dtype=torch.float64, requires_grad=True)
    out = jitops.gemm(a, b)
    assert out.shape == (3, 4, 5, 2)
    grad = torch.randn(out.shape, dtype=torch.float64)
    got = torch.autograd.grad(out, (a, b), grad)
    want = torch.autograd.grad(torch.matmul(a, b), (a, b), grad)
    for g_, w in zip(got, want):
        torch.testing.assert_close(g_, w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("a_shape, b_shape", [((5, 10), (5, 10, 5)), ((10,), (5, 5, 10, 5)), ((7, 1, 9, 3), (4, 3, 1))])
def test_broadcast_gradients_in_half_types_are_rounded_once(dtype, a_shape, b_shape):
    """A 16-bit operand broadcast along the other's batch: its gradient sums the batch's products in float32 and
    rounds once (the OpInfo samples (5, 10) x (5, 10, 5) in bf16 were 1.2% off when each product was rounded)."""
    g = torch.Generator().manual_seed(6)
    a = torch.randn(a_shape, generator=g).to(dtype).requires_grad_()
    b = torch.randn(b_shape, generator=g).to(dtype).requires_grad_()
    out = jitops.gemm(a, b)
    grad = torch.randn(out.shape, generator=g).to(dtype)
    got = torch.autograd.grad(out, (a, b), grad)
    a64, b64 = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    want = torch.autograd.grad(torch.matmul(a64, b64), (a64, b64), grad.double())
    unit = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11  # one rounding of the type, relative
    for g_, w in zip(got, want):
        assert ((g_.double() - w).abs() <= unit * w.abs() + 1e-6).all()


def test_a_vector_times_a_vector_is_a_0d_tensor():
    a, b = torch.randn(1000, dtype=torch.float64), torch.randn(1000, dtype=torch.float64)
    out = jitops.gemm(a, b)
    assert out.shape == () and torch.allclose(out, a @ b, rtol=1e-12)


# ---- the CUDA path's Python side, on the CPU --------------------------------------------------------------------
def _meta_twin(t):
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def _fake_launch(launched):
    """launch() as the kernels read their operands: (M, K) and (K, N) from the pointers, leading dimensions and
    the class's majors."""
    def launch(kernels, a, b, out, bias, m, n, k, lda, ldb, activation):
        cls = kernels.shape_class
        a_mk = torch.as_strided(a, (m, k), (lda, 1) if cls.a_kmajor else (1, lda))
        b_kn = torch.as_strided(b, (k, n), (1, ldb) if cls.b_kmajor else (ldb, 1))
        launched.append((a.data_ptr(), b.data_ptr(), m, n, k))
        out.copy_((a_mk.double() @ b_kn.double() + (bias.double() if bias is not None else 0)).to(out.dtype))
    return launch


@pytest.mark.parametrize("a_shape, b_shape, a_view, a_copied", [
    ((3, 5, 16), (16, 8), None, False),                     # (..., K) contiguous: one (15, 16) GEMM on a itself
    ((16,), (16, 8), None, False),                          # a row
    ((3, 5, 16), (16,), None, False),                       # b a column
    ((3, 5, 16), (1, 16, 8), None, False),                  # b's batch dimensions are all 1
    ((5, 3, 16), (16, 8), lambda t: t.transpose(0, 1), True),  # leading dimensions that do not collapse: a copy
    ((2, 16, 5), (16, 8), lambda t: t.transpose(1, 2), True),   # column-major in each batch: does not collapse
    ((3, 5, 32), (16, 8), lambda t: t[..., :16], False),       # rows of 16 in a row of 32: read in place, ld 32
    ((1, 5, 16), (16, 8), lambda t: t.expand(3, 5, 16), True),  # a broadcast batch (stride 0): copied
    ((3, 1, 5, 1, 32), (16, 8), lambda t: t[..., :16], False),  # size-1 dimensions aside, they collapse
    ((3, 1, 5, 1, 16), (16, 8), lambda t: t[:, :, ::2], True),   # every other row: 3 x 3 rows do not collapse
    ((16, 3), (16, 8), lambda t: t.t(), False),                  # 2-D column-major a: read in place
])
def test_cuda_run_folds_nd_operands_into_one_2d_gemm(monkeypatch, a_shape, b_shape, a_view, a_copied):
    """run_cuda (jitops' kernels, launch() faked) on CPU tensors: an N-D call that folds runs one 2-D GEMM on
    the same shape class as the 2-D problem, reading a in place where its leading dimensions collapse."""
    launched = []
    monkeypatch.setattr(R, "launch", _fake_launch(launched))
    g = torch.Generator().manual_seed(5)
    a = torch.randn(a_shape, generator=g).to(torch.bfloat16)
    a = a_view(a) if a_view else a
    b = torch.randn(b_shape, generator=g).to(torch.bfloat16)
    bias = torch.randn(8, generator=g).to(torch.bfloat16) if b.dim() > 1 else None
    bias_meta = _meta_twin(bias) if bias is not None else None
    cls = G.shape_class(_meta_twin(a), _meta_twin(b), bias_meta, None, None)
    assert cls.family == "auto" and cls.bucket != "empty"
    m = a.numel() // a.shape[-1]
    two_d = G.shape_class(_meta_twin(a.reshape(m, a.shape[-1])), _meta_twin(P.fold_b(b)), bias_meta, None, None)
    assert cls == two_d  # the 2-D problem's class: its kernels and cache keys
    out = R.run_cuda(_kernels(cls), a, b, bias, None, None)
    want = torch.matmul(a.double(), b.double()) + (bias.double() if bias is not None else 0)
    assert out.shape == want.shape and out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), want, rtol=1e-2, atol=1e-2 * want.abs().max().item())
    [(a_ptr, _, m_, n_, k_)] = launched
    assert (m_, k_) == (m, a.shape[-1]) and (a_ptr != a.data_ptr()) == a_copied


def _kernels(cls):
    from jitops.op import Kernels

    return Kernels({}, cls)


@pytest.mark.parametrize("x, y", [((), ()), ((3,), ()), ((), (2, 4)), ((2, 1, 4), (3, 1)), ((1,), (5, 1, 2)),
                                  ((2, 3), (3, 2)), ((0,), (1,)), ((0,), (2,))])
def test_batch_shape_is_torchs_broadcast(x, y):
    a, b = torch.empty(*x, 4, 5, device="meta"), torch.empty(*y, 5, 6, device="meta")
    try:
        want = tuple(torch.broadcast_shapes(x, y))
    except RuntimeError:
        want = None
    assert P.batch_shape(a, b) == want


def test_batched_and_float32_cuda_calls_route_to_cublas():
    """cuda_route, and the classes it gives on meta tensors (which the op treats as CUDA): batched 16-bit and
    float32 run torch.matmul (cuBLAS), float32 named by torch.backends.cuda.matmul.allow_tf32; their classes
    build nothing."""
    assert P.cuda_route(torch.bfloat16, False, False) == P.cuda_route(torch.float16, False, True) == "kernel"
    assert P.cuda_route(torch.float16, True, False) == "cublas_batched"
    assert P.cuda_route(torch.float32, False, True) == P.cuda_route(torch.float32, True, True) == "cublas_tf32"
    assert P.cuda_route(torch.float32, False, False) == "cublas_fp32"
    assert P.cuda_route(torch.float64, False, False) is None
    m = lambda *s, dtype=torch.float32: torch.empty(s, dtype=dtype, device="meta")  # noqa: E731
    from jitops.ops import linear as L
    previous = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        assert G.shape_class(m(64, 32), m(32, 16), None, None, None).bucket == "cublas_fp32"
        assert L.shape_class(m(3, 64, 32), m(16, 32), None, None).bucket == "cublas_fp32"
        torch.set_float32_matmul_precision("high")  # torch's other spelling of the same flag
        assert torch.backends.cuda.matmul.allow_tf32
        fp32 = G.shape_class(m(64, 32), m(3, 32, 16), m(16), "relu", None)
        linear_cls = L.shape_class(m(3, 64, 32), m(16, 32), None, None)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    assert (fp32.bucket, fp32.family, fp32.fused) == ("cublas_tf32", "aten", True)
    batched = G.shape_class(m(4, 64, 32, dtype=torch.bfloat16), m(4, 32, 16, dtype=torch.bfloat16), None, None,
                            None)
    assert (batched.bucket, batched.family) == ("cublas_batched", "aten")
    for cls in (fp32, batched):
        assert G.cuda_kernels(cls, SM90) == {} and G.cuda_kernels(cls, SM80) == {}
    assert (linear_cls.bucket, linear_cls.family) == ("cublas_tf32", "aten")
    with pytest.raises(TypeError, match="jitops.gemm: argument 'a' has dtype float64 on meta; supported there: "
                                        "float32, bfloat16, float16"):
        G.shape_class(m(4, 4, dtype=torch.float64), m(4, 4, dtype=torch.float64), None, None, None)
    # run_cuda on such a class is torch.matmul (CPU tensors stand in for CUDA ones)
    a, b, bias = torch.randn(2, 5, 7), torch.randn(2, 7, 3), torch.randn(3)
    out = R.run_cuda(_kernels(fp32), a, b, bias, "relu", None)
    torch.testing.assert_close(out, torch.relu(torch.matmul(a, b) + bias))
    x, w = torch.randn(2, 5, 7), torch.randn(3, 7)
    torch.testing.assert_close(L.run_cuda(_kernels(linear_cls), x, w, bias, None), F.linear(x, w, bias))


def test_matmul_backward_calls_are_known_before_the_backward_runs():
    """companions for N-D forms: the calls backward() makes (a folded call's dB is one 2-D GEMM)."""
    a = torch.empty(3, 100, 256, dtype=torch.bfloat16, device="meta", requires_grad=True)
    b = torch.empty(256, 384, dtype=torch.bfloat16, device="meta", requires_grad=True)
    calls = jitops.gemm.op.companion_calls((a, b, None, None, None))
    classes = [op.shape_class(*args) for op, args in calls]
    assert all(c.family == "auto" for c in classes)
    assert [tuple(args[0].shape) for _, args in calls] == [(3, 100, 384), (256, 300)]
    batched_b = torch.empty(3, 256, 384, dtype=torch.bfloat16, device="meta", requires_grad=True)
    calls = jitops.gemm.op.companion_calls((a, batched_b, None, None, None))
    assert [op.shape_class(*args).bucket for op, args in calls] == ["cublas_batched"] * 2


# ---- shape classes and kernel choices (meta tensors: no GPU, no memory) ----------------------------------------
SM90, SM80, SM89 = Target.parse("sm_90a"), Target.parse("sm_80"), Target.parse("sm_89")


def meta(rows, cols, dtype=torch.bfloat16, transposed=False, offset=0):
    """A (rows, cols) meta tensor starting `offset` elements into its storage (row- or column-major)."""
    base = torch.empty(rows * cols + offset, dtype=dtype, device="meta")
    strides = (1, rows) if transposed else (cols, 1)
    return base.as_strided((rows, cols), strides, offset)


@pytest.mark.parametrize("a_t, b_t", list(itertools.product([False, True], repeat=2)))
def test_transposed_views_are_read_in_place(a_t, b_t):
    a, b = meta(256, 512, transposed=a_t), meta(512, 384, transposed=b_t)
    assert P._layout(a, 256, 512) is not None and P._layout(b, 512, 384) is not None  # no copy
    cls = G.shape_class(a, b, None, None, None)
    assert (cls.a_kmajor, cls.b_kmajor) == (not a_t, b_t) and cls.align == 8
    light = G.cuda_kernels(cls, SM90)["sm90_light"]  # the default sm_90a kernel
    assert light.backend == "nvrtc" and light.arch(SM90) == "sm_90a"
    assert dict(light.defines)["LIGHT_A_KMAJOR"] == str(int(not a_t))
    assert dict(light.defines)["LIGHT_B_KMAJOR"] == str(int(b_t))
    with jitops.config.scope(gemm_sm90_kernel="cutlass"):
        request = G.cuda_kernels(cls, SM90)["sm90"]
    assert request.backend == "nvrtc" and request.arch(SM90) == "sm_90a"
    assert dict(request.defines)["GEMM_A_KMAJOR"] == str(int(not a_t))  # the configuration header's macros
    assert dict(request.params)["GEMM_A_KMAJOR"] == str(int(not a_t))


def test_views_without_a_unit_stride_are_copied():
    a = torch.empty(64, 64, dtype=torch.bfloat16, device="meta")[::2, ::2]
    assert P._layout(a, 32, 32) is None
    cls = G.shape_class(a, meta(32, 16), None, None, None)
    assert cls.a_kmajor and cls.align == 8  # as the contiguous copy run_cuda makes


@pytest.mark.parametrize("m, k, n, offset, align", [
    (64, 128, 64, 0, 8), (64, 132, 100, 0, 4), (64, 130, 96, 0, 2), (100, 129, 77, 0, 1), (33, 256, 64, 1, 1),
    (33, 256, 64, 4, 4)])
def test_alignment_classes(m, k, n, offset, align):
    cls = G.shape_class(meta(m, k, offset=offset), meta(k, n), None, None, None)
    assert cls.align == align
    kernels = G.cuda_kernels(cls, SM90)
    assert list(kernels) == (["sm90_light"] if align == 8 else ["sm80"])  # TMA needs 16-byte rows and addresses
    with jitops.config.scope(gemm_sm90_kernel="cutlass"):
        assert list(G.cuda_kernels(cls, SM90)) == (["sm90"] if align == 8 else ["sm80"])


def test_buckets_and_family():
    bucket = lambda m, k, n: G.shape_class(meta(m, k), meta(k, n), None, None, None).bucket  # noqa: E731
    assert bucket(4096, 4096, 4096) == "large" and bucket(8192, 1024, 8192) == "large_short_k"
    assert bucket(128, 8192, 8192) == "skinny" and bucket(1000, 256, 384) == "small"
    assert bucket(1, 4096, 14336) == "decode" and bucket(64, 4096, 12800) == "decode"  # >= 99 tiles of 128
    assert bucket(1, 4096, 4096) == "decode_narrow" and bucket(64, 8192, 12544) == "decode_narrow"  # 98 of 128
    assert bucket(65, 4096, 4096) == "skinny" and bucket(32, 4096, 1024) == "small"  # decode: N >= 4096 only

    class Symbolic(int):  # torch.compile's SymInt, which cannot be hashed (the memo is for plain ints)
        __hash__ = None
    assert P._bucket(Symbolic(4096), Symbolic(4096), Symbolic(4096)) == "large"
    assert set(P.SM90_CONFIGS) == set(P.SM80_CONFIGS)  # every bucket has a kernel on both families
    cls = G.shape_class(meta(4096, 4096), meta(4096, 4096), None, None, None)
    assert list(G.cuda_kernels(cls, SM80)) == ["sm80"] and list(G.cuda_kernels(cls, SM89)) == ["sm80"]
    with jitops.config.scope(gemm_family="sm80"):
        forced = G.shape_class(meta(4096, 4096), meta(4096, 4096), None, None, None)
    assert forced != cls and list(G.cuda_kernels(forced, SM90)) == ["sm80"]
    assert G.shape_class(meta(4096, 4096), meta(4096, 4096), None, None, None) == cls  # the scope's end too
    assert G.cuda_kernels(G.shape_class(meta(0, 64), meta(64, 64), None, None, None), SM90) == {}


# (a K-major, b K-major, fused): x @ w.t(), the same with bias+activation, dy @ w, dy.t() @ x, and x @ w with
# bias+activation (transformers' Conv1D, its weight stored (K, N))
TRAINING_LAYOUTS = [(True, True, False), (True, True, True), (True, False, False), (False, False, False),
                    (True, False, True)]


def test_all_builtin_covers_every_bucket_in_every_training_layout():
    """prewarm --all-builtin builds, on sm_90a, every kernel the bucket rules can pick, for bf16 and fp16, in the
    forward (plain and fused), input-gradient and weight-gradient layouts of a Linear layer and Conv1D's fused
    forward: the light kernel's nine tiles (below) by default, each CUTLASS configuration with
    JITOPS_GEMM_SM90_KERNEL=cutlass."""
    from cache_tools import manifest

    assert {b: P._choose_bucket(*mnk) for b, mnk in P.BUCKET_EXAMPLES.items()} == {b: b for b in P.SM90_CONFIGS}
    plan = manifest.plan([c for c in manifest.builtin_calls() if c.op == "gemm"], ["sm_90a"])
    light = [job for job in plan.jobs if job.request.kernel == L.LIGHT_GEMM.name]
    assert [job.request.kernel for job in plan.jobs if job not in light] == ["host_path"]  # tests/test_native.py
    variants = {tuple(sorted(dict(job.request.defines).items())) for job in light}
    expected_light = {tuple(sorted({"LIGHT_T": str(t), "LIGHT_OUT": "0", "LIGHT_TILE_N": str(L.tile_n_for(bucket)),
                                    "LIGHT_FUSED": str(int(fused)), "LIGHT_A_KMAJOR": str(int(a)),
                                    "LIGHT_B_KMAJOR": str(int(b)),
                                    "LIGHT_PINGPONG": str(int(L.pingpong_for(bucket))),
                                    **({"LIGHT_TILE_M": str(L.tile_m_for(bucket))}
                                       if L.tile_m_for(bucket) != L.TILE_M else {})}.items()))
                      for t in (0, 1) for bucket in P.SM90_CONFIGS for a, b, fused in TRAINING_LAYOUTS}
    # 128 x 256, 128 x 128 pingpong, 128 x 128, 128 x 64, 64 x 128 (skinny, decode_narrow), 64 x 256 (decode),
    # 192 x 192, 128 x 192 and 192 x 128 (the wave buckets)
    assert variants == expected_light and len(light) == len(expected_light) == 2 * 9 * len(TRAINING_LAYOUTS)

    with jitops.config.scope(gemm_sm90_kernel="cutlass"):
        plan = manifest.plan([c for c in manifest.builtin_calls() if c.op == "gemm"], ["sm_90a"])
    classes = {eval(job.shape_class, {"GemmClass": P.GemmClass, "torch": torch}) for job in plan.jobs}  # noqa: S307
    covered = {(c.dtype, c.bucket, c.a_kmajor, c.b_kmajor, c.fused) for c in classes}
    expected = {(dtype, bucket, *layout) for dtype in (torch.bfloat16, torch.float16)  # the wave buckets share
                for bucket in P.SM90_CONFIGS if not bucket.startswith("wave_")  # medium's kernel
                for layout in TRAINING_LAYOUTS}
    assert covered == expected and len(plan.jobs) == len(expected)  # one kernel each, nothing else


@pytest.mark.parametrize("m, n, expected", [
    (2048, 2048, "large"),     # 128 tiles of 128x256: one wave
    (512, 4096, "medium"),     # 64 of 128x256 leave half the SMs idle; 128 of 128x128 fill one wave
    (2304, 768, "medium"),     # 108 of 128x128 in one wave; 48 of 192x192 or 72 of 128x192 leave more idle
    (1024, 1024, "small"),     # 128 tiles of 128x64: one wave
    (16384, 128, "medium"),    # a 256-wide tile would be half empty
    (4000, 4000, "large"),     # the goal shapes keep the tile they were tuned on
    (6304, 768, "wave_192x192"),  # 132 of 192x192: one wave; 300 of 128x128 are 2.3 (3 run)
    (3072, 3072, "wave_192x192"),  # 256 of 192x192 take 2 waves; 288 of 128x256 take 3, 576 of 128x128 take 5
    (3072, 768, "wave_128x192"),  # 96 of 128x192 (or 192x128: the tie goes to the first) against 72 of 128x256
    (3072, 1024, "wave_192x128")])  # 128 of 192x128 in one wave; 144 of 128x192 are two
def test_the_wave_model_picks_the_tile(m, n, expected):
    assert G.shape_class(meta(m, 4096), meta(4096, n), None, None, None).bucket == expected
    costs = {bucket: P._wave_cost(bucket, m, n) for bucket in P.WAVE_TILES}
    assert min(costs, key=costs.get) == expected


def test_the_gpu_tests_reach_every_wave_bucket():
    """tests/gemm_cases.py's WAVE calls (run by test_gemm_gpu.py) cover each 192 tile, in both dtypes."""
    from gemm_cases import WAVE

    reached = {(G.shape_class(*case.args("meta")).bucket, case.dtype) for case in WAVE}
    assert {bucket for bucket, _ in reached} == {b for b in P.WAVE_TILES if b.startswith("wave_")}
    assert {dtype for _, dtype in reached} == {torch.bfloat16, torch.float16}


def test_epilogue_variants_share_one_fused_kernel():
    a, b, bias = meta(1000, 256), meta(256, 384), torch.empty(384, dtype=torch.bfloat16, device="meta")
    classes = {G.shape_class(a, b, bias_, act, None) for bias_ in (None, bias) for act in (None, "relu", "gelu")}
    assert len(classes) == 2  # plain, and one fused class for every bias/activation combination


def test_sm80_launch_geometry():
    config = P.SM80_CONFIGS["large"]
    assert config.threads == 256 and config.smem_bytes() == 3 * (128 * 32 + 32 * 256) * 2
    assert R.sm80_grid(4096, 4096, config) == (32 * 8, 2, 1)   # 16 N-tiles interleaved by 8
    assert R.sm80_grid(100, 77, config) == (1, 1, 1)


def test_backward_kernels_are_known_before_the_backward_runs():
    a = meta(1000, 256).requires_grad_()
    b = meta(256, 384).requires_grad_()
    calls = jitops.gemm.op.companion_calls((a, b, None, None, None))
    classes = [op.shape_class(*args) for op, args in calls]
    # dA = dC . B^T reads B^T in place (K-major B); dB = A^T . dC reads A^T in place (M-major A).
    assert [(c.a_kmajor, c.b_kmajor) for c in classes] == [(True, True), (False, False)]
    assert [op for op, _ in calls] == [jitops.gemm.op] * 2
    # Only the gradients that are needed (frozen weights: no dB); gelu recomputes its pre-activation.
    assert len(jitops.gemm.op.companion_calls((a, b, None, None, None), needs=(True, False, False))) == 1
    gelu_calls = jitops.gemm.op.companion_calls((a, b, None, "gelu", None))
    assert [op.name for op, _ in gelu_calls] == ["gemm", "gelu_backward", "gemm", "gemm"]


def test_prewarm_items_resolve_without_a_gpu():
    """Each public gemm item resolves on meta tensors into exactly its own call's kernel (grad false: the
    backward's layouts are items of their own), on the sm_90a and the sm_80 family."""
    public = jitops.find_public("gemm")
    for item in G.PREWARM:
        for dtype in item["dtypes"]:
            for index, shapes in enumerate(item["shapes"]):
                strides = item.get("strides", [None])[index] if "strides" in item else None
                entry, shapes, kwargs = public.form(shapes, item["kwargs"])
                args = entry.example_args(dtype, shapes, kwargs, strides)
                calls = public.calls(entry, args, item["grad"])
                assert item["grad"] is False and len({op.shape_class(*a) for op, a in calls}) == 1
                for op, op_args in calls:
                    assert list(op.requests_for(op_args, SM90)) == ["sm90_light"]
                    assert list(op.requests_for(op_args, SM80)) == ["sm80"]


# ---- the sources build here ------------------------------------------------------------------------------------
def test_sm80_kernel_builds_with_nvrtc(fresh_cache):
    cls = G.shape_class(meta(100, 129), meta(129, 77), torch.empty(77, dtype=torch.bfloat16, device="meta"),
                        "gelu", None)
    request = G.cuda_kernels(cls, SM80)["sm80"]
    assert jitops.runtime.prewarm(request, SM80) == "compiled"


def test_one_sm90a_configuration_builds_with_nvrtc_and_uses_wgmma(fresh_cache):
    """One representative sm_90a build through NVRTC (about a minute on 2 cores; JITOPS_TEST_GEMM_SWEEP=1
    builds them all): no host compiler, wgmma not serialized, and the Params layout the kernel exports is the
    one CUTLASS's host code used in the fixtures that tests/test_cutlass_host.py checks the Python host with."""
    import json

    from jitops.cutlass_host import GemmLayout

    cls = G.shape_class(meta(4096, 4096), meta(4096, 4096), None, None, None)
    request = G.sm90_request(cls, P.SM90_CONFIGS["large"])
    assert request.backend == "nvrtc"
    assert jitops.runtime.prewarm(request, SM90) == "compiled"
    key, _ = jitops.runtime.key_for(request, SM90)
    entry = jitops.runtime.find_entry(key, any_toolchain=False)
    log = (entry.path / "compile.log").read_text() if (entry.path / "compile.log").exists() else ""
    assert "C7510" not in log  # wgmma not serialized (-DNDEBUG)
    cubin = (entry.path / "kernel.cubin").read_bytes()
    fixtures = json.loads((Path(__file__).parent / "cutlass_host" / "sm90_gemm_fixtures.json").read_text())
    [case] = [c for c in fixtures["cases"] if c["defines"] == dict(request.defines)]
    ours, host = GemmLayout.from_cubin(cubin), GemmLayout(*case["layout"])
    # Under NVRTC CUTLASS's TmaDescriptor is a 64-byte-aligned 128-byte struct where the host compiler sees
    # cuda.h's CUtensorMap, aligned to 128: the offsets after the first descriptor move (1280 bytes of Params
    # against 1792), which is why the Python side reads the layout from the cubin it launches.
    assert (ours.align, host.align) == (64, 128) and ours.size <= 4096  # kernel parameters: 4 KB at most
    assert all(offset % 64 == 0 for offset in (ours.tma_a, ours.tma_b, ours.tma_d))
    same = ("mode", "problem_shape", "bytes_mk", "bytes_nk", "thread_size", "epilogue_bytes_value", "smem", "threads")
    assert [getattr(ours, f) for f in same] == [getattr(host, f) for f in same]
    assert ours.scheduler - ours.hw_info == host.scheduler - host.hw_info
    cuobjdump = shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump"
    if os.path.exists(cuobjdump):
        sass = subprocess.run([cuobjdump, "-sass", str(entry.path / "kernel.cubin")], capture_output=True,
                              text=True, check=True).stdout
        assert "HGMMA" in sass


@pytest.mark.skipif(os.environ.get("JITOPS_TEST_GEMM_SWEEP") != "1", reason="set JITOPS_TEST_GEMM_SWEEP=1 "
                    "to build every sm_90a configuration (about a minute each on 2 cores)")
def test_every_sm90a_configuration_builds(fresh_cache):
    a, b = meta(4096, 4096), meta(4096, 4096)
    for bucket, config in P.SM90_CONFIGS.items():
        for dtype in (torch.bfloat16, torch.float16):
            for fused in (False, True):
                cls = G.shape_class(meta(4096, 4096, dtype), meta(4096, 4096, dtype), None, None, None)
                cls = cls._replace(bucket=bucket, fused=fused)
                assert jitops.runtime.prewarm(G.sm90_request(cls, config), SM90) == "compiled"
    del a, b


def test_first_training_call_starts_the_backward_kernels_in_background(monkeypatch):
    """A forward that needs gradients loads (compiles, when cold) dA's and dB's kernels in daemon threads, once
    per forward shape class, so their builds overlap the forward's own."""
    import threading

    requested, done = [], threading.Event()

    def fake_get_kernel(request, target, index, context):
        requested.append((dict(request.defines)["LIGHT_A_KMAJOR"], dict(request.defines)["LIGHT_B_KMAJOR"]))
        if len(requested) == 2:
            done.set()

    op_module = importlib.import_module("jitops.op")  # (jitops.op is also the declaring function)

    monkeypatch.setattr(op_module.runtime, "get_kernel", fake_get_kernel)
    monkeypatch.setattr(op_module, "ensure_context", lambda index: None)  # no GPU here
    monkeypatch.setattr(G._op.op, "target", lambda device_type, index: SM90)
    monkeypatch.setattr(op_module, "_PREFETCHED", set())
    a, b = meta(1000, 256).requires_grad_(), meta(256, 384).requires_grad_()
    G._op.op.prefetch(a, b, None, None, None)  # what jitops.gemm does on a GPU
    assert done.wait(10)
    assert sorted(requested) == [("0", "0"), ("1", "1")]  # dB = A^T . dC (M-major A'), dA = dC . B^T (K-major B')
    assert not G._op.op.prefetch(a, b, None, None, None)  # the second call starts nothing
    assert len(requested) == 2


def test_swizzle_follows_the_tile_rows_and_columns():
    large = P.SM90_CONFIGS["large"]
    assert P._swizzle(large, 4096, 4096) == large.swizzle == 8  # 32 x 16 tiles of 128x256
    assert P._swizzle(large, 16384, 2048) == 1                  # 8 columns: measured better with 1
    assert P._swizzle(large, 512, 14336) == 1                   # 4 rows: swizzle 8 would pad them to 8
    assert P._swizzle(large, 2560, 4096) == 4                   # 20 rows: 8 does not divide them, 4 does


def test_a_program_mixing_torchs_tf32_apis_still_gets_a_float32_route():
    # torch.get_float32_matmul_precision() raises once both APIs have set the flag (for the rest of the process):
    # the CUDA matmul's own flag then decides.
    m = lambda *s: torch.empty(s, dtype=torch.float32, device="meta")  # noqa: E731
    previous = torch.backends.cuda.matmul.fp32_precision  # the generic query may already refuse (sticky)
    try:
        torch.set_float32_matmul_precision("high")
        torch.backends.cuda.matmul.allow_tf32 = False
        assert G.shape_class(m(64, 32), m(32, 16), None, None, None).bucket == "cublas_fp32"
        torch.backends.cuda.matmul.allow_tf32 = True
        assert G.shape_class(m(64, 32), m(32, 16), None, None, None).bucket == "cublas_tf32"
    finally:
        torch.backends.cuda.matmul.fp32_precision = previous
