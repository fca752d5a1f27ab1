"""jitops.conv2d without a GPU: the CPU path (ATen) against an fp64 reference, channels_last outputs, gradients,
opcheck, torch.compile and bad inputs; the CUDA path's Python side (channel padding, strided-dgrad phases,
split-K wgrad, output views) run against a CPU stand-in for the CUTLASS library; one real nvcc build."""
from __future__ import annotations

import functools
import os
import random
import time
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import jitops
from jitops.backends import toolkit
from jitops.ops import conv2d as conv_module
from jitops.ops import conv2d_plan as conv_plan
from jitops.ops import conv2d_run as conv_run
from jitops.specs import Target
from jitops.testing import check_compile, check_op

# (N, C, H, W), (K, R, S), stride, padding, dilation: the cases.
CASES = [
    ((2, 8, 9, 11), (16, 3, 3), 1, 1, 1),      # odd spatial sizes, 3x3, padding 1
    ((2, 8, 9, 11), (16, 3, 3), 2, 1, 1),      # stride 2
    ((2, 8, 10, 7), (8, 3, 3), 1, 0, 1),       # padding 0
    ((1, 16, 13, 13), (8, 3, 3), 1, 2, 2),     # dilation 2
    ((2, 16, 7, 9), (24, 1, 1), 1, 0, 1),      # 1x1
    ((2, 16, 9, 9), (32, 1, 1), 2, 0, 1),      # 1x1 stride 2 (ResNet downsample)
    ((2, 3, 11, 11), (5, 3, 3), 2, 1, 1),      # unaligned channels (C=3, K=5)
    ((1, 3, 15, 15), (8, 7, 7), 2, 3, 1),      # stem-like 7x7, C=3
    ((2, 12, 8, 8), (20, 3, 3), (2, 1), (1, 0), (1, 2)),  # asymmetric stride/padding/dilation
    ((2, 24, 9, 11), (16, 3, 3), 2, 1, 1),     # stride 2 over more channels than im2col takes: dgrad phases
]
IDS = [f"x{c[0]}-k{c[1]}-s{c[2]}-p{c[3]}-d{c[4]}".replace(" ", "") for c in CASES]


def make_args(case, dtype, device, bias=True, channels_last=False, seed=0):
    (n, c, h, w), (k, r, s), stride, padding, dilation = case
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, h, w, generator=g).to(device, dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    weight = (torch.randn(k, c, r, s, generator=g) / (c * r * s) ** 0.5).to(device, dtype)
    b = torch.randn(k, generator=g).to(device, dtype) if bias else None
    return x, weight, b, stride, padding, dilation


def reference(x, weight, bias, stride, padding, dilation):
    return F.conv2d(x, weight, bias, stride=stride, padding=padding, dilation=dilation)


def channels_last_strides(shape):
    n, c, h, w = shape
    return (h * w * c, 1, w * c, c)


# ---- CPU path: forward and backward against fp64, gradcheck, opcheck, torch.compile -----------------------------
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_cpu_path_matches_fp64_reference(case):
    def samples(dtype, device):
        return [make_args(case, dtype, device), make_args(case, dtype, device, bias=False, channels_last=True)]

    check_op(jitops.conv2d, reference, samples=samples, dtypes=[torch.float32, torch.float64], device="cpu",
             compile=case is CASES[0])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cpu_path_half_precision(dtype):
    x, w, b, *geometry = make_args(CASES[1], dtype, "cpu")
    got = jitops.conv2d(x, w, b, *geometry)
    want = reference(x.double(), w.double(), b.double(), *geometry)
    assert (got.double() - want).norm() / want.norm() < 1e-2


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw-input", "channels-last-input"])
def test_output_and_gradients_are_channels_last_in_memory(channels_last):
    x, w, b, *geometry = make_args(CASES[1], torch.float32, "cpu", channels_last=channels_last)
    y = jitops.conv2d(x, w, b, *geometry)
    assert y.stride() == channels_last_strides(y.shape)
    grad = torch.randn_like(y)
    dx = jitops.conv2d_input_grad(grad, w, x.shape, *geometry)
    dw = jitops.conv2d_weight_grad(grad, x, w.shape, *geometry)
    assert dx.stride() == channels_last_strides(x.shape)
    assert dw.stride() == channels_last_strides(w.shape)


def test_backward_computes_only_the_gradients_needed(monkeypatch):
    calls = []
    for name in ("conv2d_input_grad", "conv2d_weight_grad"):
        original = getattr(conv_module, name)
        monkeypatch.setattr(conv_module, name, lambda *a, _n=name, _f=original: calls.append(_n) or _f(*a))
    x, w, b, *geometry = make_args(CASES[0], torch.float32, "cpu")
    w.requires_grad_(True)
    jitops.conv2d(x, w, None, *geometry).sum().backward()
    assert calls == ["conv2d_weight_grad"] and x.grad is None
    calls.clear()
    x.requires_grad_(True)
    w.requires_grad_(False)
    w.grad = None
    b.requires_grad_(True)
    jitops.conv2d(x, w, b, *geometry).sum().backward()
    assert calls == ["conv2d_input_grad"] and w.grad is None
    torch.testing.assert_close(b.grad, torch.full_like(b, x.shape[0] * 9 * 11))


def test_bias_is_a_differentiable_optional_tensor():
    arg = jitops.find("conv2d").args[2]
    assert (arg.name, arg.kind) == ("bias", "optional_tensor")


@pytest.mark.parametrize("name", ["conv2d_input_grad", "conv2d_weight_grad"])
def test_gradient_ops_pass_opcheck(name):
    x, w, b, *geometry = make_args(CASES[6], torch.float64, "cpu")
    y = reference(x, w, b, *geometry)
    grad = torch.randn_like(y)
    args = (grad, w, list(x.shape)) if name == "conv2d_input_grad" else (grad, x, list(w.shape))
    torch.library.opcheck(getattr(torch.ops.jitops, name).default, (*args, *geometry))


def test_torch_compile_fullgraph_forward_and_backward():
    x, w, b, *geometry = make_args(CASES[1], torch.float32, "cpu")
    for t in (x, w, b):
        t.requires_grad_(True)
    check_compile(lambda x, w, b: jitops.conv2d(x, w, b, *geometry), (x, w, b), "conv2d")
    compiled = torch.compile(lambda x, w: jitops.conv2d(x, w, None, *geometry), fullgraph=True,
                             backend="aot_eager")
    assert compiled(x, w).stride() == channels_last_strides(compiled(x, w).shape)


# ---- bad inputs: clear errors naming the argument -------------------------------------------------------------
def test_bad_inputs_name_the_argument():
    x = torch.randn(2, 4, 8, 8)
    w = torch.randn(6, 4, 3, 3)
    with pytest.raises(ValueError, match="argument 'weight' has 5 input channels.*'x' has 4"):
        jitops.conv2d(x, torch.randn(6, 5, 3, 3))
    with pytest.raises(ValueError, match="argument 'weight' must be 4-D"):
        jitops.conv2d(x, torch.randn(6, 4, 3))
    with pytest.raises(ValueError, match="argument 'x' must be 4-D"):
        jitops.conv2d(torch.randn(1, 2, 4, 8, 8), w)
    with pytest.raises(ValueError, match="argument 'padding' is \\(-1, -1\\)"):
        jitops.conv2d(x, w, None, 1, -1)
    with pytest.raises(ValueError, match="argument 'stride'"):
        jitops.conv2d(x, w, None, 0)
    with pytest.raises(ValueError, match="argument 'dilation'"):
        jitops.conv2d(x, w, None, 1, 0, (1, 0))
    with pytest.raises(TypeError, match="argument 'weight' has dtype float64 but 'x' has float32"):
        jitops.conv2d(x, w.double())
    with pytest.raises(TypeError, match="argument 'bias' has dtype float16 but 'x' has float32"):
        jitops.conv2d(x, w, torch.randn(6, dtype=torch.float16))
    with pytest.raises(ValueError, match="argument 'bias' has shape \\(5,\\)"):
        jitops.conv2d(x, w, torch.randn(5))
    with pytest.raises(ValueError, match="argument 'weight' is on meta but 'x' is on cpu"):
        jitops.conv2d(x, w.to("meta"))
    with pytest.raises(ValueError, match="smaller than the dilated 3x3 kernel"):
        jitops.conv2d(torch.randn(1, 4, 2, 2), w)
    with pytest.raises(TypeError, match="argument 'x' has dtype int64"):
        jitops.conv2d(x.long(), w.long())



# ---- torch's argument forms: padding="same"/"valid", unbatched input, groups ------------------------------------
def grads(fn, x, w, b, grad_seed=5):
    """(output, grad_x, grad_weight, grad_bias) of fn for a random output gradient."""
    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
    b = b.detach().requires_grad_() if b is not None else None
    y = fn(x, w, b)
    grad = torch.randn(y.shape, generator=torch.Generator().manual_seed(grad_seed), dtype=y.dtype)
    y.backward(grad)
    return y, x.grad, w.grad, b.grad if b is not None else None


# (x shape, weight shape, dilation): odd and even dilated kernel extents d * (k - 1), per axis.  The first is the
# OpInfo sample issue 19 met ("invalid literal for int() with base 10: 's'"): extents 3 and 6.
SAME_CASES = [((1, 4, 5, 5), (1, 4, 2, 3), 3), ((2, 4, 7, 6), (6, 4, 3, 3), 1), ((2, 3, 6, 7), (5, 3, 2, 2), 1),
              ((1, 2, 9, 8), (3, 2, 3, 2), (1, 2)), ((2, 4, 6, 6), (4, 4, 4, 1), (2, 1))]


@pytest.mark.parametrize("x_shape, w_shape, dilation", SAME_CASES)
@pytest.mark.parametrize("unbatched", [False, True], ids=["batched", "unbatched"])
def test_padding_same_equals_torch_exactly_in_fp64(x_shape, w_shape, dilation, unbatched):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(x_shape, generator=g, dtype=torch.float64)
    w = torch.randn(w_shape, generator=g, dtype=torch.float64)
    b = torch.randn(w_shape[0], generator=g, dtype=torch.float64)
    if unbatched:
        x = x[0]
    ours = grads(lambda x, w, b: jitops.conv2d(x, w, b, padding="same", dilation=dilation), x, w, b)
    theirs = grads(lambda x, w, b: F.conv2d(x, w, b, padding="same", dilation=dilation), x, w, b)
    assert ours[0].shape == theirs[0].shape == x.shape[:-3] + (w_shape[0],) + x.shape[-2:]
    for got, want in zip(ours, theirs):
        assert torch.equal(got, want)


@pytest.mark.parametrize("unbatched", [False, True], ids=["batched", "unbatched"])
def test_padding_valid_and_unbatched_input_equal_torch_exactly_in_fp64(unbatched):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 4, 9, 8, generator=g, dtype=torch.float64)
    w = torch.randn(6, 4, 3, 2, generator=g, dtype=torch.float64)
    b = torch.randn(6, generator=g, dtype=torch.float64)
    if unbatched:
        x = x[1]
    for kwargs in ({"padding": "valid", "stride": 2}, {"padding": (1, 2), "stride": (2, 1), "dilation": 2}):
        ours = grads(lambda x, w, b: jitops.conv2d(x, w, b, **kwargs), x, w, b)
        theirs = grads(lambda x, w, b: F.conv2d(x, w, b, **kwargs), x, w, b)
        assert ours[0].dim() == x.dim()
        for got, want in zip(ours, theirs):
            assert torch.equal(got, want)
    assert torch.equal(jitops.conv2d(x, w, None, padding="valid"), F.conv2d(x, w, None))


