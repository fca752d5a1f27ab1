"""jitops.conv2d's patchify route without a GPU: a conv whose stride is its filter size (padding 0, dilation 1,
groups 1; ViT's patch embedding) runs as one jitops.linear call on a patch matrix.  Forward and gradients against
F.conv2d, every layout of x, the channels_last output, which calls a conv makes (and which kernels manifests list
for it), torch.compile and jitops.patch."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import jitops
from cache_tools import manifest as manifest_module
from jitops.ops import conv2d_plan
from jitops.testing import check_compile, check_op
from test_conv2d import channels_last_strides, grads

# (x shape, (K, R, S)); the stride is (R, S).
PATCH_CASES = [
    ((2, 3, 32, 32), (8, 16, 16)),   # ViT-like: 16x16 stride 16, 3 channels
    ((2, 5, 8, 10), (6, 2, 2)),      # 2x2 stride 2
    ((1, 4, 6, 12), (7, 2, 4)),      # filter (2, 4), stride (2, 4)
    ((2, 3, 11, 9), (5, 4, 4)),      # 11x9 not divisible by 4: the last 3 rows and 1 column are dropped
    ((3, 2, 9, 9), (4, 3, 3)),       # odd filter and sizes
    ((2, 8, 4, 4), (4, 4, 4)),       # one patch per image (P = Q = 1)
]
IDS = [f"x{'x'.join(map(str, x))}-k{'x'.join(map(str, k))}" for x, k in PATCH_CASES]


def patch_args(case, dtype=torch.float64, bias=True, channels_last=False, seed=0):
    x_shape, (k, r, s) = case
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(x_shape, generator=g).to(dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    weight = (torch.randn(k, x_shape[1], r, s, generator=g) / (x_shape[1] * r * s) ** 0.5).to(dtype)
    b = torch.randn(k, generator=g).to(dtype) if bias else None
    return x, weight, b, (r, s)


def reference(x, weight, bias, stride):
    return F.conv2d(x, weight, bias, stride=stride)


def op_names(y: torch.Tensor) -> set[str]:
    """The names of the autograd nodes behind y: jitops_linearBackward, jitops_conv2dBackward, PermuteBackward0, ..."""
    names, stack, seen = set(), [y.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(type(node).__name__)
        stack += [next_node for next_node, _ in node.next_functions]
    return names


# ---- forward and gradients against F.conv2d -------------------------------------------------------------------------
@pytest.mark.parametrize("case", PATCH_CASES, ids=IDS)
def test_patchify_matches_torch_in_fp64_and_fp32(case):
    """check_op: forward and backward against fp64, a non-contiguous variant of every tensor, gradcheck (cases of at
    most 4096 elements), opcheck of the conv op on the same arguments, torch.compile for the first case."""
    def samples(dtype, device):
        return [patch_args(case, dtype), patch_args(case, dtype, bias=False, channels_last=True, seed=1)]

    check_op(jitops.conv2d, reference, samples=samples, dtypes=[torch.float32, torch.float64], device="cpu",
             compile=case is PATCH_CASES[1])


@pytest.mark.parametrize("layout", ["nchw", "channels_last", "sliced", "transposed", "unbatched"])
@pytest.mark.parametrize("case", PATCH_CASES[1:4], ids=IDS[1:4])
def test_every_layout_of_x_gives_torch_result_and_gradients(case, layout):
    x, w, b, stride = patch_args(case, channels_last=layout == "channels_last")
    if layout == "sliced":  # every other column of a wider image, from the second row: no unit stride anywhere
        wide = torch.randn(x.shape[0], x.shape[1], x.shape[2] + 1, 2 * x.shape[3], dtype=x.dtype)
        x = wide[:, :, 1:, ::2]
    elif layout == "transposed":  # H and W swapped in memory
        x = x.transpose(2, 3).contiguous().transpose(2, 3)
    elif layout == "unbatched":
        x = x[0]
    assert layout in ("nchw", "unbatched") or not x.is_contiguous()
    ours = grads(lambda x, w, b: jitops.conv2d(x, w, b, stride=stride), x, w, b)
    theirs = grads(lambda x, w, b: F.conv2d(x, w, b, stride=stride), x, w, b)
    assert "jitops_linearBackward" in op_names(ours[0])
    for name, got, want in zip(("y", "grad_x", "grad_weight", "grad_bias"), ours, theirs):
        assert got.shape == want.shape, name
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, msg=lambda m: f"{name} ({layout}): {m}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels-last"])
def test_half_precision_against_an_fp32_reference(dtype, channels_last):
    x, w, b, stride = patch_args(PATCH_CASES[0], dtype, channels_last=channels_last)
    ours = grads(lambda x, w, b: jitops.conv2d(x, w, b, stride=stride), x, w, b)
    theirs = grads(lambda x, w, b: F.conv2d(x, w, b, stride=stride), x.float(), w.float(), b.float())
    tolerance = 1.6e-2 if dtype is torch.bfloat16 else 2e-3
    for name, got, want in zip(("y", "grad_x", "grad_weight", "grad_bias"), ours, theirs):
        assert got.dtype == dtype, name
        error = ((got.double() - want.double()).norm() / want.double().norm()).item()
        assert error < tolerance, f"{name}: relative error {error:.2e}"


def test_gradcheck_in_fp64_for_x_weight_and_bias():
    for channels_last in (False, True):
        x, w, b, stride = patch_args(PATCH_CASES[2], channels_last=channels_last)
        args = tuple(t.requires_grad_() for t in (x, w, b))
        assert torch.autograd.gradcheck(lambda x, w, b: jitops.conv2d(x, w, b, stride=stride), args)


# ---- layouts: output as the conv op's; gradients as the views give them --------------------------------------------
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels-last"])
def test_output_is_channels_last_in_memory_and_gradients_have_torch_shapes(channels_last):
    x, w, b, stride = patch_args(PATCH_CASES[3], torch.float32, channels_last=channels_last)
    y, dx, dw, db = grads(lambda x, w, b: jitops.conv2d(x, w, b, stride=stride), x, w, b)
    assert y.stride() == channels_last_strides(y.shape)
    # grad_x follows x (the copy in the backward of the patch matrix's reshape): channels_last only for a
    # channels_last x, where the conv op's is always channels_last.  Autograd takes either.
    assert dx.shape == x.shape and dx.is_contiguous(memory_format=torch.channels_last if channels_last else
                                                    torch.contiguous_format)
    assert dw.shape == w.shape and db.shape == b.shape
    unbatched = jitops.conv2d(x[0], w, b, stride=stride)
    assert unbatched.shape == y.shape[1:] and unbatched.stride() == y.stride()[1:]


# ---- routing: which calls a conv makes ------------------------------------------------------------------------------
def recorded_ops(x_shape, w_shape, dtype=torch.bfloat16, backward=True, **kwargs) -> list[str]:
    """The jitops ops a call on meta tensors (which stand for CUDA ones) and its backward record."""
    x = torch.empty(x_shape, dtype=dtype, device="meta")
    w = torch.empty(w_shape, dtype=dtype, device="meta", requires_grad=True)
    with jitops.record_calls() as calls:
        y = jitops.conv2d(x, w, **kwargs)
        if backward:
            y.sum().backward()
    return [item["kernel_op"] for item in calls.items]


def test_patch_convs_call_linear_and_others_the_conv_op():
    # ViT-B/16's patch embedding: linear forward, gemm for grad_weight (x needs no gradient); no conv kernels
    assert recorded_ops((2, 3, 224, 224), (768, 3, 16, 16), stride=16) == ["linear", "gemm"]
    assert recorded_ops((2, 3, 224, 224), (768, 3, 16, 16), torch.float16, False, stride=16, padding="valid") == \
        ["linear"]
    assert recorded_ops((2, 8, 9, 12), (4, 8, 3, 4), stride=(3, 4), padding=(0, 0), dilation=1) == ["linear", "gemm"]
    conv = ["conv2d", "conv2d_weight_grad"]
    assert recorded_ops((2, 8, 9, 9), (4, 8, 3, 3), padding=1) == conv           # 3x3 stride 1
    assert recorded_ops((2, 8, 9, 9), (4, 8, 1, 1)) == conv                      # 1x1 stride 1: pointwise
    assert recorded_ops((2, 8, 9, 9), (4, 8, 3, 3), stride=3, padding=1) == conv  # padded
    assert recorded_ops((2, 8, 9, 9), (4, 8, 2, 2), stride=2, dilation=2) == conv  # dilated
    assert recorded_ops((2, 8, 9, 9), (4, 4, 3, 3), stride=3, groups=2) == []     # grouped: ATen
    assert recorded_ops((2, 8, 9, 9), (4, 8, 3, 3), torch.float32, stride=3) == []  # fp32 on CUDA: ATen


def test_cpu_calls_take_the_same_routes():
    x, w, b, stride = patch_args(PATCH_CASES[1], torch.float32)
    w.requires_grad_()
    assert "jitops_linearBackward" in op_names(jitops.conv2d(x, w, b, stride=stride))
    assert "jitops_linearBackward" in op_names(jitops.conv2d(x[0], w, b, stride, "valid", (1, 1)))
    assert "jitops_conv2dBackward" in op_names(jitops.conv2d(x, w, b, stride=1))
    assert "jitops_conv2dBackward" in op_names(jitops.conv2d(x, w[:, :, :1, :1], b))  # 1x1 stride 1
    assert "jitops_conv2dBackward" in op_names(jitops.conv2d(x, w, b, stride=stride, padding=1))


def test_bad_arguments_still_get_the_conv_ops_errors():
    x, w = torch.randn(2, 4, 8, 8), torch.randn(6, 4, 2, 2)
    with pytest.raises(TypeError, match="jitops.conv2d: argument 'weight' has dtype float64 but 'x' has float32"):
        jitops.conv2d(x, w.double(), stride=2)
    with pytest.raises(ValueError, match="jitops.conv2d: argument 'bias' has shape \\(5,\\)"):
        jitops.conv2d(x, w, torch.randn(5), stride=2)
    with pytest.raises(ValueError, match="jitops.conv2d: argument 'weight' has 3 input channels"):
        jitops.conv2d(x, torch.randn(6, 3, 2, 2), stride=2)
    with pytest.raises(ValueError, match="smaller than the dilated 2x2 kernel"):
        jitops.conv2d(torch.randn(1, 4, 1, 8), w, stride=2)
    with pytest.raises(TypeError, match="jitops.conv2d: argument 'stride' must be an int or a pair of ints"):
        jitops.conv2d(x, w, stride=(2, "s"))


def test_takes_patches_reads_torchs_argument_forms():
    assert conv2d_plan.takes_patches(16, 16, 16, 0, 1)
    assert conv2d_plan.takes_patches(2, 4, [2, 4], "valid", (1,))
    assert not conv2d_plan.takes_patches(1, 1, 1, 0, 1)          # pointwise: the conv kernels
    assert conv2d_plan.takes_patches(1, 2, (1, 2), (0, 0), 1)     # 1x2 stride (1, 2) is a patch conv
    assert not conv2d_plan.takes_patches(2, 2, 2, "same", 1)
    assert not conv2d_plan.takes_patches(2, 2, (2, 1), 0, 1)
    assert not conv2d_plan.takes_patches(0, 0, 0, 0, 1)            # an empty filter: the conv op's error


# ---- manifests and prewarm: the kernels a patch conv uses -----------------------------------------------------------
def planned(item, arch):
    calls = manifest_module.parse_item(item, (arch,), "ops[0]")
    return {(job.op, job.kernel_op) for job in manifest_module.plan(calls).jobs}


def test_a_manifest_item_of_a_patch_conv_lists_linears_kernels():
    vit = {"op": "conv2d", "dtypes": ["bf16"], "shapes": [[[2, 3, 224, 224], [768, 3, 16, 16], [768]]],
           "kwargs": {"stride": [16, 16]}}
    for arch in ("sm_90a", "sm_80"):
        assert planned(vit, arch) == {("conv2d", "linear"), ("conv2d", "gemm")}
        assert planned(dict(vit, grad=False), arch) == {("conv2d", "linear")}
    three_by_three = dict(vit, shapes=[[[2, 64, 14, 14], [64, 64, 3, 3], None]], kwargs={"padding": [1, 1]})
    assert planned(three_by_three, "sm_90a") == {("conv2d", "conv2d"), ("conv2d", "conv2d_input_grad"),
                                                 ("conv2d", "conv2d_weight_grad")}


# ---- torch.compile and jitops.patch ---------------------------------------------------------------------------------
def test_torch_compile_fullgraph_matches_eager():
    x, w, b, stride = patch_args(PATCH_CASES[3], torch.float32, channels_last=True)
    for t in (x, w, b):
        t.requires_grad_()
    check_compile(lambda x, w, b: jitops.conv2d(x, w, b, stride=stride), (x, w, b), "conv2d patchify")
    compiled = torch.compile(lambda x, w: jitops.conv2d(x, w, None, stride=stride), fullgraph=True,
                             backend="aot_eager")
    assert compiled(x, w).stride() == channels_last_strides(compiled(x, w).shape)


def test_patched_conv2d_modules_take_the_patch_route():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 4, stride=4), nn.Conv2d(8, 8, 3, padding=1))
    reference_model = nn.Sequential(*(nn.Conv2d(m.in_channels, m.out_channels, m.kernel_size, m.stride, m.padding)
                                      for m in model))
    reference_model.load_state_dict(model.state_dict())
    report = jitops.patch(model)
    # the report names the public op for both (the route is chosen per call: an fp32 CUDA input runs ATen's)
    assert [(s.name, s.op) for s in report.swapped] == [("0", "jitops.conv2d"), ("1", "jitops.conv2d")]
    assert not report.left_alone
    x = torch.randn(2, 3, 16, 16)
    torch.testing.assert_close(model(x), reference_model(x))
    patches = model[0](x)
    assert "jitops_linearBackward" in op_names(patches) and "jitops_conv2dBackward" in op_names(model[1](patches))
