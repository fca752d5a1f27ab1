"""jitops.gemm on a real GPU: every transpose combination, both dtypes, bias and activations, fp32 output,
unaligned K/N and addresses, awkward M, both size buckets, gradients of every input against an fp64 reference,
opcheck and torch.compile; and the CUTLASS 2 (sm_80 family) kernels run on whatever GPU is present.

The calls are data (gemm_cases.py) so that tools/prebuild_gemm.py can build their kernels beforehand."""
from __future__ import annotations

import json
import os
import zlib
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from gemm_cases import ALL, AWKWARD_M, BIT_FOR_BIT, EPILOGUES, LARGE, SM80, TRANSPOSES, UNALIGNED, WAVE, Case

import jitops
from jitops.testing import check_backward, check_compile, check_forward, noncontiguous

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True, scope="module")
def _compile_stats():
    """Kernels come prebuilt (tools/prebuild_gemm.py, on a machine without a GPU) from the read-only roots
    in JITOPS_TEST_CACHE_PATH (conftest.py).  JITOPS_GEMM_STATS: a file for the run's counters."""
    yield
    stats_file = os.environ.get("JITOPS_GEMM_STATS")
    if stats_file:  # how many kernels the run still had to compile, for the session log
        Path(stats_file).write_text(json.dumps(jitops.stats.as_dict()))

# bf16 keeps 8 bits of mantissa: outputs of K-long sums round at ~2**-9 relative; fp16 at ~2**-12.
TOLERANCES = {torch.bfloat16: (1.6e-2, 1.6e-2), torch.float16: (2e-3, 2e-3), torch.float32: (1e-3, 1e-3)}


def reference(a, b, bias, activation, out_dtype):
    z = a @ b
    if bias is not None:
        z = z + bias
    if activation == "relu":
        z = torch.relu(z)
    elif activation == "gelu":
        z = F.gelu(z)
    return z


def _tolerances(case: Case) -> dict:
    # An fp32 output of bf16 inputs is still a bf16-input product; the reference is exact.
    tol = TOLERANCES[case.dtype]
    return {torch.bfloat16: tol, torch.float16: tol, torch.float32: tol}


def gemm_positional(a, b, bias, activation, out_dtype):
    """check_forward/check_backward call fn(*args): a positional front for the keyword-only public function."""
    return jitops.gemm(a, b, bias=bias, activation=activation, out_dtype=out_dtype)


def run_case(case: Case, *, grads: bool = True, variants: bool = False) -> None:
    args = case.args("cuda", seed=zlib.crc32(case.id.encode()) % 1000)  # str hash() changes per process
    dtype = case.out_dtype or case.dtype
    with jitops.config.scope(gemm_family=case.family):
        out = check_forward(gemm_positional, reference, args, dtype, case.id, _tolerances(case))
        assert out.is_contiguous() and out.dtype == dtype and out.shape == (case.m, case.n)
        if grads and case.grad:
            check_backward(gemm_positional, reference, args, dtype, case.id, _tolerances(case))
        if variants:
            strided = tuple(noncontiguous(t) if isinstance(t, torch.Tensor) else t for t in args)
            check_forward(gemm_positional, reference, strided, dtype, case.id + " strided", _tolerances(case))


@pytest.mark.parametrize("case", TRANSPOSES, ids=lambda c: c.id)
def test_transpose_combinations(case):
    run_case(case, variants=True)


@pytest.mark.parametrize("case", AWKWARD_M + LARGE + WAVE + EPILOGUES, ids=lambda c: c.id)
def test_awkward_m_large_tiles_bias_and_activations(case):
    run_case(case)


def test_opcheck_and_compile():
    a, b, bias, _, _ = Case(1000, 256, 384, bias=True).args("cuda")
    a.requires_grad_()
    b.requires_grad_()
    bias.requires_grad_()
    for activation in (None, "relu", "gelu"):
        torch.library.opcheck(jitops.gemm.op.overload, (a, b, bias, activation, None))
    torch.library.opcheck(jitops.gemm.op.overload, (a.detach(), b.detach(), None, None, torch.float32))
    for activation in (None, "gelu"):
        def fn(x, w, c, activation=activation):
            return jitops.gemm(x, w, bias=c, activation=activation)
        check_compile(fn, (a, b, bias), f"gemm {activation}")


