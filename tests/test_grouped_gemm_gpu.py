"""jitops.grouped_gemm on a Hopper GPU: both forms in bf16 and fp16 against a float64 reference with gradients
for every input, ragged edge cases, layouts from strides, no host sync with device offsets, the ATen fallback,
opcheck and torch.compile.  Every kernel class used here is in bench_grouped_gemm.py's --prebuild list."""
from __future__ import annotations


import pytest
import torch

import jitops
from jitops.testing import check_compile, check_op

pytestmark = pytest.mark.gpu
from jitops.ops import grouped_gemm as gg
from jitops.ops import grouped_gemm_plan as gg_plan
# nvcc takes ~50 s a kernel: the GPU session reads them prebuilt (bench_grouped_gemm.py --prebuild) from the
# read-only roots in JITOPS_TEST_CACHE_PATH (conftest.py).
DTYPES = [torch.bfloat16, torch.float16]
# An empty group, one row, sizes on and off the 64/128-row tiles.
SIZES = [0, 37, 128, 129, 1, 256, 200, 63]


def hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


needs_hopper = pytest.mark.skipif(not hopper(), reason="needs a Hopper GPU: the CUTLASS kernels are sm_90a "
                                  "(other GPUs run the ATen loop)")


def ragged_reference(a, b, offsets):
    ends = [int(v) for v in offsets]
    starts = [0] + ends[:-1]
    if a.dim() == 2 and b.dim() == 3:
        return torch.cat([a[s:e] @ b[g] for g, (s, e) in enumerate(zip(starts, ends))])
    if a.dim() == 2 and b.dim() == 2:
        return torch.stack([a[:, s:e] @ b[s:e] for s, e in zip(starts, ends)])
    return torch.cat([a[g] @ b[:, s:e] for g, (s, e) in enumerate(zip(starts, ends))], dim=1)


def offsets_of(sizes, device="cuda"):
    return torch.tensor(sizes, dtype=torch.int64).cumsum(0).to(device, torch.int32)


def relative_error(got, want):
    got, want = got.double().cpu(), want.double().cpu()
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


@needs_hopper
def test_moe_ragged_matches_reference_with_gradients():
    def samples(dtype, device):
        g = torch.Generator().manual_seed(0)
        total = sum(SIZES)
        return [(torch.randn(total, 256, generator=g).to(device, dtype),
                 torch.randn(len(SIZES), 256, 128, generator=g).to(device, dtype) / 16,
                 offsets_of(SIZES, device))]
    check_op(jitops.grouped_gemm, ragged_reference, samples=samples, dtypes=DTYPES, device="cuda",
             opcheck=False, gradcheck=False)


@needs_hopper
@pytest.mark.parametrize("dtype", DTYPES)
def test_moe_weight_gradient_of_an_empty_expert_is_zero(dtype):
    x = torch.randn(sum(SIZES), 64, device="cuda", dtype=dtype, requires_grad=True)
    w = torch.randn(len(SIZES), 64, 32, device="cuda", dtype=dtype, requires_grad=True)
    y = jitops.grouped_gemm(x, w, sizes=torch.tensor(SIZES, device="cuda"))
    y.backward(torch.randn_like(y))
    assert torch.equal(w.grad[0], torch.zeros_like(w.grad[0]))
    assert all(w.grad[g].abs().sum() > 0 for g in range(1, len(SIZES)))
    assert torch.isfinite(x.grad).all()


@needs_hopper
@pytest.mark.parametrize("dtype", DTYPES)
def test_list_matches_reference_with_gradients_for_every_element(dtype):
    dims = [(128, 64, 64), (37, 256, 128), (1, 64, 8), (300, 128, 256), (0, 64, 64), (16, 0, 32)]

    def samples(dtype, device):
        g = torch.Generator().manual_seed(1)
        return [([torch.randn(m, k, generator=g).to(device, dtype) for m, k, _ in dims],
                 [torch.randn(k, n, generator=g).to(device, dtype) / 8 for _, k, n in dims])]
    check_op(jitops.grouped_gemm, lambda As, Bs: [a @ b for a, b in zip(As, Bs)], samples=samples,
             dtypes=[dtype], device="cuda", opcheck=False, gradcheck=False)


@needs_hopper
def test_large_uniform_list_forward_and_backward():
    As = [torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2)]
    Bs = [torch.randn(1024, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2)]
    outs = jitops.grouped_gemm(As, Bs)
    grads = [torch.randn_like(o) for o in outs]
    torch.autograd.backward(outs, grads)
    for a, b, o, g in zip(As, Bs, outs, grads):
        assert relative_error(o, a.float() @ b.float()) < 1e-2
        assert relative_error(a.grad, g.float() @ b.float().T) < 1e-2
        assert relative_error(b.grad, a.float().T @ g.float()) < 1e-2


