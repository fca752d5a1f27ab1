"""jitops.layer_norm without a GPU: the CPU path (C++ through the cxx backend, one build per dtype) against torch in
float64, gradients, gradcheck, opcheck, torch.compile; the error messages; the shape-class buckets; and NVRTC
compiling every CUDA kernel variant for sm_80 and sm_90a."""
from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F

import jitops
from jitops.runtime import runtime
from jitops.specs import Target
from jitops.testing import check_op

from jitops.ops import layer_norm as ln
from jitops.ops import layer_norm_plan as ln_plan

DTYPES = [torch.float32, torch.float64]
# (x shape, normalized_shape): hidden sizes 1, 7, 1000, 4097, two trailing dims, no rows at all.
CASES = [((3, 1), [1]), ((5, 7), [7]), ((4, 1000), [1000]), ((2, 4097), [4097]), ((2, 3, 4, 5), [4, 5]),
         ((0, 16), [16]), ((6,), [6])]


def reference(x, normalized_shape, weight, bias, eps):
    return F.layer_norm(x, normalized_shape, weight, bias, eps)


def samples(dtype, device):
    g = torch.Generator().manual_seed(0)
    out = []
    for i, (shape, ns) in enumerate(CASES):
        x = (torch.randn(shape, generator=g, dtype=torch.float64) * 3 + 1).to(device, dtype)
        w = torch.randn(ns, generator=g, dtype=torch.float64).to(device, dtype)
        b = torch.randn(ns, generator=g, dtype=torch.float64).to(device, dtype)
        # every other case without weight or bias, and one with a non-default eps
        out.append((x, ns, w if i % 3 != 1 else None, b if i % 3 != 2 else None, 1e-5 if i != 3 else 1e-3))
    return out


def test_layer_norm_cpu():
    report = check_op(jitops.layer_norm, reference, samples=samples, dtypes=DTYPES, device="cpu", compile=True)
    assert len(report.checked) > 40


def test_layer_norm_cpu_int_normalized_shape_and_defaults():
    x = torch.randn(4, 10, dtype=torch.float64)
    torch.testing.assert_close(jitops.layer_norm(x, 10), F.layer_norm(x, (10,)))
    torch.testing.assert_close(jitops.layer_norm(x, torch.Size([10])), F.layer_norm(x, (10,)))


@pytest.mark.parametrize("wanted", ["x", "weight", "bias", "weight+bias"])
def test_layer_norm_cpu_computes_only_the_gradients_asked_for(wanted):
    x = torch.randn(8, 33, dtype=torch.float64, requires_grad="x" in wanted)
    w = torch.randn(33, dtype=torch.float64, requires_grad="weight" in wanted)
    b = torch.randn(33, dtype=torch.float64, requires_grad="bias" in wanted)
    jitops.layer_norm(x, [33], w, b).pow(2).sum().backward()
    xr, wr, br = (t.detach().requires_grad_(t.requires_grad) for t in (x, w, b))
    F.layer_norm(xr, [33], wr, br).pow(2).sum().backward()
    for ours, theirs in ((x, xr), (w, wr), (b, br)):
        if ours.requires_grad:
            torch.testing.assert_close(ours.grad, theirs.grad)
        else:
            assert ours.grad is None


def test_layer_norm_backward_op_returns_empty_for_unwanted_gradients():
    x = torch.randn(4, 9, dtype=torch.float64)
    y, stats = jitops.layer_norm_forward(x, [9], None, None, 1e-5)
    assert stats.shape == (2, 4) and stats.dtype == torch.float64
    dx, dw, db = jitops.layer_norm_backward(torch.ones_like(x), x, stats, None, [9], True, False, True)
    assert dx.shape == x.shape and dw.numel() == 0 and db.shape == (9,)
    torch.testing.assert_close(db, torch.full((9,), 4.0, dtype=torch.float64))


def test_layer_norm_cpu_backward_is_deterministic():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(777, 301, generator=g)
    w, b = torch.randn(301, generator=g), torch.randn(301, generator=g)
    dy = torch.randn(777, 301, generator=g)
    _, stats = jitops.layer_norm_forward(x, [301], w, b, 1e-5)
    first = jitops.layer_norm_backward(dy, x, stats, w, [301], True, True, True)
    for _ in range(2):
        again = jitops.layer_norm_backward(dy, x, stats, w, [301], True, True, True)
        assert all(torch.equal(a, b_) for a, b_ in zip(first, again))