def test_gelu_through_the_dispatcher_recomputes_the_preactivation():
    a, b, bias, _, _ = Case(256, 320, 384, bias=True).args("cuda")
    leaves = [t.detach().requires_grad_() for t in (a, b, bias)]
    out = torch.ops.jitops.gemm(*leaves, "gelu", None)
    grads = torch.autograd.grad(out.float().sum(), leaves)
    ref_leaves = [t.detach().double().requires_grad_() for t in (a, b, bias)]
    want = torch.autograd.grad(F.gelu(ref_leaves[0] @ ref_leaves[1] + ref_leaves[2]).sum(), ref_leaves)
    for g, w in zip(grads, want):
        torch.testing.assert_close(g.double(), w, rtol=3e-2, atol=3e-2 * w.abs().max().item())


def test_only_needed_gradients_are_computed():
    a, b, _, _, _ = Case(256, 320, 384).args("cuda")
    a.requires_grad_()
    out = jitops.gemm(a, b)
    assert out.grad_fn is not None
    out.float().sum().backward()
    assert a.grad is not None and b.grad is None


def test_edge_sizes():
    for m, k, n in ((0, 64, 64), (64, 0, 64), (64, 64, 0)):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        out = jitops.gemm(a, b, bias=bias, activation="relu")
        torch.testing.assert_close(out, torch.relu(a @ b + bias))


