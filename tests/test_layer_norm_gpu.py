"""jitops.layer_norm on the GPU: every dtype against a float64 reference, forward and backward, awkward hidden
sizes and row counts, every backward strategy (dweight/dbias in registers, in shared memory, in the column
kernel), non-contiguous and misaligned inputs, determinism, gradcheck in float64, opcheck, torch.compile."""
from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F

import jitops
from jitops.testing import check_op

pytestmark = pytest.mark.gpu
from jitops.ops import layer_norm as ln
from jitops.ops import layer_norm_plan as ln_plan
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
# (x shape, normalized_shape): hidden 1, 7, 128, 1000, 4097, 8192, two trailing dims; 0 and 1 rows.
CASES = [((3, 1), [1]), ((9, 7), [7]), ((33, 128), [128]), ((4, 1000), [1000]), ((3, 4097), [4097]),
         ((5, 8192), [8192]), ((2, 3, 4, 50), [4, 50]), ((0, 64), [64]), ((1, 2048), [2048])]
# The backward strategies: (rows, n, dtype) -> params 1 (registers), 2 (shared memory), 0 (columns kernel).
STRATEGIES = [(300, 1024, torch.bfloat16, 1), (70, 16384, torch.float32, 2), (100, 65536, torch.bfloat16, 0),
              (100, 65536, torch.float32, 0), (80, 8192, torch.float64, 2), (70, 20000, torch.float64, 0),
              # a few rows: layer_norm_param_grads
              (64, 1024, torch.float16, 3), (40, 65536, torch.bfloat16, 3), (2, 7, torch.float32, 3),
              (20, 8192, torch.float64, 3), (6, 20000, torch.float64, 3)]


def reference(x, normalized_shape, weight, bias, eps):
    return F.layer_norm(x, normalized_shape, weight, bias, eps)


def make(shape, ns, dtype, device="cuda", seed=0, weight=True, bias=True):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 2 + 0.5).to(device, dtype)
    w = torch.randn(ns, generator=g, dtype=torch.float64).to(device, dtype) if weight else None
    b = torch.randn(ns, generator=g, dtype=torch.float64).to(device, dtype) if bias else None
    return x, w, b


def samples(dtype, device):
    out = []
    for i, (shape, ns) in enumerate(CASES):
        x, w, b = make(shape, ns, dtype, device, seed=i, weight=i % 3 != 1, bias=i % 3 != 2)
        out.append((x, ns, w, b, 1e-5))
    return out


def test_layer_norm_cuda_all_dtypes():
    report = check_op(jitops.layer_norm, reference, samples=samples, dtypes=DTYPES, device="cuda", opcheck=False)
    assert len(report.checked) > 100


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_norm_cuda_opcheck_and_compile(dtype):
    def few(dtype, device):
        return [samples(dtype, device)[i] for i in (3, 1, 6)]  # 1000 with w+b, 7 without w, (4, 50) without b

    check_op(jitops.layer_norm, reference, samples=few, dtypes=[dtype], device="cuda", compile=True,
             noncontiguous_inputs=False)
    x, w, b = make((6, 300), [300], dtype)
    _, stats = jitops.layer_norm_forward(x, [300], w, b, 1e-5)
    torch.library.opcheck(jitops.layer_norm_backward.op.overload, (torch.randn_like(x), x, stats, w, [300], True,
                                                                    True, False))


@pytest.mark.parametrize("rows, n, dtype, params", STRATEGIES)
def test_layer_norm_backward_strategies(rows, n, dtype, params):
    x, w, b = make((rows, n), [n], dtype, seed=rows)
    cls = ln.backward_shape_class(x, x, torch.empty(2, rows, device="cuda"), w, [n], True, True, True)
    assert cls.params == params
    check_op(jitops.layer_norm, reference, samples=lambda d, dev: [(x, [n], w, b, 1e-5)], dtypes=[dtype],
             device="cuda", opcheck=False, gradcheck=False, noncontiguous_inputs=False)


