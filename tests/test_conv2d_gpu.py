"""jitops.conv2d on the GPU (Hopper): fp16 and bf16 against an fp32 reference on the issue's cases, NCHW and
channels_last inputs, channels_last output strides, gradients, opcheck, torch.compile, streams and errors.

Set JITOPS_TEST_CACHE_PATH (tests/conftest.py) to a cache root of prebuilt kernels (benchmarks/bench_conv2d.py
--prewarm) to read them there, so that nvcc does not run on the GPU machine (benchmarks/gpu_session.sh)."""
from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F

import jitops
from jitops.testing import check_compile
from test_conv2d import CASES, IDS, channels_last_strides, make_args

# Compiling the 22 kernel configurations these tests use takes about 15 minutes of nvcc; on the lent GPU that is
# device time.  Build them anywhere with nvcc (benchmarks/bench_conv2d.py --prewarm sm_90a, no GPU needed) and
# point JITOPS_TEST_CACHE_PATH at that cache (conftest.py); without it the tests compile what they need (slow, but
# they run).
pytestmark = pytest.mark.gpu
from jitops.ops import conv2d as conv_module
from jitops.ops import conv2d_plan as conv_plan
from jitops.ops import conv2d_run as conv_run
DTYPES = [torch.float16, torch.bfloat16]
# Relative Frobenius error against the fp32 reference: half-precision outputs and operands.
TOLERANCE = {torch.float16: 2e-3, torch.bfloat16: 1.5e-2}


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    assert not torch.isnan(got).any(), "NaN in the output"
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


def fp32_reference(x, w, b, stride, padding, dilation, grad=None):
    """Output and gradients of torch's conv2d in fp32 on the same (half-precision-rounded) inputs."""
    leaves = [t.detach().float().requires_grad_(True) if t is not None else None for t in (x, w, b)]
    y = F.conv2d(leaves[0], leaves[1], leaves[2], stride=stride, padding=padding, dilation=dilation)
    if grad is None:
        return y.detach(), None
    grads = torch.autograd.grad(y, [t for t in leaves if t is not None], grad.float())
    return y.detach(), grads


@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_and_gradients_match_fp32_reference(case, dtype, layout):
    x, w, b, *geometry = make_args(case, dtype, "cuda", channels_last=layout == "channels_last")
    for t in (x, w, b):
        t.requires_grad_(True)
    y = jitops.conv2d(x, w, b, *geometry)
    assert y.dtype == dtype and y.stride() == channels_last_strides(y.shape)
    assert y.is_contiguous(memory_format=torch.channels_last)
    grad = torch.randn_like(y)
    want_y, (want_dx, want_dw, want_db) = fp32_reference(x, w, b, *geometry, grad=grad)
    assert relative_error(y, want_y) < TOLERANCE[dtype]
    dx, dw, db = torch.autograd.grad(y, (x, w, b), grad)
    for name, got, want in (("dx", dx, want_dx), ("dw", dw, want_dw), ("db", db, want_db)):
        error = relative_error(got, want)
        assert error < TOLERANCE[dtype], f"{name}: relative error {error:.2e}"
    # The gradient ops themselves return channels_last tensors.
    assert jitops.conv2d_input_grad(grad, w, x.shape, *geometry).stride() == channels_last_strides(x.shape)
    assert jitops.conv2d_weight_grad(grad, x, w.shape, *geometry).stride() == channels_last_strides(w.shape)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_resnet_sized_layers_and_split_k_wgrad(dtype):
    # 3x3 at 28x28 (many tiles), 1x1 256->64 at 56x56 (wgrad over N*P*Q = 25088 rows: split-K), strided 3x3.
    for case in [((8, 128, 28, 28), (128, 3, 3), 1, 1, 1), ((8, 256, 56, 56), (64, 1, 1), 1, 0, 1),
                 ((8, 256, 28, 28), (256, 3, 3), 2, 1, 1), ((8, 512, 14, 14), (2048, 1, 1), 1, 0, 1)]:
        x, w, _, *geometry = make_args(case, dtype, "cuda", bias=False, channels_last=True)
        x.requires_grad_(True)
        w.requires_grad_(True)
        y = jitops.conv2d(x, w, None, *geometry)
        grad = torch.randn_like(y)
        want_y, (want_dx, want_dw) = fp32_reference(x, w, None, *geometry, grad=grad)
        dx, dw = torch.autograd.grad(y, (x, w), grad)
        for name, got, want in (("y", y, want_y), ("dx", dx, want_dx), ("dw", dw, want_dw)):
            assert relative_error(got, want) < TOLERANCE[dtype], f"{case} {name}"