# (x shape, weight shape, groups, kwargs): depthwise (weight [C, 1, R, S]), depthwise with a channel multiplier,
# grouped; strides, dilation, "same", unbatched, awkward sizes.
GROUPED_CASES = [((2, 6, 9, 7), (6, 1, 3, 3), 6, {"padding": 1}),
                 ((1, 4, 7, 7), (8, 1, 3, 3), 4, {"stride": 2, "dilation": (1, 2)}),
                 ((3, 6, 8, 5), (9, 2, 2, 3), 3, {"padding": "same"}),
                 ((6, 10, 11), (4, 3, 3, 3), 2, {"stride": (2, 1), "padding": (0, 2)}),
                 ((1, 1000, 1, 1), (1000, 1, 1, 1), 1000, {})]


@pytest.mark.parametrize("x_shape, w_shape, groups, kwargs", GROUPED_CASES)
def test_grouped_and_depthwise_equal_torch_exactly_in_fp64(x_shape, w_shape, groups, kwargs):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(x_shape, generator=g, dtype=torch.float64)
    w = torch.randn(w_shape, generator=g, dtype=torch.float64)
    b = torch.randn(w_shape[0], generator=g, dtype=torch.float64)
    ours = grads(lambda x, w, b: jitops.conv2d(x, w, b, groups=groups, **kwargs), x, w, b)
    theirs = grads(lambda x, w, b: F.conv2d(x, w, b, groups=groups, **kwargs), x, w, b)
    if ours[0].dim() == 4:
        assert ours[0].is_contiguous(memory_format=torch.channels_last)  # as every jitops.conv2d output
    for got, want in zip(ours, theirs):
        assert got.shape == want.shape and torch.equal(got, want)


def test_grouped_conv2d_in_half_types_and_noncontiguous_input():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 9, 8, 6, generator=g).transpose(2, 3)  # non-contiguous
    w = torch.randn(6, 3, 3, 3, generator=g)
    for dtype in (torch.float16, torch.bfloat16):
        got = jitops.conv2d(x.to(dtype), w.to(dtype), stride=2, groups=3)
        want = F.conv2d(x.double(), w.double(), stride=2, groups=3)
        assert got.dtype == dtype
        torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2 * want.abs().max().item())


