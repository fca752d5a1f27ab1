"""jitops.add's general path on the GPU (kernels/add_broadcast.cu): broadcasting, alpha, strided inputs, type
promotion and Python numbers against torch.add, every dtype, gradients, opcheck, torch.compile; and the common
call still on add.cu's kernel."""
from __future__ import annotations


import pytest
import torch

import jitops
from jitops.testing import check_op
from test_ops_cpu import PROMOTION, add_positional, broadcast_samples

pytestmark = pytest.mark.gpu
from jitops.ops import add as add_module
CUDA_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def test_add_cuda_broadcasting_and_alpha():
    report = check_op(add_positional, lambda a, b, alpha: torch.add(a, b, alpha=alpha), samples=broadcast_samples,
                      dtypes=CUDA_DTYPES, device="cuda", compile=True)
    assert len(report.checked) > 100


@pytest.mark.parametrize("case", range(len(PROMOTION)))
@pytest.mark.parametrize("alpha", [1, -3.125])
def test_add_cuda_type_promotion_and_numbers_match_torch(case, alpha):
    a, b = (make() for make in PROMOTION[case])
    if not any(isinstance(t, torch.Tensor) for t in (a, b)):
        pytest.skip("two Python numbers give a CPU tensor: the CPU test covers them")
    a, b = (t.cuda() if isinstance(t, torch.Tensor) else t for t in (a, b))
    want = torch.add(a, b, alpha=alpha)
    got = jitops.add(a, b, alpha=alpha)
    assert got.dtype == want.dtype and got.shape == want.shape and got.is_cuda
    if alpha == 1:  # the same conversions, sum and one rounding as torch's kernel
        assert torch.equal(got, want)
    else:
        low = got.dtype in (torch.float16, torch.bfloat16)
        torch.testing.assert_close(got, want, rtol=1e-2 if low else 1e-6, atol=1e-2 if low else 1e-5)


@pytest.mark.parametrize("dtype", CUDA_DTYPES)
def test_add_cuda_strided_and_many_dimension_inputs(dtype):
    g = torch.Generator().manual_seed(3)
    cases = [
        (torch.randn(64, 96, generator=g)[:, ::3], torch.randn(32, generator=g)),            # a strided view
        (torch.randn(40, 50, generator=g).t(), torch.randn(50, 40, generator=g)),           # transposed
        (torch.randn(2, 3, 2, 3, 2, 3, 2, generator=g).permute(6, 5, 4, 3, 2, 1, 0),
         torch.randn(2, 3, 2, 3, 2, 3, 2, generator=g).permute(6, 5, 4, 3, 2, 1, 0).contiguous()),  # copied first
        (torch.randn(1, 300, 1, generator=g), torch.randn(700, 1, 129, generator=g)),      # 270900 elements
    ]
    for a, b in cases:
        a, b = a.to("cuda", dtype), b.to("cuda", dtype)
        for alpha in (1, 0.5):
            want = torch.add(a, b, alpha=alpha)
            got = jitops.add(a, b, alpha=alpha)
            assert got.is_contiguous() and got.shape == want.shape
            torch.testing.assert_close(got, want, rtol=1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-6,
                                       atol=1e-5)


def test_add_cuda_common_call_keeps_the_vectorized_kernel_and_the_rest_the_general_one():
    a, b = torch.randn(4097, device="cuda"), torch.randn(4097, device="cuda")
    jitops.add(a, b)
    jitops.add(a, b[:1], alpha=2)
    common = jitops.add.op._memo[(0, add_module.shape_class(a, b, 1))]
    general = jitops.add.op._memo[(0, add_module.shape_class(a, b[:1], 2))]
    assert hasattr(common, "forward") and not hasattr(common, "broadcast")
    assert hasattr(general, "broadcast") and general.shape_class.dims == 1


def test_add_cuda_python_number_and_cpu_scalar_tensor():
    x = torch.randn(5, 3, device="cuda", dtype=torch.bfloat16)
    assert torch.equal(jitops.add(x, 0.1), torch.add(x, 0.1))
    assert torch.equal(jitops.add(0.1, x, alpha=1), torch.add(0.1, x))
    with pytest.raises(ValueError, match="jitops.add: argument 'b' is on cpu but 'a' is on cuda"):
        jitops.add(x, torch.tensor(0.1, dtype=torch.bfloat16))  # torch takes it as a scalar; jitops asks to move it


def test_add_cuda_gradients_sum_over_broadcast_dimensions_in_each_inputs_dtype():
    a = torch.randn(4, 1, 6, device="cuda", dtype=torch.float16, requires_grad=True)
    b = torch.randn(5, 1, device="cuda", dtype=torch.float32, requires_grad=True)
    out = jitops.add(a, b, alpha=-2.5)
    grad = torch.randn(out.shape, device="cuda")
    out.backward(grad)
    ar, br = a.detach().requires_grad_(), b.detach().requires_grad_()
    torch.add(ar, br, alpha=-2.5).backward(grad)
    assert a.grad.dtype == torch.float16 and b.grad.dtype == torch.float32
    torch.testing.assert_close(a.grad, ar.grad)
    torch.testing.assert_close(b.grad, br.grad)