@pytest.mark.parametrize("case", [((4, 64, 20, 20), (192, 3, 3), 1, 1, 1), ((4, 64, 20, 20), (192, 1, 1), 1, 0, 1)],
                         ids=["3x3", "1x1"])
def test_every_tile_and_split_configuration_is_correct(case):
    # 64 channels: a 3x3 wgrad with tiles wider than 64 stores dw from registers along its (C,S,R) mode (not
    # flat); the 1x1 one stores every tile flat through TMA, tiles wider than the 64 columns included.
    x, w, b, *geometry = make_args(case, torch.float16, "cuda", channels_last=True)
    y_ref, _ = fp32_reference(x, w, b, *geometry)
    grad = torch.randn_like(y_ref).half()
    _, (dx_ref, dw_ref, _) = fp32_reference(x, w, b, *geometry, grad=grad)
    calls = {"fprop": (lambda: jitops.conv2d(x, w, b, *geometry), y_ref),
             "dgrad": (lambda: jitops.conv2d_input_grad(grad, w, x.shape, *geometry), dx_ref),
             "wgrad": (lambda: jitops.conv2d_weight_grad(grad, x, w.shape, *geometry), dw_ref)}
    for name, (call, want) in calls.items():
        configs = [(t, None) for t in conv_plan.OPERATOR_TILES[name]
                   if name != "wgrad" or conv_plan.wgrad_tile_serves(t, 64, w.shape[2:])]
        # wgrad: the plan runs one slice here (written directly into dw); force slices too
        configs += [(conv_plan.SPLIT_TILE, 3)] if name != "wgrad" else [("128x128", 5), ("128x64", 2)]
        for tile, splits in configs:
            with jitops.config.scope(conv2d_tile={name: tile}, conv2d_splits={name: splits}):
                if name == "wgrad":
                    cls = jitops.find("conv2d_weight_grad").shape_class(grad, x, w.shape, *geometry)
                    assert cls.flat == conv_plan.wgrad_flat(tile, 64, w.shape[2:]), cls
                    assert cls.flat == (w.shape[2] == 1 or conv_plan.TILES[tile].channels == 64), cls
                error = relative_error(call(), want)
            assert error < 2e-3, f"{name} {tile}/{splits}: relative error {error:.2e}"


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_tap_tile_wgrad_on_strided_dilated_and_ragged_layers(dtype):
    # The tile over a whole filter row (64 channels x 3 taps, its loads one TMA box per tap) where the taps'
    # offsets carry stride, dilation and asymmetric geometry, a 5-row filter, output channels that leave the
    # last 64-row tile ragged, odd sizes; one slice (stored directly) and split.
    cases = [((3, 64, 17, 15), (96, 3, 3), 2, 1, 1), ((2, 64, 19, 21), (40, 3, 3), 1, 2, 2),
             ((2, 64, 13, 16), (64, 5, 3), (2, 1), (1, 0), (1, 2))]
    for case in cases:
        x, w, _, *geometry = make_args(case, dtype, "cuda", bias=False, channels_last=True)
        grad = torch.randn_like(F.conv2d(x.float(), w.float(), None, *geometry)).to(dtype)
        _, (_, dw_ref) = fp32_reference(x, w, None, *geometry, grad=grad)
        for splits in (1, 2):
            with jitops.config.scope(conv2d_tile={"wgrad": "64x192t3"}, conv2d_splits={"wgrad": splits}):
                cls = jitops.find("conv2d_weight_grad").shape_class(grad, x, w.shape, *geometry)
                assert (cls.tile, cls.splits, cls.flat) == ("64x192t3", splits, True), cls
                dw = jitops.conv2d_weight_grad(grad, x, w.shape, *geometry)
            assert relative_error(dw, dw_ref) < TOLERANCE[dtype], (case, splits)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_one_slice_wgrad_writes_dw_directly_and_bit_for_bit_like_the_slice_and_copy(dtype):
    # 7x7 1x1 2048->512 at batch 4 (GEMM-K 196: one slice): the kernel's own KRSC store against its fp32 slice
    # copied into dw by torch, the same accumulators rounded once either way.
    x, w, _, *geometry = make_args(((4, 256, 7, 7), (128, 1, 1), 1, 0, 1), dtype, "cuda", bias=False,
                                   channels_last=True)
    grad = torch.randn(4, 128, 7, 7, device="cuda", dtype=dtype).contiguous(memory_format=torch.channels_last)
    op = jitops.find("conv2d_weight_grad")
    cls = op.shape_class(grad, x, w.shape, *geometry)
    assert cls.splits == 1 and conv_plan.wgrad_direct(cls)
    direct = jitops.conv2d_weight_grad(grad, x, w.shape, *geometry)
    with jitops.config.scope(conv2d_wgrad_direct=False):  # the shape class carries it: no kernel memo to clear
        assert not conv_plan.wgrad_direct(op.shape_class(grad, x, w.shape, *geometry))
        copied = jitops.conv2d_weight_grad(grad, x, w.shape, *geometry)
    assert direct.stride() == channels_last_strides(w.shape)
    assert torch.equal(direct, copied)
    _, (_, want_dw) = fp32_reference(x, w, None, *geometry, grad=grad)
    assert relative_error(direct, want_dw) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_im2col_kernel_matches_unfold_for_any_layout(dtype):
    """kernels/conv/im2col.cu against torch's unfold: NCHW, channels_last and a strided view of x, odd sizes,
    stride, padding, dilation and C = 3 / 5 / 16, padded columns included."""
    from types import SimpleNamespace

    from jitops.specs import Target
    from test_conv2d import im2col_reference

    target = Target("cuda", torch.cuda.get_device_capability(0))
    kern = SimpleNamespace(im2col=jitops.runtime.get_kernel(conv_module.IM2COL.bind(
        jitops.shapes.dtype_name(dtype), T=jitops.shapes.CUDA_TYPES[dtype]), target, 0))
    for (n, c, h, w), (r, s), stride, padding, dilation in (((2, 3, 23, 19), (7, 7), (2, 2), (3, 3), (1, 1)),
                                                             ((1, 5, 9, 11), (3, 3), (1, 2), (1, 0), (2, 1)),
                                                             ((3, 16, 8, 8), (3, 3), (1, 1), (1, 1), (1, 1))):
        base = torch.randn(n, c, h, 2 * w, device="cuda").to(dtype)
        for layout, x in (("nchw", base[..., :w].contiguous()),
                          ("channels_last", base[..., :w].contiguous(memory_format=torch.channels_last)),
                          ("strided", base[..., ::2])):
            p = conv_plan.output_size(h, r, stride[0], padding[0], dilation[0])
            q = conv_plan.output_size(w, s, stride[1], padding[1], dilation[1])
            got = conv_run._im2col(kern, x, r, s, stride, padding, dilation, p, q)
            want = im2col_reference(x.cpu(), r, s, stride, padding, dilation, p, q, got.shape[-1])
            assert torch.equal(got.cpu(), want), f"{layout} c={c} {r}x{s}"


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_stem_fprop_and_wgrad_over_folded_rows_match_fp32_reference(dtype):
    """The stem's fprop and wgrad as planned (2 filter rows folded into the matrix, a 4-tap conv over it:
    conv2d.py _plan_fold) against torch in fp32, channels_last and NCHW input, with a bias; and a fold forced on
    a 5x3 filter at stride (3, 2) with dilation 2 along W."""
    x = torch.randn(2, 3, 224, 224, device="cuda").to(dtype)
    weight = (torch.randn(64, 3, 7, 7, device="cuda") / 147 ** 0.5).to(dtype)
    bias = torch.randn(64, device="cuda").to(dtype)
    cls = jitops.find("conv2d").shape_class(x, weight, bias, 2, 3, 1)
    assert cls.im2col and cls.fold == 2, cls
    want = F.conv2d(x.float(), weight.float(), bias.float(), 2, 3)
    grad = torch.randn_like(want).to(dtype)
    assert jitops.find("conv2d_weight_grad").shape_class(grad, x, weight.shape, 2, 3, 1).fold == 2
    dw_want = torch.nn.grad.conv2d_weight(x.float(), weight.shape, grad.float(), 2, 3)
    for layout in (x, x.contiguous(memory_format=torch.channels_last)):
        y = jitops.conv2d(layout, weight, bias, 2, 3, 1)
        assert y.stride() == channels_last_strides(want.shape)
        assert relative_error(y, want) < TOLERANCE[dtype]
        dw = jitops.conv2d_weight_grad(grad, layout, weight.shape, 2, 3, 1)
        assert dw.stride() == channels_last_strides(weight.shape)
        assert relative_error(dw, dw_want) < TOLERANCE[dtype]
    x = torch.randn(2, 5, 33, 29, device="cuda").to(dtype)
    weight = torch.randn(16, 5, 5, 3, device="cuda").to(dtype)
    geometry = ((3, 2), (2, 1), (1, 2))
    with jitops.config.scope(conv2d_fold=3):
        assert jitops.find("conv2d").shape_class(x, weight, None, *geometry).fold == 3
        y = jitops.conv2d(x, weight, None, *geometry)
        grad = torch.randn_like(y)
        dw = jitops.conv2d_weight_grad(grad, x, weight.shape, *geometry)
    assert relative_error(y, F.conv2d(x.float(), weight.float(), None, *geometry)) < TOLERANCE[dtype]
    want = torch.nn.grad.conv2d_weight(x.float(), weight.shape, grad.float(), *geometry)
    assert relative_error(dw, want) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_stem_dgrad_through_columns_matches_fp32_reference(dtype):
    """The few-channel dgrad (the columns' gradient as a 1x1 fprop, then kernels/conv/im2col.cu's col2im)
    against torch in fp32: the ResNet stem's geometry at batch 2, and a dilated, asymmetric 3x3 with C=5."""
    for (n, c, h, w), (k, r, s), stride, padding, dilation in (((2, 3, 64, 48), (64, 7, 7), 2, 3, 1),
                                                                ((2, 5, 13, 11), (16, 3, 3), (2, 1), (1, 0), (1, 2))):
        x = torch.randn(n, c, h, w, device="cuda").to(dtype)
        weight = (torch.randn(k, c, r, s, device="cuda") / (c * r * s) ** 0.5).to(dtype)
        grad = torch.randn_like(F.conv2d(x, weight, None, stride, padding, dilation))
        cls = jitops.find("conv2d_input_grad").shape_class(grad, weight, x.shape, stride, padding, dilation)
        assert cls.im2col
        dx = jitops.conv2d_input_grad(grad, weight, x.shape, stride, padding, dilation)
        want = torch.nn.grad.conv2d_input(x.shape, weight.float(), grad.float(), stride, padding, dilation)
        assert dx.stride() == channels_last_strides(x.shape)
        assert relative_error(dx, want) < TOLERANCE[dtype], f"c={c} {r}x{s}"