@pytest.mark.parametrize("shape", [(65536, 16), (65537, 40), (1, 65536), (2, 65536)])
def test_layer_norm_many_rows_and_the_longest_rows(shape):
    n = shape[1]
    for dtype in (torch.bfloat16, torch.float32):
        x, w, b = make(shape, [n], dtype, seed=n)
        check_op(jitops.layer_norm, reference, samples=lambda d, dev: [(x, [n], w, b, 1e-5)], dtypes=[dtype],
                 device="cuda", opcheck=False, gradcheck=False, noncontiguous_inputs=False)


@pytest.mark.parametrize("rows, n, dtype", [(4096, 1024, torch.bfloat16), (300, 8192, torch.bfloat16),
                                            (70, 16384, torch.float32), (40, 65536, torch.float16),
                                            (1000, 96, torch.float32), (64, 1024, torch.bfloat16)])
def test_layer_norm_backward_is_deterministic(rows, n, dtype):
    x, w, b = make((rows, n), [n], dtype, seed=1)
    dy = torch.randn(rows, n, device="cuda", dtype=dtype)
    _, stats = jitops.layer_norm_forward(x, [n], w, b, 1e-5)
    first = [t.clone() for t in jitops.layer_norm_backward(dy, x, stats, w, [n], True, True, True)]
    for _ in range(3):
        again = jitops.layer_norm_backward(dy, x, stats, w, [n], True, True, True)
        for a, b_ in zip(first, again):
            assert torch.equal(a, b_)


def test_layer_norm_forward_outputs_every_element_and_matches_torch_kernel():
    for n in (1, 7, 1000, 4097, 8192, 65536):
        x, w, b = make((37, n), [n], torch.bfloat16, seed=n)
        y = jitops.layer_norm(x, [n], w, b)
        expected = F.layer_norm(x.double(), [n], w.double(), b.double())
        assert not torch.isnan(y).any()
        torch.testing.assert_close(y.double(), expected, rtol=1.6e-2, atol=1.6e-2 * expected.abs().max().item())


@pytest.mark.parametrize("offset", [1, 2, 3, 4])
def test_layer_norm_misaligned_views(offset):
    base = torch.randn(40 * 1024 + 8, device="cuda", dtype=torch.bfloat16)
    x = base[offset:offset + 40 * 1024].view(40, 1024)
    wbase = torch.randn(1024 + 8, device="cuda", dtype=torch.bfloat16)
    w = wbase[offset:offset + 1024]
    cls = ln.shape_class(x, [1024], w, None, 1e-5)
    assert cls.vec < 8
    check_op(jitops.layer_norm, reference, samples=lambda d, dev: [(x, [1024], w, None, 1e-5)],
             dtypes=[torch.bfloat16], device="cuda", opcheck=False, gradcheck=False, noncontiguous_inputs=False)


def test_layer_norm_transposed_and_sliced_inputs():
    x = torch.randn(512, 64, device="cuda").t()      # (64, 512), column-major
    w = torch.randn(1024, device="cuda")[::2]        # stride 2
    torch.testing.assert_close(jitops.layer_norm(x, [512], w), F.layer_norm(x, [512], w), rtol=2e-5, atol=2e-5)
    xg = x.detach().requires_grad_()
    jitops.layer_norm(xg, [512], w).square().sum().backward()
    xr = x.detach().requires_grad_()
    F.layer_norm(xr, [512], w).square().sum().backward()
    torch.testing.assert_close(xg.grad, xr.grad, rtol=1e-4, atol=1e-4)


def test_layer_norm_gradcheck_float64_cuda():
    for shape, ns in (((3, 7), [7]), ((2, 300), [300]), ((4, 2, 5), [2, 5])):
        x, w, b = make(shape, ns, torch.float64)
        args = tuple(t.requires_grad_() for t in (x, w, b))
        assert torch.autograd.gradcheck(lambda a, c, d: jitops.layer_norm(a, ns, c, d), args)