def test_float32_on_cuda_and_groups_run_through_aten(monkeypatch):
    """float32 CUDA tensors (meta ones here, which the op treats as CUDA) and groups != 1 go to F.conv2d (cuDNN on
    CUDA), with groups passed on; float16 on CUDA and float32 on the CPU stay on jitops' op."""
    seen = []
    real = F.conv2d
    monkeypatch.setattr(F, "conv2d", lambda *args: seen.append(args[6]) or real(*args))  # groups
    op_calls = []
    monkeypatch.setattr(conv_module, "_conv2d", lambda *args: op_calls.append(args) or real(*args))
    x, w = torch.empty(2, 8, 6, 6, device="meta"), torch.empty(4, 8, 3, 3, device="meta")
    y = jitops.conv2d(x, w, padding=1)
    assert y.shape == (2, 4, 6, 6) and y.is_contiguous(memory_format=torch.channels_last)
    assert seen == [1] and not op_calls
    jitops.conv2d(torch.randn(2, 8, 6, 6), torch.randn(4, 2, 3, 3), groups=4)
    assert seen == [1, 4] and not op_calls
    jitops.conv2d(x.half(), w.half(), padding=1)
    jitops.conv2d(torch.randn(2, 8, 6, 6), torch.randn(4, 8, 3, 3))
    assert seen == [1, 4] and len(op_calls) == 2
    with pytest.raises(TypeError, match="jitops.conv2d: argument 'x' has dtype float64 on meta"):
        jitops.conv2d(x.double(), w[:, :4].double(), groups=2)


def test_padding_same_through_torch_compile():
    x, w = torch.randn(1, 4, 5, 5), torch.randn(2, 4, 2, 3)
    compiled = torch.compile(lambda x, w: jitops.conv2d(x, w, padding="same", dilation=3), fullgraph=True,
                             backend="aot_eager")
    torch.testing.assert_close(compiled(x, w), F.conv2d(x, w, padding="same", dilation=3))


def test_bad_padding_strings_groups_and_types_name_the_argument():
    x, w = torch.randn(1, 4, 6, 6), torch.randn(2, 4, 3, 3)
    with pytest.raises(ValueError, match="jitops.conv2d: argument 'padding' is 'same' but 'stride' is 2"):
        jitops.conv2d(x, w, padding="same", stride=2)
    with pytest.raises(ValueError, match="jitops.conv2d: argument 'padding' is 'full'; use an int, a pair of ints, "
                                         "'same' or 'valid'"):
        jitops.conv2d(x, w, padding="full")
    with pytest.raises(TypeError, match="jitops.conv2d: argument 'padding' must be an int or a pair of ints"):
        jitops.conv2d(x, w, padding=1.5)
    with pytest.raises(TypeError, match="jitops.conv2d: argument 'stride' must be an int or a pair of ints"):
        jitops.conv2d(x, w, stride=(1, "s"))
    with pytest.raises(ValueError, match=r"jitops.conv2d: argument 'groups' is 3 with x of shape \(1, 4, 6, 6\)"):
        jitops.conv2d(x, torch.randn(3, 2, 3, 3), groups=3)  # 4 channels are not 3 groups of 2
    with pytest.raises(ValueError, match="jitops.conv2d: argument 'weight' has 2 input channels .* pass groups="):
        jitops.conv2d(x, torch.randn(2, 2, 3, 3))
    with pytest.raises(ValueError, match="jitops.conv2d: argument 'weight' must be 4-D"):
        jitops.conv2d(x, torch.randn(2, 4, 3), padding="same")
    # the gradient ops take ints only; a string reaching them says so instead of failing in int()
    with pytest.raises(ValueError, match="jitops.conv2d_input_grad: argument 'padding' is 'same'; use an int"):
        conv_module._geometry("conv2d_input_grad", 1, "same", 1)

def test_cuda_dtypes_are_fp16_and_bf16():
    x = torch.empty(2, 8, 8, 8, device="meta")
    w = torch.empty(8, 8, 3, 3, device="meta")
    with pytest.raises(TypeError, match="argument 'x' has dtype float32 on meta; supported there: float16, bfloat16"):
        conv_module.shape_class(x, w, None, 1, 1, 1)
    cls = conv_module.shape_class(x.half(), w.half(), None, 1, 1, 1)
    assert cls.kernel == (3, 3) and cls.aligned and cls.tile in conv_plan.TILES


def test_shape_class_names_the_geometry_and_alignment():
    x = torch.empty(32, 64, 56, 56, device="meta", dtype=torch.float16)
    cls = conv_module.shape_class(x, torch.empty(64, 64, 3, 3, device="meta", dtype=torch.float16), None, 1, 1, 1)
    assert (cls.kernel, cls.stride, cls.padding, cls.dilation, cls.aligned) == ((3, 3), (1, 1), (1, 1), (1, 1), True)
    stem = conv_module.shape_class(torch.empty(32, 3, 224, 224, device="meta", dtype=torch.float16),
                                   torch.empty(64, 3, 7, 7, device="meta", dtype=torch.float16), None, 2, 3, 1)
    assert not stem.aligned and stem.stride == (2, 2)


@pytest.fixture
def cutlass_kernels():
    """CUTLASS's conv kernels and the plans they take (JITOPS_CONV2D_SM90_KERNEL=cutlass; the light kernels':
    tests/test_light_conv.py)."""
    with jitops.config.scope(conv2d_sm90_kernel="cutlass"):
        yield


def test_kernels_are_hopper_only_and_other_gpus_fall_back_to_aten(cutlass_kernels):
    cls = conv_plan.ConvClass(torch.float16, (3, 3), (1, 1), (1, 1), (1, 1), True, "128x128")
    assert conv_module.cuda_kernels(cls, Target.parse("sm_80")) == {}
    [request] = conv_module.cuda_kernels(cls, Target.parse("sm_90a")).values()
    assert dict(request.params)["TILE_N"] == "128" and request.arch(Target.parse("sm_90")) == "sm_90a"
    [split] = conv_module.cuda_kernels(cls._replace(splits=3), Target.parse("sm_90a")).values()
    assert dict(split.params)["SPLIT_K"] == "1" and split.kernel == "conv2d_fprop_splitk"
    x, w, b, *geometry = make_args(CASES[1], torch.float32, "cpu")
    kern = SimpleNamespace(shape_class=conv_module.shape_class(x, w, b, *geometry))  # no library: sm_80
    y = conv_run.run_cuda(kern, x, w, b, *geometry)
    assert y.stride() == channels_last_strides(y.shape)
    torch.testing.assert_close(y, reference(x, w, b, *geometry))


# ---- strided dgrad: the phase plan reproduces torch's input gradient --------------------------------------------
def run_phase_plan(dy, weight, input_size, stride, padding, dilation):
    """dx from the phase plan, each phase as the unit-stride dgrad CUTLASS computes (via autograd of an
    asymmetrically padded unit-stride conv)."""
    n, c, h, w = input_size
    r, s = weight.shape[2:]
    phases, full = conv_plan.dgrad_phases((h, w), tuple(dy.shape[2:]), (r, s), stride, padding, dilation)
    dx = torch.full((n, c, h, w), float("nan"), dtype=dy.dtype)
    if not full:
        dx.zero_()
    for rows, cols in phases:
        sub = weight[:, :, list(rows.taps)][:, :, :, list(cols.taps)]
        xin = torch.zeros(n, c, rows.count, cols.count, dtype=dy.dtype, requires_grad=True)
        out = F.conv2d(F.pad(xin, (cols.lower, cols.upper, rows.lower, rows.upper)), sub,
                       dilation=(rows.dilation, cols.dilation))
        assert out.shape == dy.shape, "a phase's output extent must be exactly dy's"
        (grad,) = torch.autograd.grad(out, xin, dy)
        dx[:, :, rows.start::stride[0], cols.start::stride[1]][:, :, :rows.count, :cols.count] = grad
    return dx