@pytest.mark.parametrize("case", [CASES[1], CASES[6]], ids=[IDS[1], IDS[6]])
def test_opcheck_on_cuda(case):
    x, w, b, *geometry = make_args(case, torch.float16, "cuda")
    torch.library.opcheck(torch.ops.jitops.conv2d.default, (x, w, b, *geometry))
    grad = torch.randn_like(F.conv2d(x, w, b, *geometry))
    torch.library.opcheck(torch.ops.jitops.conv2d_input_grad.default, (grad, w, list(x.shape), *geometry))
    torch.library.opcheck(torch.ops.jitops.conv2d_weight_grad.default, (grad, x, list(w.shape), *geometry))


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph(backend, dtype):
    x, w, b, *geometry = make_args(CASES[1], dtype, "cuda", channels_last=True)
    for t in (x, w, b):
        t.requires_grad_(True)
    check_compile(lambda x, w, b: F.relu(jitops.conv2d(x, w, b, *geometry)), (x, w, b), "conv2d", backend=backend)


def test_runs_on_torchs_current_stream_and_from_empty_batches():
    x, w, b, *geometry = make_args(CASES[0], torch.float16, "cuda", channels_last=True)
    expected = jitops.conv2d(x, w, b, *geometry)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        y = jitops.conv2d(x, w, b, *geometry)
    stream.synchronize()
    torch.testing.assert_close(y, expected)
    empty = jitops.conv2d(x[:0], w, b, *geometry)
    assert empty.shape == (0, *expected.shape[1:])