def test_layer_norm_zero_rows_gives_zero_parameter_gradients():
    x = torch.randn(0, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, dtype=torch.float64, requires_grad=True)
    b = torch.randn(5, dtype=torch.float64, requires_grad=True)
    jitops.layer_norm(x, [5], w, b).sum().backward()
    assert torch.equal(w.grad, torch.zeros(5, dtype=torch.float64)) and torch.equal(b.grad, torch.zeros_like(b))
    assert x.grad.shape == (0, 5)


def test_layer_norm_backward_gets_no_zero_gradient_for_the_statistics(monkeypatch):
    """stats is not differentiable: autograd hands the backward None for it (no zero tensor allocated each
    backward), on the eager route and through torch.ops, and the gradients are torch's."""
    seen = []
    backward = ln.layer_norm_forward.op.backward

    def spy(ctx, grad, grad_stats):
        seen.append(grad_stats)
        return backward(ctx, grad, grad_stats)

    monkeypatch.setattr(ln.layer_norm_forward.op, "backward", spy)
    x = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(3, 7, dtype=torch.float64)
    jitops.layer_norm(x, [7], w).backward(dy)
    torch.ops.jitops.layer_norm_forward(x, [7], w)[0].backward(dy)
    assert seen == [None, None]
    expected = torch.autograd.grad(F.layer_norm(x, [7], w), (x, w), dy)
    torch.testing.assert_close((x.grad, w.grad), tuple(2 * g for g in expected))