def test_bad_inputs_name_the_argument():
    a = torch.randn(64, 32, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(32, 16, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="'b'.*cpu|'b' is on"):
        jitops.gemm(a, b.cpu())
    with pytest.raises(TypeError, match="'a' has dtype float64 on cuda"):
        jitops.gemm(a.double(), b.double())
    with pytest.raises(TypeError, match="'b' has dtype float16"):
        jitops.gemm(a, b.half())
    with pytest.raises(ValueError, match="K mismatch"):
        jitops.gemm(a, b[:16])


# torch.matmul's operand forms (issue 19): folded onto the 2-D kernels, or batched through cuBLAS.  K and N odd:
# the alignment-1 CUTLASS 2 kernels, which NVRTC builds in seconds (an sm_90a class takes about a minute).
MATMUL_FORMS = [((3, 100, 63), (63, 47)), ((63,), (63, 47)), ((3, 100, 63), (63,)), ((7, 1, 1000), (1000, 7)),
                ((2, 1, 100, 63), (3, 63, 47)), ((100, 63), (3, 63, 47)), ((3, 100, 63), (1, 63, 47))]


@pytest.mark.parametrize("a_shape, b_shape", MATMUL_FORMS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_matmul_forms_on_cuda(a_shape, b_shape, dtype):
    g = torch.Generator().manual_seed(7)
    a = torch.randn(a_shape, generator=g).to("cuda", dtype)
    b = torch.randn(b_shape, generator=g).to("cuda", dtype)
    args = (a, b, None, None, None)
    tolerances = {dtype: TOLERANCES[dtype]}
    check_forward(gemm_positional, reference, args, dtype, "gemm", tolerances)
    check_backward(gemm_positional, reference, args, dtype, "gemm", tolerances)


@pytest.mark.parametrize("tf32", [False, True], ids=["fp32", "tf32"])
def test_float32_runs_cublas_as_torch_does(tf32):
    """float32 takes torch.matmul / F.linear (cuBLAS) under torch's own TF32 flag: the same numbers as torch.  The
    backward against float64 fuses a relu in full fp32 only: under TF32 a pre-activation within TF32's error of
    zero takes the other side of the relu than float64's, and its gradient is then 0 against the full value (0.9%
    of the elements in an unseeded run on the H200)."""
    previous = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        g = torch.Generator().manual_seed(11)
        a = torch.randn(256, 512, generator=g).cuda()
        b = torch.randn(512, 128, generator=g).cuda()
        bias = torch.randn(128, generator=g).cuda()
        assert jitops.gemm.op.shape_class(a, b, None, None, None).bucket == ("cublas_tf32" if tf32 else "cublas_fp32")
        torch.testing.assert_close(jitops.gemm(a, b), torch.mm(a, b), rtol=0, atol=0)
        torch.testing.assert_close(jitops.gemm(a[None], b, bias=bias), torch.matmul(a[None], b) + bias)
        torch.testing.assert_close(jitops.linear(a, b.t(), bias), F.linear(a, b.t(), bias), rtol=0, atol=0)
        error = (jitops.gemm(a, b).double() - a.double() @ b.double()).abs().max().item()
        assert (error > 1e-3) == tf32  # TF32 keeps 10 bits of mantissa; fp32 23
        activation = None if tf32 else "relu"
        check_backward(gemm_positional, reference, (a[:64, :32], b[:32, :16], bias[:16], activation, None),
                       torch.float32, "gemm", {torch.float32: (1e-2, 1e-2) if tf32 else (1e-5, 1e-5)})
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def test_repeated_calls_read_new_data_and_new_shapes():
    """The sm_90 library keeps the Params of a thread's recent calls by their pointers, sizes and strides: a call
    repeated on new data in the same buffers, and one on a narrower view of the same buffers, compute afresh."""
    a = torch.randn(256, 320, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(320, 384, device="cuda", dtype=torch.bfloat16)
    first = jitops.gemm(a, b)
    a.mul_(2)  # exact in bf16: the same kernel on the same buffers gives exactly twice the first result
    assert torch.equal(jitops.gemm(a, b), first * 2)
    narrow = jitops.gemm(a[:, :256], b[:256])  # the same start addresses, K of 256 and a's row stride of 320
    torch.testing.assert_close(narrow.float(), a[:, :256].float() @ b[:256].float(), rtol=1.6e-2, atol=1.6e-2)
    torch.testing.assert_close(jitops.gemm(a, b).float(), a.float() @ b.float(), rtol=1.6e-2, atol=1.6e-2)


def test_repeated_calls_on_new_buffers_and_bias_patch_the_cached_params():
    """The Python host side keeps a problem's packed Params and patches only the operands' addresses: other
    buffers of the same sizes, a bias appearing, and another activation each compute afresh."""
    a, b = (torch.randn(512, 256, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    w = torch.randn(256, 640, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(640, device="cuda", dtype=torch.bfloat16)
    first, second = jitops.gemm(a, w), jitops.gemm(b, w)
    torch.testing.assert_close(second.float(), b.float() @ w.float(), rtol=1.6e-2, atol=1.6e-2)
    assert not torch.equal(first, second)
    fused = jitops.gemm(a, w, bias=bias, activation="relu")
    torch.testing.assert_close(fused.float(), torch.relu(a.float() @ w.float() + bias.float()), rtol=1.6e-2,
                               atol=1.6e-2)
    other = jitops.gemm(a, w, bias=bias * 2, activation="gelu")
    torch.testing.assert_close(other.float(), F.gelu(a.float() @ w.float() + 2 * bias.float()), rtol=1.6e-2,
                               atol=1.6e-2)


@pytest.mark.parametrize("shape,dtype,fused", BIT_FOR_BIT,
                         ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else str(v))
def test_nvrtc_build_matches_nvcc_build_bit_for_bit(shape, dtype, fused):
    """jitops.gemm's sm_90a kernel built by NVRTC with its host side in Python (jitops/cutlass_host.py) gives
    the same bits as the same kernel built by nvcc with CUTLASS's host code, on bench_gemm.py's shapes, both
    compiled by this machine's CUDA release."""
    from jitops.ops import gemm as G
    from jitops.ops import gemm_plan as P
    from jitops.ops import gemm_run as R
    from jitops.specs import Target

    m, n, k = shape
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(k, n, device="cuda", dtype=dtype)
    bias = torch.randn(n, device="cuda", dtype=dtype) if fused else None
    activation = "gelu" if fused else None
    cls = G.shape_class(a, b, bias, activation, None)
    config = P.SM90_CONFIGS[cls.bucket]
    target = Target("cuda", torch.cuda.get_device_capability(0))
    reference = jitops.runtime.get_kernel(G.sm90_reference_request(cls, config), target, 0)
    # Both kernels from this machine's CUDA release.  A read-only root (a pack made on the dev box) may hold the
    # NVRTC kernel built by another NVRTC release, whose libdevice erff is another polynomial: NVRTC 13.5's
    # against nvcc 13.0's left about 0.08% of the fused GELU outputs one bf16 ulp apart (PTX compared on the dev
    # box), a compiler difference, not the host side's that this test is about.
    jitops.runtime.clear_memory()
    with jitops.config.scope(cache_path=()):
        kernel = jitops.runtime.get_kernel(G.sm90_request(cls, config), target, 0)
    ours = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    theirs = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    R.run_sm90(kernel, cls, config, a, b, ours, bias, m, n, k, k, n, P.ACTIVATIONS[activation])
    R.run_sm90_reference(reference, cls, config, a, b, theirs, bias, m, n, k, k, n, P.ACTIVATIONS[activation])
    torch.cuda.synchronize()
    assert not ours.isnan().any()
    assert torch.equal(ours.view(torch.int16), theirs.view(torch.int16))


def test_cases_are_unique():
    assert len({c.id for c in ALL}) == len(ALL)


# Last: the CUTLASS 2 kernels (a fault there would take the CUDA context, and every later test, with it).
@pytest.mark.parametrize("case", UNALIGNED + SM80, ids=lambda c: c.id)
def test_unaligned_and_sm80_family_kernels(case):
    run_case(case)