@pytest.mark.parametrize("case", [((4, 64, 28, 28), (64, 3, 3), 2, 1, 1), ((2, 64, 15, 17), (64, 3, 3), 3, 1, 1)],
                         ids=["stride2", "stride3"])
def test_strided_dgrad_phases_on_a_side_stream_and_under_cuda_graph_capture(case):
    """A strided dgrad runs its phases in one launch (stride 2: four; stride 3: nine, in three launches):
    called from a non-default stream and captured in a CUDA graph, it gives the eager result on new data."""
    x, w, _, *geometry = make_args(case, torch.bfloat16, "cuda", channels_last=True)
    grad = torch.randn_like(jitops.conv2d(x, w, None, *geometry))
    eager = jitops.ops.conv2d.conv2d_input_grad(grad, w, list(x.shape), *geometry)
    _, (want, _) = fp32_reference(x, w, None, *geometry, grad=grad)
    assert relative_error(eager, want) < TOLERANCE[torch.bfloat16]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        side = jitops.ops.conv2d.conv2d_input_grad(grad, w, list(x.shape), *geometry)
    torch.cuda.current_stream().wait_stream(stream)
    torch.testing.assert_close(side, eager, rtol=0, atol=0)
    static_grad = grad.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = jitops.ops.conv2d.conv2d_input_grad(static_grad, w, list(x.shape), *geometry)
    new_grad = torch.randn_like(grad)
    static_grad.copy_(new_grad)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(captured, jitops.ops.conv2d.conv2d_input_grad(new_grad, w, list(x.shape),
                                                                               *geometry), rtol=0, atol=0)