@pytest.mark.parametrize("dtype", [*DTYPES, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1,), (257, 1), (3, 5, 1)])
def test_layer_norm_over_one_element_has_exactly_zero_input_gradient(shape, dtype):
    """n == 1: x is its row's mean, so dx = rstd * (g - mean(g) - 0) is exactly 0 whatever dy and the weight
    (issue 19: the CUDA backward gave -6.7e-05, g - mean(g) having become a fused multiply-add)."""
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * 3).to(dtype).requires_grad_()
    w = torch.randn(1, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    b = torch.randn(1, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    dy = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    jitops.layer_norm(x, [1], w, b).backward(dy)
    assert torch.equal(x.grad, torch.zeros_like(x))
    xr, wr, br = (t.detach().double().requires_grad_() for t in (x, w, b))
    F.layer_norm(xr, [1], wr, br).backward(dy.double())
    tolerance = 1e-5 if dtype in DTYPES else 2e-2  # fp16/bf16: sums over 257 rows rounded once
    torch.testing.assert_close(w.grad.double(), wr.grad, atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(b.grad.double(), br.grad, atol=tolerance, rtol=tolerance)

# ---- bad inputs: each error names the argument -----------------------------------------------------------------
def test_layer_norm_normalized_shape_must_match():
    x = torch.randn(4, 10)
    with pytest.raises(ValueError, match="'normalized_shape' is \\[12\\]"):
        jitops.layer_norm(x, [12])
    with pytest.raises(ValueError, match="'normalized_shape'"):
        jitops.layer_norm(x, [3, 4, 10])
    with pytest.raises(ValueError, match="'normalized_shape'"):
        jitops.layer_norm(x, [])


@pytest.mark.parametrize("name", ["weight", "bias"])
def test_layer_norm_parameter_of_the_wrong_size(name):
    x = torch.randn(4, 10)
    kwargs = {name: torch.randn(11)}
    with pytest.raises(ValueError, match=f"argument '{name}' has shape \\(11,\\), expected \\(10,\\)"):
        jitops.layer_norm(x, [10], **kwargs)


def test_layer_norm_integer_dtype():
    with pytest.raises(TypeError, match="argument 'x' has dtype int64"):
        jitops.layer_norm(torch.arange(20).reshape(2, 10), [10])
    with pytest.raises(TypeError, match="argument 'weight' has dtype int32"):
        jitops.layer_norm(torch.randn(2, 10), [10], torch.ones(10, dtype=torch.int32))
    with pytest.raises(TypeError, match="argument 'x' has dtype complex64 on cpu; supported there: float32"):
        jitops.layer_norm(torch.randn(2, 10, dtype=torch.complex64), [10])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_layer_norm_cpu_half_precision_through_the_fp32_kernel(dtype):
    """fp16 and bf16 on the CPU: the fp32 kernel on fp32 copies, one rounding at the end (torch computes them in
    float too), forward and every gradient in the input's dtype."""
    g = torch.Generator().manual_seed(6)
    x, w, b = (torch.randn(shape, generator=g).to(dtype).requires_grad_() for shape in ((5, 33), (33,), (33,)))
    y = jitops.layer_norm(x, [33], w, b)
    dy = torch.randn(5, 33, generator=g).to(dtype)
    y.backward(dy)
    refs = [t.detach().double().requires_grad_() for t in (x, w, b)]
    want = F.layer_norm(refs[0], [33], refs[1], refs[2])
    want.backward(dy.double())
    assert y.dtype == dtype and all(t.grad.dtype == dtype for t in (x, w, b))
    tolerance = 1e-2 if dtype == torch.float16 else 5e-2
    torch.testing.assert_close(y.double(), want, atol=tolerance, rtol=tolerance)
    for ours, ref in zip((x, w, b), refs):
        torch.testing.assert_close(ours.grad.double(), ref.grad, atol=tolerance, rtol=tolerance)


def test_layer_norm_wrong_device():
    with pytest.raises(ValueError, match="argument 'weight' is on meta but 'x' is on cpu"):
        jitops.layer_norm(torch.randn(2, 10), [10], torch.ones(10, device="meta"))
    with pytest.raises(ValueError, match="argument 'bias' is on meta but 'x' is on cpu"):
        jitops.layer_norm(torch.randn(2, 10), [10], None, torch.ones(10, device="meta"))


def test_layer_norm_x_must_be_a_tensor():
    with pytest.raises(TypeError, match="argument 'x' must be a torch.Tensor"):
        jitops.layer_norm([1.0, 2.0], [2])


# ---- shape classes (pure: no GPU) ---------------------------------------------------------------------------------
def meta(shape, dtype=torch.bfloat16, offset=0):
    return torch.empty(shape, dtype=dtype, device="meta") if not offset else \
        torch.empty(int(torch.tensor(shape).prod()) + offset, dtype=dtype, device="meta")[offset:].view(shape)


@pytest.mark.parametrize("n, dtype, expected", [
    (8192, torch.bfloat16, (8, 128, 8)),    # a block per row, 8 x 16 B per thread
    (1024, torch.bfloat16, (8, 32, 4)),     # a warp per row: 128-byte tiles would leave too few threads
    (4097, torch.bfloat16, (1, 256, 17)),   # odd: element accesses, just enough of them per thread
    (7, torch.float32, (1, 1, 7)),          # a thread per row
    (65536, torch.float32, (4, 1024, 8)),   # longer than one tile: streams
])
def test_forward_buckets(n, dtype, expected):
    cls = ln.shape_class(meta((4096, n), dtype), [n], None, None, 1e-5)
    assert (cls.vec, cls.tpr, cls.iters) == expected and cls.index == "int"


@pytest.mark.parametrize("n, expected", [(1024, (128, 1)), (8192, (1024, 1)), (16384, (256, 8))])
def test_few_rows_spread_each_row_over_more_threads(n, expected):
    cls = ln.shape_class(meta((64, n)), [n], None, None, 1e-5)
    assert (cls.tpr, cls.iters) == expected
    back = ln.backward_shape_class(meta((64, n)), meta((64, n)), meta((2, 64), torch.float32), None, [n], True,
                                   True, True)
    assert back.tpr <= ln_plan.BACKWARD_MAX_TPR and back.params == 3  # 64 rows: dweight/dbias by columns


def test_vector_width_follows_alignment_of_every_pointer():
    x = meta((4, 64))
    assert ln.shape_class(x, [64], meta((64,)), None, 1e-5).vec == 8
    assert ln.shape_class(x, [64], meta((64,), offset=2), None, 1e-5).vec == 2
    assert ln.shape_class(meta((4, 64), offset=1), [64], None, None, 1e-5).vec == 1
    # a non-contiguous x is copied first: its own offset does not matter
    strided = torch.empty(64, 4, dtype=torch.bfloat16, device="meta").t()
    assert ln.shape_class(strided, [64], None, None, 1e-5).vec == 8


@pytest.mark.parametrize("n, dtype, params", [
    (8192, torch.bfloat16, 1), (16384, torch.bfloat16, 1), (16384, torch.float32, 2),
    (65536, torch.bfloat16, 0), (8192, torch.float64, 2), (65536, torch.float64, 0)])
def test_backward_buckets(n, dtype, params):
    x = meta((4096, n), dtype)
    cls = ln.backward_shape_class(x, x, meta((2, 4096), torch.float32), None, [n], True, True, True)
    assert cls.params == params and cls.tpr <= ln_plan.BACKWARD_MAX_TPR


@pytest.mark.parametrize("rows, params", [(1, 1), (2, 3), (64, 3), (65, 1), (4096, 1)])
def test_a_few_rows_sum_the_parameter_gradients_by_columns(rows, params):
    """From 2 to FEW_ROWS rows, dweight/dbias come from layer_norm_param_grads (params 3); one row keeps the
    row kernel's own sums (one kernel), more rows the partial sums."""
    x = meta((rows, 1024), torch.bfloat16)
    cls = ln.backward_shape_class(x, x, meta((2, rows), torch.float32), None, [1024], True, True, True)
    assert cls.params == params
    names = set(ln.backward_cuda_kernels(cls, Target.parse("sm_90")))
    assert names == ({"backward", "param_grads"} if params == 3 else {"backward", "reduce"})


def test_index_width_switches_at_2_to_the_30():
    big = torch.empty(2**15, 2**15, dtype=torch.bfloat16, device="meta")
    assert ln.shape_class(big, [2**15], None, None, 1e-5).index == "long long"


# ---- NVRTC: every kernel variant compiles for sm_80 and sm_90a ---------------------------------------------------
VARIANTS = [(dtype, n) for dtype in ("fp32", "fp16", "bf16", "fp64") for n in (7, 1024, 8192, 16384, 65536)]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_nvrtc_compiles_every_layer_norm_variant(fresh_cache, arch):
    from test_nvrtc import cubin_sm

    target = Target.parse(arch)
    forward, backward = jitops.find("layer_norm_forward"), jitops.find("layer_norm_backward")
    seen, params_seen = set(), set()
    for dtype, n in VARIANTS:
        ns = {"normalized_shape": [n]}
        requests = list(forward.requests_for(forward.example_args(dtype, [[8, n], [n], [n]], {**ns, "eps": 1e-5}),
                                             target).values())
        for rows in (8, 512):  # a few rows (layer_norm_param_grads) and more
            bargs = backward.example_args(dtype, [[rows, n], [rows, n], [2, rows], [n]],
                                          {**ns, "need_dx": True, "need_dweight": True, "need_dbias": True})
            params_seen.add(backward.shape_class(*bargs).params)
            requests += list(backward.requests_for(bargs, target).values())
        for request in requests:
            if request in seen:
                continue
            seen.add(request)
            assert runtime.prewarm(request, target) == "compiled"
            key, _ = runtime.key_for(request, target)
            cubin = runtime.find_entry(key, any_toolchain=False).file("kernel.cubin").read_bytes()
            assert cubin_sm(cubin) == target.capability[0] * 10 + target.capability[1]
    assert params_seen == {0, 1, 2, 3}
    assert {r.kernel for r in seen} == {"layer_norm_forward", "layer_norm_backward", "layer_norm_backward_columns",
                                        "layer_norm_reduce_partials", "layer_norm_param_grads"}


def test_layer_norm_backward_op_opcheck_cpu():
    x = torch.randn(6, 30, dtype=torch.float64)
    w = torch.randn(30, dtype=torch.float64)
    _, stats = jitops.layer_norm_forward(x, [30], w, None, 1e-5)
    for mask in ((True, True, True), (True, False, False), (False, True, True)):
        torch.library.opcheck(jitops.layer_norm_backward.op.overload, (torch.randn_like(x), x, stats, w, [30], *mask))


def test_layer_norm_without_grad_uses_the_inference_op_with_the_same_result():
    """No gradient to record: jitops.layer_norm goes through layer_norm_inference (no statistics saved), with
    the forward op's result; with one, through layer_norm_forward (autograd node named after it)."""
    x = torch.randn(6, 30, dtype=torch.float64)
    w, b = torch.randn(30, dtype=torch.float64), torch.randn(30, dtype=torch.float64)
    y = jitops.layer_norm(x, [30], w, b)
    assert y.grad_fn is None
    torch.testing.assert_close(y, jitops.layer_norm_forward(x, [30], w, b, 1e-5)[0], rtol=0, atol=0)
    torch.testing.assert_close(jitops.layer_norm_inference(x, [30], w, b), F.layer_norm(x, [30], w, b))
    assert "layer_norm_forward" in type(jitops.layer_norm(x, [30], w.requires_grad_(), b).grad_fn).__name__
    with torch.no_grad():
        assert jitops.layer_norm(x, [30], w, b).grad_fn is None
    for args in ((x, [30], w.detach(), b, 1e-5), (x.view(6, 5, 6), [5, 6], None, None, 1e-3),
                 (x[:, ::2], [15], None, None, 1e-5)):
        torch.library.opcheck(jitops.layer_norm_inference.op.overload, args)


def test_layer_norm_inference_checks_its_inputs_like_the_forward():
    x = torch.randn(4, 10)
    with pytest.raises(ValueError, match="layer_norm: argument 'weight'"):
        jitops.layer_norm_inference(x, [10], torch.randn(9))
    with pytest.raises(ValueError, match="normalized_shape"):
        jitops.layer_norm(x, [11])