def test_layer_norm_wrong_device():
    x = torch.randn(4, 16, device="cuda")
    with pytest.raises(ValueError, match="argument 'weight' is on cpu but 'x' is on cuda:0"):
        jitops.layer_norm(x, [16], torch.ones(16))
    with pytest.raises(ValueError, match="argument 'bias' is on cpu but 'x' is on cuda:0"):
        jitops.layer_norm(x, [16], None, torch.ones(16))


def test_backward_grid_comes_from_the_drivers_occupancy_calculator():
    x, w, b = make((4096, 8192), [8192], torch.bfloat16)
    _, stats = jitops.layer_norm_forward(x, [8192], w, b, 1e-5)
    jitops.layer_norm_backward(x, x, stats, w, [8192], True, True, True)
    cls = ln.backward_shape_class(x, x, stats, w, [8192], True, True, True)
    kernels = jitops.layer_norm_backward.op._memo[(0, cls)]
    blocks = kernels.backward.max_active_blocks(ln_plan._threads(cls.tpr), 0)
    assert 1 <= blocks <= 2048 // ln_plan._threads(cls.tpr)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_short_path_shape_class_matches_the_checked_one(dtype):
    """The forward's shape class takes a short path for the common call; on every kind of call it must give
    what the full checks give (or leave the call to them)."""
    base = torch.randn(300 * 1024 + 16, device="cuda", dtype=dtype)
    calls = []
    for rows, n in ((1, 128), (3, 7), (300, 1024), (2, 4097)):
        x = base[: rows * n].view(rows, n)
        w = torch.randn(n, device="cuda", dtype=dtype)
        b = torch.randn(n, device="cuda", dtype=dtype)
        calls += [(x, [n], w, b), (x, [n], None, b), (x, [n], w, None), (x, [n], None, None), (x, n and (n,), w, b)]
        calls.append((base[1: 1 + rows * n].view(rows, n), [n], w, b))       # misaligned x
        calls.append((x, [n], torch.randn(n + 1, device="cuda", dtype=dtype)[1:], b))  # misaligned weight
        calls.append((x.t().contiguous().t() if rows > 1 else x, [n], w, b))  # non-contiguous x
    calls.append((base[:24].view(2, 3, 4), [3, 4], None, None))               # two normalized dimensions
    for x, ns, w, b in calls:
        assert ln.shape_class(x, ns, w, b, 1e-5) == ln._checked_shape_class(x, ns, w, b, 1e-5), (x.shape, ns)
        torch.testing.assert_close(jitops.layer_norm(x, ns, w, b).float(),
                                   F.layer_norm(x.float(), ns, *(t.float() if t is not None else None for t in (w, b))),
                                   rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1,), (2, 1), (64, 1), (300, 1), (4, 3, 1)])
def test_layer_norm_over_one_element_has_exactly_zero_input_gradient(shape, dtype):
    """n == 1: x is its row's mean, so dx is exactly 0 whatever dy and the weight.  Issue 19: -6.7e-05 in fp32,
    where the backward's g - mean(g) became fma(dy, w, -mean(g)) and kept the product's rounding error.
    Shapes cover one row, the few-rows path and the many-rows path."""
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 3).to("cuda", dtype).requires_grad_()
    w = torch.randn(1, generator=g, dtype=torch.float64).to("cuda", dtype).requires_grad_()
    b = torch.randn(1, generator=g, dtype=torch.float64).to("cuda", dtype).requires_grad_()
    dy = torch.randn(shape, generator=g, dtype=torch.float64).to("cuda", dtype)
    jitops.layer_norm(x, [1], w, b).backward(dy)
    assert torch.equal(x.grad, torch.zeros_like(x))
    xr, wr, br = (t.detach().double().requires_grad_() for t in (x, w, b))
    F.layer_norm(xr, [1], wr, br).backward(dy.double())
    tolerance = 1e-5 if dtype in (torch.float32, torch.float64) else 2e-2
    torch.testing.assert_close(w.grad.double(), wr.grad, atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(b.grad.double(), br.grad, atol=tolerance, rtol=tolerance)