def test_misaligned_and_strided_views_are_copied_not_misread():
    base = torch.randn(2 * 8 * 9 * 11 + 1, device="cuda", dtype=torch.float16)
    x = base[1:].view(2, 9, 11, 8).permute(0, 3, 1, 2)  # channels_last strides, 2-byte aligned start
    w = torch.randn(16, 8, 3, 3, device="cuda", dtype=torch.float16) / 8
    y = jitops.conv2d(x, w, None, 1, 1, 1)
    assert relative_error(y, F.conv2d(x.float(), w.float(), None, 1, 1)) < 4e-3


def test_wrong_device_and_dtype_errors_name_the_argument():
    x = torch.randn(2, 8, 9, 9, device="cuda", dtype=torch.float16)
    w = torch.randn(8, 8, 3, 3, dtype=torch.float16)
    with pytest.raises(ValueError, match="argument 'weight' is on cpu but 'x' is on cuda"):
        jitops.conv2d(x, w)
    with pytest.raises(TypeError, match="argument 'x' has dtype float64 on cuda; supported there: float16, bfloat16"):
        jitops.conv2d(x.double(), w.double().cuda())
    with pytest.raises(TypeError, match="argument 'weight' has dtype bfloat16 but 'x' has float16"):
        jitops.conv2d(x, w.cuda().bfloat16())