def test_strided_dgrad_phases_reproduce_torch_on_random_geometries():
    rng = random.Random(5)
    checked = 0
    while checked < 300:
        r, s = rng.randint(1, 5), rng.randint(1, 5)
        stride = (rng.randint(1, 4), rng.randint(1, 4))
        dilation = (rng.randint(1, 3), rng.randint(1, 3))
        padding = (rng.randint(0, 4), rng.randint(0, 4))
        h, w = rng.randint(1, 14), rng.randint(1, 14)
        p = conv_plan.output_size(h, r, stride[0], padding[0], dilation[0])
        q = conv_plan.output_size(w, s, stride[1], padding[1], dilation[1])
        if p < 1 or q < 1:
            continue
        weight = torch.randn(3, 2, r, s, dtype=torch.float64)
        dy = torch.randn(2, 3, p, q, dtype=torch.float64)
        want = torch.nn.grad.conv2d_input((2, 2, h, w), weight, dy, stride=stride, padding=padding,
                                          dilation=dilation)
        got = run_phase_plan(dy, weight, (2, 2, h, w), stride, padding, dilation)
        torch.testing.assert_close(got, want, msg=lambda m: f"{(h, w, r, s, stride, padding, dilation)}: {m}")
        for rows, cols in conv_plan.dgrad_phases((h, w), (p, q), (r, s), stride, padding, dilation)[0]:
            assert min(rows.lower, rows.upper, cols.lower, cols.upper) >= 0
        checked += 1


def test_unit_stride_dgrad_is_one_phase_with_the_whole_filter():
    phases, full = conv_plan.dgrad_phases((56, 56), (56, 56), (3, 3), (1, 1), (1, 1), (1, 1))
    assert full and len(phases) == 1
    rows, cols = phases[0]
    assert rows == conv_plan.Phase1D(0, 56, (0, 1, 2), 1, 1, 1)