@needs_hopper
@pytest.mark.parametrize("transpose_a,transpose_b", [(True, True), (True, False), (False, True)])
def test_layouts_come_from_strides_without_copies(transpose_a, transpose_b):
    g = torch.Generator().manual_seed(2)
    dims = [(64, 128, 32), (40, 64, 16)]
    As = [torch.randn(m, k, generator=g).to("cuda", torch.bfloat16) for m, k, _ in dims]
    Bs = [torch.randn(k, n, generator=g).to("cuda", torch.bfloat16) for _, k, n in dims]
    As = [a.T.contiguous().T for a in As] if transpose_a else As  # same values, column-major storage
    Bs = [b.T.contiguous().T for b in Bs] if transpose_b else Bs
    cls = gg.list_shape_class(As, Bs)
    assert (cls.kernel.a_row, cls.kernel.b_row) == (not transpose_a, not transpose_b)
    assert not any(cls.copy_a + cls.copy_b)
    for a, b, out in zip(As, Bs, jitops.grouped_gemm(As, Bs)):
        assert relative_error(out, a.float() @ b.float()) < 1e-2


@needs_hopper
@pytest.mark.parametrize("dtype", DTYPES)
def test_ragged_k_and_n_cases(dtype):
    sizes = [5, 0, 64, 131]
    offsets = offsets_of(sizes)
    total = sum(sizes)
    a = torch.randn(64, total, device="cuda", dtype=dtype)
    b = torch.randn(total, 32, device="cuda", dtype=dtype)
    dw = jitops.grouped_gemm(a, b, offsets=offsets)
    assert dw.shape == (4, 64, 32) and torch.equal(dw[1], torch.zeros_like(dw[1]))
    assert relative_error(dw, ragged_reference(a.double().cpu(), b.double().cpu(), offsets.cpu())) < 1e-2
    a3 = torch.randn(4, 64, 32, device="cuda", dtype=dtype)
    b2 = torch.randn(32, total, device="cuda", dtype=dtype)
    y = jitops.grouped_gemm(a3, b2, offsets=offsets)
    assert y.shape == (64, total)
    assert relative_error(y, ragged_reference(a3.double().cpu(), b2.double().cpu(), offsets.cpu())) < 1e-2


@needs_hopper
def test_device_offsets_need_no_host_sync():
    x = torch.randn(sum(SIZES), 128, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(len(SIZES), 128, 64, device="cuda", dtype=torch.bfloat16)
    offsets = offsets_of(SIZES)
    sizes = torch.tensor(SIZES, device="cuda")
    jitops.grouped_gemm(x, w, offsets=offsets)  # load the kernel first
    jitops.grouped_gemm([x[:64]], [w[0]])
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        y = jitops.grouped_gemm(x, w, offsets=offsets)
        y2 = jitops.grouped_gemm(x, w, sizes=sizes)
        (z,) = jitops.grouped_gemm([x[:64]], [w[0]])
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert torch.equal(y, y2)
    assert relative_error(y, ragged_reference(x.double().cpu(), w.double().cpu(), offsets.cpu())) < 1e-2
    assert relative_error(z, x[:64].double() @ w[0].double()) < 1e-2


@needs_hopper
def test_bad_device_offsets_are_caught_when_asked():
    x = torch.randn(10, 64, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2, 64, 32, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="'offsets' does not add up"):
        jitops.grouped_gemm(x, w, offsets=torch.tensor([3, 8], device="cuda"), check_offsets=True)
    y = jitops.grouped_gemm(x, w, offsets=torch.tensor([3, 99], device="cuda"))  # clamped: no crash
    torch.cuda.synchronize()
    assert y.shape == (10, 32)


def test_misaligned_sizes_fall_back_to_aten():
    x = torch.randn(20, 7, device="cuda", dtype=torch.bfloat16)  # K = 7: not 16-byte rows
    w = torch.randn(3, 7, 5, device="cuda", dtype=torch.bfloat16)
    assert gg.ragged_shape_class(x, w, offsets_of([4, 0, 16])).kernel.config == gg_plan.ATEN
    y = jitops.grouped_gemm(x, w, sizes=[4, 0, 16])
    assert relative_error(y, ragged_reference(x.double().cpu(), w.double().cpu(), [4, 4, 20])) < 1e-2


def test_errors_on_cuda_name_the_argument():
    x = torch.randn(6, 8, device="cuda", dtype=torch.float32)
    with pytest.raises(TypeError, match=r"'a' has dtype float32 on cuda"):
        jitops.grouped_gemm(x, torch.randn(2, 8, 8, device="cuda"), sizes=[2, 4])
    with pytest.raises(ValueError, match=r"'b' is on cpu"):
        jitops.grouped_gemm(x.bfloat16(), torch.randn(2, 8, 8, dtype=torch.bfloat16), sizes=[2, 4])


@needs_hopper
def test_opcheck_on_cuda():
    x = torch.randn(70, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(3, 64, 32, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    torch.library.opcheck(gg.grouped_gemm_ragged.op.overload, (x, w, offsets_of([20, 0, 50])))
    As = [torch.randn(16, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2)]
    Bs = [torch.randn(64, 32, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2)]
    torch.library.opcheck(gg.grouped_gemm_list.op.overload, (As, Bs))


@needs_hopper
def test_torch_compile_fullgraph_on_cuda():
    x = torch.randn(70, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(3, 64, 32, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    offsets = offsets_of([20, 0, 50])
    check_compile(lambda a, b: jitops.grouped_gemm(a, b, offsets=offsets), (x, w), "grouped_gemm ragged")
    As = [torch.randn(16, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2)]
    Bs = [torch.randn(64, 32, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2)]
    check_compile(lambda a0, a1, b0, b1: jitops.grouped_gemm([a0, a1], [b0, b1]), (*As, *Bs), "grouped_gemm list")