@pytest.mark.parametrize("dtype", [torch.float32, *DTYPES], ids=["fp32", "fp16", "bf16"])
def test_grouped_depthwise_and_float32_run_cudnn(dtype):
    """groups != 1 in every dtype, and float32 with groups 1: F.conv2d (cuDNN) under torch's TF32 flag, values
    and gradients as torch's, output channels_last."""
    x = torch.randn(2, 32, 14, 14, device="cuda", dtype=dtype).to(memory_format=torch.channels_last)
    for w, groups in ((torch.randn(32, 1, 3, 3, device="cuda", dtype=dtype), 32),
                      (torch.randn(16, 8, 3, 3, device="cuda", dtype=dtype), 4),
                      *(((torch.randn(16, 32, 3, 3, device="cuda", dtype=dtype), 1),) if dtype == torch.float32
                        else ())):
        xs, ws = x.detach().requires_grad_(), w.detach().requires_grad_()
        y = jitops.conv2d(xs, ws, None, 1, 1, 1, groups)
        want = F.conv2d(x, w, None, 1, 1, 1, groups)
        assert y.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(y, want)
        y.sum().backward()
        xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
        F.conv2d(xr, wr, None, 1, 1, 1, groups).sum().backward()
        torch.testing.assert_close(xs.grad, xr.grad)
        torch.testing.assert_close(ws.grad, wr.grad)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_wgrad_reduce_kernel_sums_slices_exactly_in_every_warp_split(dtype):
    """kernels/conv/wgrad_reduce.cu against torch's sum over the slices, for 1 to 13 slices, odd and padded
    channel counts, one and nine taps; every element of dw written (dw starts as NaN)."""
    from types import SimpleNamespace

    from jitops.specs import Target

    target = Target("cuda", torch.cuda.get_device_capability(0))
    reduce = jitops.runtime.get_kernel(conv_module.WGRAD_REDUCE.bind(
        jitops.shapes.dtype_name(dtype), T=jitops.shapes.CUDA_TYPES[dtype]), target, 0)
    kern = SimpleNamespace(reduce=reduce)
    for splits in (1, 2, 3, 5, 8, 13):
        for k, taps, c, c8 in ((24, 9, 40, 40), (64, 1, 147, 152), (5, 9, 3, 8), (300, 1, 64, 64)):
            k8 = -(-k // 8) * 8
            partial = torch.randn(splits, k8, taps, c8, device="cuda")
            dw = torch.full((k, c, 1, taps), float("nan"), dtype=dtype, device="cuda").contiguous(
                memory_format=torch.channels_last)
            if splits == 1:  # the run function copies a single slice with torch; the kernel handles it too
                reduce.launch(-(-k * taps * c // conv_run.REDUCE_BLOCK), conv_run.REDUCE_BLOCK, partial, dw,
                              1, partial[0].numel(), k * taps, c, c8)
            else:
                conv_run._reduce_into(kern, partial, dw, taps, c8)
            want = partial.double().sum(0)[:k, :, :c]                      # [k, taps, c]
            got = dw.permute(0, 2, 3, 1).reshape(k, taps, c).double()
            assert not torch.isnan(got).any(), (splits, k, taps, c)
            assert relative_error(got, want) < TOLERANCE[dtype], (splits, k, taps, c)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_vit_patch_embedding_runs_on_linear_and_matches_fp32_reference(layout):
    """ViT-B/16's patch embedding (16x16 stride 16, 3 -> 768 channels) at batch 2 in bf16: jitops.linear over the
    patch matrix (NVRTC kernels, no conv kernel), forward and all three gradients against torch's fp32 conv."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 224, 224, generator=g).to("cuda", torch.bfloat16)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    w = (torch.randn(768, 3, 16, 16, generator=g) / (3 * 16 * 16) ** 0.5).to("cuda", torch.bfloat16)
    b = torch.randn(768, generator=g).to("cuda", torch.bfloat16)
    for t in (x, w, b):
        t.requires_grad_(True)
    y = jitops.conv2d(x, w, b, stride=16)
    assert y.shape == (2, 768, 14, 14) and y.stride() == channels_last_strides(y.shape)
    # jitops.linear's node: its Python autograd node, or the C++ host path's once an earlier call offered the problem
    linear_node = type(y.grad_fn.next_functions[0][0].next_functions[0][0]).__name__
    assert linear_node in ("jitops_linearBackward", "CppFunction"), linear_node
    grad = torch.randn_like(y)
    want_y, (want_dx, want_dw, want_db) = fp32_reference(x, w, b, 16, 0, 1, grad=grad)
    dx, dw, db = torch.autograd.grad(y, (x, w, b), grad)
    for name, got, want in (("y", y, want_y), ("dx", dx, want_dx), ("dw", dw, want_dw), ("db", db, want_db)):
        assert got.shape == want.shape, name
        error = relative_error(got, want)
        assert error < TOLERANCE[torch.bfloat16], f"{name}: relative error {error:.2e}"