# ---- the CUDA run functions against a CPU stand-in for the CUTLASS library --------------------------------------
def k_tile_masks(channels: int, r: int, s: int, splits: int):
    """Which (channel, r, s) entries of the filter each split's k-tiles cover: CUTLASS's GEMM-K mode of fprop
    (C, S, R) and dgrad (K, S, R) is channel-tile fastest, then s, then r."""
    c_tiles = -(-channels // 64)
    k_tiles = c_tiles * r * s
    per_split = -(-k_tiles // splits)
    masks = torch.zeros(splits, channels, r, s)
    for index in range(k_tiles):
        ct, rest = index % c_tiles, index // c_tiles
        masks[index // per_split, ct * 64:(ct + 1) * 64, rest // s, rest % s] = 1
    return masks


def packed(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """What a kernel given t's address reads as a packed channel-last tensor of `shape` ([N, H, W, C] or
    [K, R, S, C]): t must hold exactly that memory, as a contiguous tensor of that shape or a channels_last one of
    the matching [N, C, H, W] shape (the run functions pass either; the kernel takes only the address)."""
    n, h, w, c = shape
    if tuple(t.shape) == (n, c, h, w) and t.is_contiguous(memory_format=torch.channels_last):
        t = t.permute(0, 2, 3, 1)
    assert tuple(t.shape) == tuple(shape) and t.is_contiguous(), (tuple(t.shape), t.stride(), shape)
    return t


class FakeConvLibrary:
    """The C ABI of kernels/conv/conv2d_sm90.cu, computed with ATen on CPU tensors.  It checks what the kernel
    requires (channel counts multiple of 8, 16-byte aligned, channel-contiguous operands, the dy extent CUTLASS
    derives, unit-stride dgrad), reads its operands as the packed memory at their addresses, and writes dgrad's
    dx through the strides it is given from the output's address, as TMA stores would; split-K calls write one
    partial sum per slice of GEMM-K, as the kernel does."""

    def __init__(self, op: int) -> None:
        self.op = op
        self.calls = []

    def jitops_conv2d(self, a, b, d, bias, n, h, w, c, k, r, s, ph, ph_hi, pw, pw_hi, sh, sw, dh, dw,
                      d_sn, d_sh, d_sw, splits, device, sms, stream):
        self.calls.append(dict(n=n, h=h, w=w, c=c, k=k, r=r, s=s, pads=(ph, ph_hi, pw, pw_hi), stride=(sh, sw),
                               dilation=(dh, dw), splits=splits))
        assert c % 8 == 0 and k % 8 == 0
        for t in (a, b, d):
            assert t.data_ptr() % 16 == 0
        p = (h + ph + ph_hi - (r - 1) * dh - 1) // sh + 1
        q = (w + pw + pw_hi - (s - 1) * dw - 1) // sw + 1
        split = d.dim() == 5  # fp32 slices; wgrad's direct variant writes dw [k, c, r, s] itself
        if self.op == 0:
            a, b = packed(a, (n, h, w, c)), packed(b, (k, r, s, c))
            d = d if split else packed(d, (n, p, q, k))
        elif self.op == 1:
            a, b = packed(a, (n, p, q, k)), packed(b, (k, r, s, c))
            if not split:  # dx from d's address with the strides given (a phase of a strided dgrad)
                d = torch.as_strided(d, (n, h, w, c), (d_sn, d_sh, d_sw, 1), d.storage_offset())
        else:
            a, b = packed(a, (n, p, q, k)), packed(b, (n, h, w, c))
        if split:
            assert d.is_contiguous() and d.dtype == torch.float32 and d.shape[0] == splits and bias is None
        else:
            assert splits == 1

        def conv(xin, weight):
            return F.conv2d(F.pad(xin, (pw, pw_hi, ph, ph_hi)), weight.to(xin.dtype), stride=(sh, sw),
                            dilation=(dh, dw))

        if self.op == 0:
            assert tuple(a.shape) == (n, h, w, c) and tuple(d.shape[-4:]) == (n, p, q, k)
            x, weight = a.permute(0, 3, 1, 2).double(), b.permute(0, 3, 1, 2).double()   # [k, c, r, s]
            if split:
                masks = k_tile_masks(c, r, s, splits).double()
                for index in range(splits):
                    d[index].copy_(conv(x, weight * masks[index]).permute(0, 2, 3, 1))
            else:
                y = conv(x, weight)
                if bias is not None:
                    y = y + bias.double().view(1, k, 1, 1)
                d.copy_(y.permute(0, 2, 3, 1))
        elif self.op == 1:
            assert (sh, sw) == (1, 1), "CUTLASS's sm90 dgrad is unit-stride only"
            assert tuple(a.shape) == (n, p, q, k), f"dy {tuple(a.shape)} != derived {(n, p, q, k)}"
            assert tuple(d.shape[-4:]) == (n, h, w, c)
            weight = b.permute(0, 3, 1, 2).double()                                       # [k, c, r, s]
            masks = k_tile_masks(k, r, s, splits).double() if split else None
            for index in range(splits if split else 1):
                part = weight if not split else weight * masks[index].unsqueeze(1)        # mask over k
                xin = torch.zeros(n, c, h, w, dtype=torch.float64, requires_grad=True)
                (grad,) = torch.autograd.grad(conv(xin, part), xin, a.permute(0, 3, 1, 2).double())
                (d[index] if split else d).copy_(grad.permute(0, 2, 3, 1))
        else:
            assert tuple(a.shape) == (n, p, q, k) and tuple(b.shape) == (n, h, w, c)
            if split:
                out = d
                assert d.shape == (splits, k, r, s, c)
            else:  # WGRAD_DIRECT: dw itself, KRSC memory, in the operands' dtype
                assert d.dtype == a.dtype and d.is_contiguous(memory_format=torch.channels_last)
                assert tuple(d.shape) == (k, c, r, s)
                out = d.permute(0, 2, 3, 1).unsqueeze(0)
            x = F.pad(b.permute(0, 3, 1, 2).double(), (pw, pw_hi, ph, ph_hi))
            cols = F.unfold(x, (r, s), dilation=(dh, dw), stride=(sh, sw))           # [n, c*r*s, p*q]
            cols = cols.view(n, c, r, s, p * q).permute(0, 4, 1, 2, 3).reshape(n * p * q, c, r, s)
            dy = a.reshape(n * p * q, k).double()
            k_tiles = -(-n * p * q // 64)                                           # GEMM-K tiles of 64
            rows_per_split = -(-k_tiles // splits) * 64
            for split_index in range(splits):
                rows = slice(split_index * rows_per_split, (split_index + 1) * rows_per_split)
                out[split_index].copy_(torch.einsum("mk,mcrs->krsc", dy[rows], cols[rows]))
        return 0


class FakeReduceKernel:
    """kernels/conv/wgrad_reduce.cu's launch, computed with ATen: it checks the arguments against the tensors
    (slice size, padded channels, dw's KRSC memory) and writes dw as the kernel would."""

    def __init__(self) -> None:
        self.calls = []

    def launch(self, grid, block, partial, dw, splits, slice_elements, rows, channels, channels_padded):
        self.calls.append(dict(splits=splits, rows=rows, channels=channels, padded=channels_padded))
        assert grid * block >= rows * channels
        assert partial.is_contiguous() and partial.dtype == torch.float32 and partial.shape[0] == splits
        assert partial[0].numel() == slice_elements and slice_elements % channels_padded == 0
        assert slice_elements // channels_padded >= rows and channels <= channels_padded
        assert dw.is_contiguous(memory_format=torch.channels_last) and dw.numel() == rows * channels
        krsc = dw.permute(0, 2, 3, 1).reshape(rows, channels)  # a view: dw's own memory
        summed = partial.reshape(splits, -1, channels_padded).double().sum(0)
        krsc.copy_(summed[:rows, :channels])


def im2col_reference(x, r, s, stride, padding, dilation, p, q, columns):
    """[N, P, Q, columns] from x [N, C, H, W]: each row one output pixel's receptive field in (r, s, c) order,
    zeros past R*S*C and for windows past the padded image (a folded matrix's last rows; torch's unfold,
    reordered)."""
    n, c, h, w = x.shape
    # Pad the bottom and right so that unfold yields at least p x q windows, then keep the first p x q.
    bottom = max(padding[0], (p - 1) * stride[0] + (r - 1) * dilation[0] + 1 - h - padding[0])
    right = max(padding[1], (q - 1) * stride[1] + (s - 1) * dilation[1] + 1 - w - padding[1])
    padded = F.pad(x.double(), (padding[1], right, padding[0], bottom))
    rows = (padded.shape[2] - (r - 1) * dilation[0] - 1) // stride[0] + 1
    cols_ = (padded.shape[3] - (s - 1) * dilation[1] - 1) // stride[1] + 1
    cols = F.unfold(padded, (r, s), dilation=dilation, stride=stride)  # [n, c*r*s, rows*cols_]
    cols = cols.view(n, c, r, s, rows, cols_)[..., :p, :q].permute(0, 4, 5, 2, 3, 1).reshape(n, p, q, r * s * c)
    return F.pad(cols, (0, columns - r * s * c)).to(x.dtype)


class FakeIm2colKernel:
    """kernels/conv/im2col.cu's launch, computed with ATen: it checks the launch against the tensors (a block per
    2**log_rows rows, its shared memory, x's strides as given) and writes the matrix as the kernel would."""

    def __init__(self) -> None:
        self.calls = []

    def launch(self, grid, block, x, out, rows, columns, log_rows, p, q, h, w, c, sn, sc, sh, sw, s, stride_h,
               stride_w, pad_h, pad_w, dil_h, dil_w, taps_c, shared_mem=0):
        self.calls.append(dict(rows=rows, taps_c=taps_c, log_rows=log_rows))
        n = x.shape[0]
        assert grid << log_rows >= rows == n * p * q and 0 <= log_rows <= 6 and out.is_contiguous()
        assert shared_mem == conv_plan._im2col_shared_bytes(1 << log_rows, columns, x.element_size()) <= 48 * 1024
        assert tuple(out.shape) == (n, p, q, columns) and columns % 8 == 0 and (sn, sc, sh, sw) == x.stride()
        assert tuple(x.shape) == (n, c, h, w) and taps_c % c == 0 and (taps_c // c) % s == 0
        r = taps_c // c // s
        out.copy_(im2col_reference(x, r, s, (stride_h, stride_w), (pad_h, pad_w), (dil_h, dil_w), p, q, columns))


class FakeCol2imKernel:
    """kernels/conv/im2col.cu's conv2d_col2im launch, computed with torch's fold: one thread per element of dx
    (NHWC memory), the columns in (r, s, c) order."""

    def __init__(self) -> None:
        self.calls = []

    def launch(self, grid, block, columns, dx_nhwc, elements, h, w, c, p, q, r, s, width, stride_h, stride_w,
               pad_h, pad_w, dil_h, dil_w):
        self.calls.append(dict(elements=elements))
        n = columns.shape[0]
        assert grid * block >= elements == dx_nhwc.numel() and dx_nhwc.is_contiguous()
        assert tuple(columns.shape) == (n, p, q, width) and columns.is_contiguous() and width >= r * s * c
        assert tuple(dx_nhwc.shape) == (n, h, w, c)
        cols = columns[..., :r * s * c].double().reshape(n, p * q, r, s, c).permute(0, 4, 2, 3, 1)
        dx = F.fold(cols.reshape(n, c * r * s, p * q), (h, w), (r, s), dilation=(dil_h, dil_w),
                    padding=(pad_h, pad_w), stride=(stride_h, stride_w))
        dx_nhwc.copy_(dx.permute(0, 2, 3, 1))


class FakeFoldWeightKernel:
    """kernels/conv/fold_weight.cu's launch, computed with ATen: the filter in the folded matrix's column order."""

    def __init__(self) -> None:
        self.calls = []

    def launch(self, grid, block, weight, out, elements, k, c, r, s, fold, taps, columns, sk, sc, sr, ss):
        self.calls.append(dict(fold=fold, taps=taps, columns=columns))
        assert grid * block >= elements == out.numel() and out.is_contiguous()
        assert tuple(weight.shape) == (k, c, r, s) and (sk, sc, sr, ss) == weight.stride()
        assert tuple(out.shape[1:]) == (taps, 1, columns) and out.shape[0] >= k and taps == -(-r // fold)
        out.zero_()
        krsc = weight.permute(0, 2, 3, 1)
        for tap in range(taps):
            rows = krsc[:, tap * fold:(tap + 1) * fold]  # the last tap may have fewer rows
            out[:k, tap, 0, :rows.shape[1] * s * c].copy_(rows.reshape(k, -1))


class FakeUnfoldKernel:
    """kernels/conv/wgrad_unfold.cu's launch, computed with ATen: the folded slices [splits][K8][taps][width]
    summed, and tap j's channels (filter rows j*fold .., each S*C long) written as dw's KRSC rows."""

    def __init__(self) -> None:
        self.calls = []

    def launch(self, grid, block, partial, dw, splits, slice_elements, k, r, row_elements, fold, taps, width):
        self.calls.append(dict(splits=splits, fold=fold, taps=taps, width=width))
        assert grid * block >= k * r * row_elements and taps == -(-r // fold) and fold * row_elements <= width
        assert partial.is_contiguous() and partial.dtype == torch.float32 and partial.shape[0] == splits
        assert partial[0].numel() == slice_elements == partial.shape[1] * taps * width and partial.shape[1] >= k
        assert dw.is_contiguous(memory_format=torch.channels_last) and dw.numel() == k * r * row_elements
        summed = partial.reshape(splits, -1, taps, width).double().sum(0)[:k, :, :fold * row_elements]
        krsc = dw.permute(0, 2, 3, 1).reshape(k, r, row_elements)  # a view: dw's own memory
        krsc.copy_(summed.reshape(k, taps * fold, row_elements)[:, :r])


# A stand-in per kernel name the conv ops request (conv2d.py: _request, _with_im2col, the weight gradient's
# reduction, the input gradient's col2im).
STAND_INS = {"fprop": lambda: FakeConvLibrary(0), "dgrad": lambda: FakeConvLibrary(1),
             "wgrad": lambda: FakeConvLibrary(2), "wgrad_direct": lambda: FakeConvLibrary(2),
             "reduce": FakeReduceKernel, "im2col": FakeIm2colKernel, "col2im": FakeCol2imKernel,
             "fold_weight": FakeFoldWeightKernel, "unfold": FakeUnfoldKernel}


@pytest.fixture
def cuda_path_on_cpu(monkeypatch):
    monkeypatch.setattr(conv_run, "_launch_args", lambda t: (0, 132, 0))

    def kernels(fn, args, op_name, tile=None, splits=None):
        """Kernels as the CUDA path gets them: the class planned for fp16 CUDA tensors of these shapes (meta
        tensors), a CPU stand-in for the library."""
        meta = [a.to(device="meta", dtype=torch.float16) if isinstance(a, torch.Tensor) else a for a in args]
        cls = fn.op.shape_class(*meta)
        cls = cls._replace(tile=tile or cls.tile, splits=splits or cls.splits)
        # The kernel set the op itself requests for this class on a Hopper GPU, each kernel replaced by its
        # stand-in: the selection (direct wgrad, reduction, im2col, col2im) is the op's, not this fixture's.
        requests = fn.op.impls["cuda"].kernels(cls, Target.parse("sm_90a"))
        assert requests, "a Hopper target gets kernels"
        return SimpleNamespace(shape_class=cls, **{name: STAND_INS[name]() for name in requests})
    return kernels


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("layout", ["nchw", "channels_last", "strided"])
@pytest.mark.parametrize("splits", [1, 3], ids=["no-split", "split3"])
def test_cuda_run_functions_on_a_cpu_stand_in(case, layout, splits, cuda_path_on_cpu):
    dtype = torch.float32
    x, w, b, *geometry = make_args(case, dtype, "cpu", channels_last=layout == "channels_last")
    if layout == "strided":
        x = x.transpose(2, 3).contiguous().transpose(2, 3)  # NCWH memory
    if layout == "channels_last":  # as a channels_last model's: its KRSC memory is used in place
        w = w.contiguous(memory_format=torch.channels_last)
    kern = cuda_path_on_cpu(jitops.conv2d, (x, w, b, *geometry), "fprop", splits=splits)
    y = conv_run.run_cuda(kern, x, w, b, *geometry)
    assert bool(getattr(kern, "im2col", None) and kern.im2col.calls) == kern.shape_class.im2col
    assert y.stride() == channels_last_strides(y.shape)
    torch.testing.assert_close(y, reference(x, w, b, *geometry), rtol=1e-4, atol=1e-4)

    grad = torch.randn_like(y).contiguous() if layout == "nchw" else torch.randn_like(y)
    dx_want = torch.nn.grad.conv2d_input(x.shape, w, grad, *geometry)
    dw_want = torch.nn.grad.conv2d_weight(x, w.shape, grad, *geometry)
    args = (grad, w, list(x.shape), *geometry)
    kern = cuda_path_on_cpu(jitops.conv2d_input_grad, args, "dgrad", splits=splits)
    dx = conv_run.run_input_grad_cuda(kern, *args)
    assert dx.stride() == channels_last_strides(x.shape)
    torch.testing.assert_close(dx, dx_want, rtol=1e-4, atol=1e-4)
    assert all(call["stride"] == (1, 1) for call in (getattr(kern, "dgrad", None) or kern.fprop).calls)
    assert hasattr(kern, "col2im") == kern.shape_class.im2col

    args = (grad, x, list(w.shape), *geometry)
    kern = cuda_path_on_cpu(jitops.conv2d_weight_grad, args, "wgrad", splits=splits)
    dw = conv_run.run_weight_grad_cuda(kern, *args)
    assert dw.stride() == channels_last_strides(w.shape)
    torch.testing.assert_close(dw, dw_want, rtol=1e-4, atol=1e-4)
    library = getattr(kern, "wgrad", None) or kern.wgrad_direct
    if kern.shape_class.fold:  # a folded wgrad: one kernel sums and unfolds every slice count, one included
        assert not hasattr(kern, "reduce")
        assert [call["splits"] for call in kern.unfold.calls] == [call["splits"] for call in library.calls]
    else:
        reduced = kern.reduce.calls if hasattr(kern, "reduce") else []
        assert [call["splits"] for call in reduced] == [call["splits"] for call in library.calls
                                                        if call["splits"] > 1]
    # one slice of aligned channels: the kernel writes dw itself (no slice, no copy)
    (c, k), (r, s) = (x.shape[1], w.shape[0]), w.shape[2:]
    im2col = c <= conv_plan.IM2COL_MAX_CHANNELS and r * s > 1
    assert hasattr(kern, "wgrad_direct") == (splits == 1 and c % 8 == 0 and k % 8 == 0 and not im2col)
    with jitops.config.scope(conv2d_wgrad_reduce_kernel=False):  # the torch reduction the benchmarks compare
        dw = conv_run.run_weight_grad_cuda(kern, *args)
    assert dw.stride() == channels_last_strides(w.shape)
    torch.testing.assert_close(dw, dw_want, rtol=1e-4, atol=1e-4)


def test_strided_few_channel_fprop_folds_filter_rows_into_the_matrix(cuda_path_on_cpu):
    # The stem (7x7 stride 2 over 3 channels): the plan folds 2 filter rows into each matrix row (2*7*3 = 42
    # columns, padded to 48, over 115 rows of the 112 outputs) and runs a 4-tap conv over the matrix.
    x = torch.randn(1, 3, 224, 224)
    w, b = torch.randn(64, 3, 7, 7) / 12, torch.randn(64)
    kern = cuda_path_on_cpu(jitops.conv2d, (x, w, b, 2, 3, 1), "fprop")
    assert kern.shape_class.fold == 2
    y = conv_run.run_cuda(kern, x, w, b, (2, 2), (3, 3), (1, 1))
    [im2col], [conv] = kern.im2col.calls, kern.fprop.calls
    assert im2col["taps_c"] == 42 and im2col["rows"] == 115 * 112
    assert (conv["r"], conv["s"], conv["c"], conv["h"], conv["stride"]) == (4, 1, 48, 115, (1, 1))
    assert y.stride() == channels_last_strides(y.shape)
    torch.testing.assert_close(y, reference(x, w, b, 2, 3, 1), rtol=1e-4, atol=1e-4)
    # Its weight gradient: a wgrad of a 4x1 filter over the same matrix's 48 channels, unfolded into dw
    grad = torch.randn_like(y)
    kern = cuda_path_on_cpu(jitops.conv2d_weight_grad, (grad, x, list(w.shape), 2, 3, 1), "wgrad")
    assert kern.shape_class.fold == 2
    dw = conv_run.run_weight_grad_cuda(kern, grad, x, list(w.shape), (2, 2), (3, 3), (1, 1))
    [conv] = kern.wgrad.calls
    assert (conv["r"], conv["s"], conv["c"], conv["h"]) == (4, 1, 48, 115)
    assert dw.stride() == channels_last_strides(w.shape)
    torch.testing.assert_close(dw, torch.nn.grad.conv2d_weight(x, w.shape, grad, 2, 3), rtol=1e-4, atol=1e-3)
    # Any fold of any filter: rows that do not fill the last tap, unequal strides, padding, dilation along W,
    # odd sizes, 5 channels (the plan folds only where it pays; here forced)
    for (n, c, h, wd), (k, r, s), stride, padding, dilation, fold in (
            ((2, 5, 17, 13), (8, 5, 3), (3, 2), (2, 1), (1, 2), 3), ((1, 3, 12, 9), (16, 7, 7), (2, 1), (3, 2),
                                                                     (1, 1), 2),
            ((2, 4, 10, 10), (8, 3, 3), (2, 2), (0, 1), (1, 1), 2)):
        x = torch.randn(n, c, h, wd).contiguous(memory_format=torch.channels_last)
        w, b = torch.randn(k, c, r, s), torch.randn(k)
        with jitops.config.scope(conv2d_fold=fold):
            kern = cuda_path_on_cpu(jitops.conv2d, (x, w, b, stride, padding, dilation), "fprop")
            grad = torch.randn_like(reference(x, w, b, stride, padding, dilation))
            grad_kerns = [cuda_path_on_cpu(jitops.conv2d_weight_grad, (grad, x, list(w.shape), stride, padding,
                                                                         dilation), "wgrad", splits=splits)
                          for splits in (1, 3)]
        assert kern.shape_class.fold == fold and all(g.shape_class.fold == fold for g in grad_kerns)
        y = conv_run.run_cuda(kern, x, w, b, stride, padding, dilation)
        [conv] = kern.fprop.calls
        assert conv["r"] == -(-r // fold) and conv["c"] == conv_plan.round_up(fold * s * c)
        torch.testing.assert_close(y, reference(x, w, b, stride, padding, dilation), rtol=1e-4, atol=1e-4)
        for kern in grad_kerns:
            dw = conv_run.run_weight_grad_cuda(kern, grad, x, list(w.shape), stride, padding, dilation)
            torch.testing.assert_close(dw, torch.nn.grad.conv2d_weight(x, w.shape, grad, stride, padding, dilation),
                                       rtol=1e-4, atol=1e-3)


def test_few_channel_layers_go_through_im2col_while_its_tables_fit_shared_memory():
    assert conv_plan._uses_im2col(3, 7, 7) and conv_plan._uses_im2col(16, 11, 11)
    assert not conv_plan._uses_im2col(3, 1, 1) and not conv_plan._uses_im2col(24, 3, 3)
    assert not conv_plan._uses_im2col(16, 15, 15)  # 3600 columns: its table alone would pass 40 KB


def test_plans_give_every_split_work_and_follow_the_gemm_shape(cutlass_kernels):
    for k_tiles in (1, 2, 7, 25, 1568):
        for splits in (1, 2, 3, 8, 98, 300):
            n = conv_plan.normalize_splits(k_tiles, splits)
            per_split = -(-k_tiles // n)
            assert 1 <= n <= splits and (n - 1) * per_split < k_tiles
    # layer1 1x1 64->64 at 56x56, batch 32: narrow N -> a 64-wide tile (two along M sharing the filter tile),
    # no split (one k-tile)
    assert conv_plan.plan_gemm("fprop", 32 * 56 * 56, 64, 1) == ("128x64c2x1", 1)
    # layer4 3x3 512->512 at 7x7: few M tiles, long k-loops -> 128x64 pairs sharing the activation tile; fprop
    # never splits K unless forced (it measured slower)
    assert conv_plan.plan_gemm("fprop", 32 * 7 * 7, 512, 72) == ("128x64c1x2", 1)
    with jitops.config.scope(conv2d_splits={"fprop": 2}):
        assert conv_plan.plan_gemm("fprop", 32 * 7 * 7, 512, 72) == (conv_plan.SPLIT_TILE, 2)
    # wgrad (the fitted cost model): a 64-output-channel 3x3 layer over 64 channels takes the tile of a whole
    # filter row (3 taps x 64 channels: 3 work tiles per slice) and splits its 1568 k-steps to fill the SMs;
    # short k-loops (the 7x7 layers) do not split, and a 1x1 one takes a cluster; the 3x3 256 reference layer
    # keeps its large tile
    tile, splits, flat = conv_plan.plan_wgrad(64, 64, (3, 3), 1568)
    assert tile == "64x192t3" and flat and 100 <= splits * 3 <= 2 * 132
    assert conv_plan.plan_wgrad(2048, 512, (1, 1), 25) == ("128x64c1x2", 1, True)
    assert conv_plan.plan_wgrad(512, 512, (3, 3), 25)[1] == 1
    assert conv_plan.plan_wgrad(256, 256, (3, 3), 1568) == ("128x256", 7, True)
    # the model's terms: more slices cost reduction traffic, fewer leave SMs idle
    cost = functools.partial(conv_plan.wgrad_cost_us, "128x64", k=512, channels=128, filter_rs=(1, 1),
                             k_tiles=392)
    assert cost(16) < cost(1) and cost(16) < cost(131)
    for name in ("fprop", "dgrad"):
        with jitops.config.scope(conv2d_tile={name: "128x256"}, conv2d_splits={name: 1}):
            assert conv_plan.plan_gemm(name, 100352, 256, 36) == ("128x256", 1)
    with jitops.config.scope(conv2d_tile={"wgrad": "128x256"}, conv2d_splits={"wgrad": 1}):
        assert conv_plan.plan_wgrad(256, 256, (3, 3), 36) == ("128x256", 1, True)
    # a tile over a filter row of 3 taps x 64 channels cannot run a 1x1 filter or 128 channels
    with jitops.config.scope(conv2d_tile={"wgrad": "64x192t3"}, conv2d_splits={"wgrad": 1}):
        for channels, filter_rs in ((64, (1, 1)), (128, (3, 3)), (64, (3, 5))):
            with pytest.raises(ValueError, match="64x192t3.*3 taps x 64 channels"):
                conv_plan.plan_wgrad(64, channels, filter_rs, 36)
        assert conv_plan.plan_wgrad(64, 64, (3, 3), 36)[0] == "64x192t3"
    # a tile the plan does not have, and malformed overrides, are refused by name
    with jitops.config.scope(conv2d_tile={"fprop": "96x96"}):
        with pytest.raises(ValueError, match=r"config.conv2d_tile\['fprop'\] is '96x96'"):
            conv_plan.plan_gemm("fprop", 100352, 256, 36)
    for bad in ({"fpropp": "128x64"}, {"fprop": 128}, ["fprop"]):
        with pytest.raises(jitops.ConfigError, match="conv2d_tile"):
            with jitops.config.scope(conv2d_tile=bad):
                pass
    with pytest.raises(jitops.ConfigError, match="conv2d_splits"):
        with jitops.config.scope(conv2d_splits={"wgrad": 0}):
            pass


def test_wgrad_work_tiles_count_the_filter_mode_as_the_kernel_tiles_it():
    # CUTLASS tiles wgrad's (C,S,R) mode by channels of one tap: a 128-wide tile over 64 channels of a 3x3
    # filter runs 9 half-empty work tiles (not 576 / 128 = 5), a 64-wide one 9 full ones, a tile over the 3
    # taps of a filter row 3; over 256 channels a 128-wide tile runs 2 per tap.
    work = conv_plan.wgrad_work_tiles
    assert work("64x128", 64, 64, (3, 3), 1) == 9 and work("64x64", 64, 64, (3, 3), 1) == 9
    assert work("64x192t3", 64, 64, (3, 3), 2) == 6 and work("128x128", 256, 256, (3, 3), 1) == 2 * 18
    assert work("128x64c1x2", 2048, 512, (1, 1), 1) == 16 * 8 and work("128x256", 64, 64, (3, 3), 1) == 9
    # which tiles a layer can take, and which of them store dw flat
    assert "64x192t3" in conv_plan.wgrad_candidates(64, (3, 3))
    assert not {"64x192t3", "128x64c1x2"} & set(conv_plan.wgrad_candidates(128, (3, 3)))
    assert "64x192t3" not in conv_plan.wgrad_candidates(64, (1, 1))
    assert conv_plan.wgrad_flat("64x192t3", 64, (3, 3)) and not conv_plan.wgrad_flat("64x128", 64, (1, 3))


def test_wgrad_plans_a_tile_that_stores_dw_flat_where_one_exists(cutlass_kernels):
    # A tile's columns are a flat range of dw's R*S*C only for a 1x1 filter, C a multiple of the tile width, or
    # a tile over a whole filter row: a 128-wide tile over 64 channels of a 3x3 filter covers the 64 channels
    # of one tap and 64 empty columns.
    assert conv_plan.wgrad_flat("128x64", 64, (3, 3)) and not conv_plan.wgrad_flat("64x128", 64, (3, 3))
    assert conv_plan.wgrad_flat("64x128", 64, (1, 1)) and conv_plan.wgrad_flat("128x256", 512, (3, 3))
    # The plan takes a tile that stores through TMA where one exists: a flat one, or a 64-row tile (which stores
    # from registers either way); a layer whose channels no tile width divides stores from registers, as does
    # the stem's wgrad over its folded matrix (a 4x1 filter of 48 channels: _plan_fold).
    op = jitops.find("conv2d_weight_grad")
    sm90a = Target.parse("sm_90a")
    for c, k, kernel, stride, padding, flat in ((64, 64, 3, 1, 1, True), (256, 256, 3, 1, 1, True),
                                                (64, 256, 3, 1, 1, True), (64, 64, 1, 1, 0, True),
                                                (3, 64, 7, 2, 3, False), (24, 256, 3, 1, 1, False)):
        x = torch.empty(32, c, 56, 56, device="meta", dtype=torch.float16)
        out = conv_plan.output_size(56, kernel, stride, padding, 1)
        dy = torch.empty(32, k, out, out, device="meta", dtype=torch.float16)
        cls = op.shape_class(dy, x, (k, c, kernel, kernel), stride, padding, 1)
        assert cls.flat == flat, (c, k, kernel, cls)
        if not cls.im2col:
            assert cls.flat == conv_plan.wgrad_flat(cls.tile, c, (kernel, kernel))
            assert cls.flat or conv_plan.TILES[cls.tile].m == 64 or c % 64, cls
        [request] = [r for name, r in conv_module.weight_grad_cuda_kernels(cls, sm90a).items() if "wgrad" in name]
        assert dict(request.params)["WGRAD_FLAT"] == str(int(flat))


def test_overrides_reach_the_shape_class():
    x = torch.empty(32, 256, 56, 56, device="meta", dtype=torch.float16)
    w = torch.empty(256, 256, 3, 3, device="meta", dtype=torch.float16)
    seen = set()
    for tile in conv_plan.OPERATOR_TILES["fprop"]:
        with jitops.config.scope(conv2d_tile={"fprop": tile}):
            seen.add(conv_module.shape_class(x, w, None, 1, 1, 1).tile)
    assert seen == set(conv_plan.OPERATOR_TILES["fprop"])


# ---- one real nvcc build of a representative sm_90a configuration ----------------------------------------------
@pytest.mark.skipif(toolkit.nvcc_path() is None, reason="no nvcc on this machine")
def test_nvcc_builds_one_fprop_configuration_for_sm90a(fresh_cache, cutlass_kernels):
    """fprop, fp16, ResNet-50's layer1 3x3 (a 128x64 tile): about a minute of nvcc on a 2-core box.
    JITOPS_TEST_CONV_SWEEP=1 builds every configuration the ResNet-50 prewarm list needs instead (tens of
    minutes)."""
    target = Target.parse("sm_90a")
    op = jitops.find("conv2d")
    requests = {}
    fprop_items = [item for item in conv_module.PREWARM if item["op"] == "conv2d"]
    items = conv_module.PREWARM if os.environ.get("JITOPS_TEST_CONV_SWEEP") else fprop_items[2:3]  # 3x3, 64->64
    sweep = bool(os.environ.get("JITOPS_TEST_CONV_SWEEP"))
    for item in items:
        for dtype in (item["dtypes"] if sweep else ["fp16"]):
            public = jitops.find_public(item["op"])  # a public conv2d item: fprop, and with the sweep its backward
            entry, shapes, kwargs = public.form(item["shapes"][0], item["kwargs"])
            args = entry.example_args(dtype, shapes, kwargs)
            for declared, call_args in (public.calls(entry, args) if sweep else [(entry, args)]):
                for request in declared.requests_for(call_args, target).values():
                    requests[jitops.runtime.key_for(request, target)[0].request_hash] = request
    assert op.name == "conv2d" and requests
    for request in requests.values():
        started = time.perf_counter()
        assert jitops.runtime.prewarm(request, target) == "compiled"
        print(f"{request.label()}: {time.perf_counter() - started:.1f} s")
    assert list(fresh_cache.glob("v1/sm_90a/fp16/conv2d_fprop-*"))
    library = jitops.runtime.get_kernel(next(iter(requests.values())), target, None)
    assert library.jitops_conv2d_info(4) == 384  # one producer and two consumer warpgroups
    assert library.jitops_conv2d_info(2) >= 3    # pipeline stages
