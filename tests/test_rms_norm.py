"""jitops.rms_norm without a GPU: the CPU path (layer_norm's C++ kernel with rms set) against torch's F.rms_norm in
float64, gradients, gradcheck, opcheck, torch.compile; torch's default eps; errors that name rms_norm; rms and
layer_norm never sharing a compiled CUDA kernel; NVRTC compiling the RMS kernels for sm_90a; and jitops.patch on
nn.RMSNorm and transformers' LlamaRMSNorm."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import jitops
from jitops.runtime import runtime
from jitops.specs import Target
from jitops.testing import check_op

from test_layer_norm import CASES  # hidden sizes 1, 7, 1000, 4097, two trailing dims, no rows at all

DTYPES = [torch.float32, torch.float64]


def reference(x, normalized_shape, weight, eps):
    return F.rms_norm(x, normalized_shape, weight, eps)


def samples_over(cases, dtype, device, odd_eps_at=None):
    """(x, normalized_shape, weight, eps) per case: every third without a weight, eps 1e-6 (1e-3 at odd_eps_at).
    tests/test_rms_norm_gpu.py builds its cases with it too."""
    g = torch.Generator().manual_seed(0)
    out = []
    for i, (shape, ns) in enumerate(cases):
        x = (torch.randn(shape, generator=g, dtype=torch.float64) * 2 + 0.5).to(device, dtype)
        w = (1 + 0.1 * torch.randn(ns, generator=g, dtype=torch.float64)).to(device, dtype)
        out.append((x, ns, w if i % 3 != 1 else None, 1e-3 if i == odd_eps_at else 1e-6))
    return out


def samples(dtype, device):
    return samples_over(CASES, dtype, device, odd_eps_at=3)


def test_rms_norm_cpu():
    # (opcheck: the ops' own test below, jitops.rms_norm being a function over layer_norm's ops)
    report = check_op(jitops.rms_norm, reference, samples=samples, dtypes=DTYPES, device="cpu", compile=True,
                      opcheck=False)
    assert len(report.checked) > 40


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_default_eps_is_torchs(dtype):
    x = torch.randn(4, 10, dtype=dtype) * 1e-4  # small rows, where eps shows
    torch.testing.assert_close(jitops.rms_norm(x, 10), F.rms_norm(x, (10,)))
    torch.testing.assert_close(jitops.rms_norm(x, [10], eps=0.5), F.rms_norm(x, (10,), eps=0.5))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_through_the_fp32_kernel(dtype):
    x = torch.randn(8, 96, dtype=torch.float64).to(dtype).requires_grad_()
    w = (1 + 0.1 * torch.randn(96, dtype=torch.float64)).to(dtype).requires_grad_()
    y = jitops.rms_norm(x, [96], w, 1e-6)
    assert y.dtype == dtype
    want = F.rms_norm(x.detach().double(), [96], w.detach().double(), 1e-6)
    torch.testing.assert_close(y.double(), want, atol=2e-2, rtol=2e-2)
    g = torch.randn(8, 96, dtype=torch.float64)
    y.backward(g.to(dtype))
    xr, wr = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    F.rms_norm(xr, [96], wr, 1e-6).backward(g)
    torch.testing.assert_close(x.grad.double(), xr.grad, atol=5e-2, rtol=5e-2)
    torch.testing.assert_close(w.grad.double(), wr.grad, atol=1e-1, rtol=5e-2)


def test_statistics_hold_a_zero_mean_and_the_inverse_root_mean_square():
    x = torch.randn(6, 30, dtype=torch.float64)
    _, stats = jitops.layer_norm_forward(x, [30], None, None, 1e-6, True)
    assert torch.equal(stats[0], torch.zeros(6, dtype=torch.float64))
    torch.testing.assert_close(stats[1], torch.rsqrt(x.square().mean(-1) + 1e-6))


def test_the_rms_ops_pass_opcheck():
    x = torch.randn(6, 30, dtype=torch.float64)
    w = torch.randn(30, dtype=torch.float64)
    _, stats = jitops.layer_norm_forward(x, [30], w, None, 1e-6, True)
    torch.library.opcheck(jitops.layer_norm_forward.op.overload, (x, [30], w.requires_grad_(), None, 1e-6, True))
    torch.library.opcheck(jitops.layer_norm_forward.op.overload, (x.view(6, 5, 6), [5, 6], None, None, 1e-3, True))
    w = w.detach()
    for mask in ((True, True, False), (True, False, False), (False, True, False)):
        torch.library.opcheck(jitops.layer_norm_backward.op.overload,
                              (torch.randn_like(x), x, stats, w, [30], *mask, True))
    torch.library.opcheck(jitops.layer_norm_inference.op.overload, (x, [30], w, None, 1e-6, True))
    torch.testing.assert_close(jitops.layer_norm_inference(x, [30], w, None, 1e-6, True), F.rms_norm(x, [30], w, 1e-6))


def test_errors_name_rms_norm_and_the_argument():
    x = torch.randn(4, 10)
    with pytest.raises(ValueError, match="rms_norm: argument 'weight'"):
        jitops.rms_norm(x, [10], torch.randn(9))
    with pytest.raises(ValueError, match="rms_norm: argument 'normalized_shape'"):
        jitops.rms_norm(x, [11])
    with pytest.raises(TypeError, match="rms_norm"):
        jitops.rms_norm(torch.ones(4, 10, dtype=torch.int32), [10])


def test_rms_and_layer_norm_compile_different_kernels():
    forward = jitops.find("layer_norm_forward")
    target = Target.parse("sm_90a")
    args = forward.example_args("bf16", [[4096, 1024], [1024], None], {"normalized_shape": [1024], "eps": 1e-6})
    plain = forward.requests_for(args, target)["forward"]
    rms = forward.requests_for((*args[:5], True), target)["forward"]
    assert plain != rms
    assert runtime.key_for(plain, target)[0] != runtime.key_for(rms, target)[0]


def test_nvrtc_compiles_the_rms_kernels_for_sm_90a(fresh_cache):
    target = Target.parse("sm_90a")
    forward, backward = jitops.find("layer_norm_forward"), jitops.find("layer_norm_backward")
    requests = list(forward.requests_for(forward.example_args("bf16", [[4096, 1024], [1024], None],
                                                              {"normalized_shape": [1024], "eps": 1e-6, "rms": True}),
                                         target).values())
    bargs = backward.example_args("bf16", [[4096, 1024], [4096, 1024], [2, 4096], [1024]],
                                  {"normalized_shape": [1024], "need_dx": True, "need_dweight": True,
                                   "need_dbias": False, "rms": True})
    requests += list(backward.requests_for(bargs, target).values())
    assert any("true" in str(r) for r in requests), requests
    for request in requests:
        assert runtime.prewarm(request, target) in ("compiled", "cached")


# ---- jitops.patch ---------------------------------------------------------------------------------------------
def _llama_norm(dtype):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(48, eps=1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(48, dtype=torch.float64))
    return norm


@pytest.mark.parametrize("make", ["torch", "transformers"])
def test_patch_swaps_rms_norms_with_the_same_values_and_gradients(make):
    import copy

    norm = nn.RMSNorm([48], eps=1e-5, dtype=torch.float32) if make == "torch" else _llama_norm(torch.float32)
    if make == "torch":
        with torch.no_grad():
            norm.weight.copy_(1 + 0.1 * torch.randn(48))
    model = nn.Sequential(nn.Identity(), norm)
    reference = copy.deepcopy(model)
    report = jitops.patch(model)
    assert [s.op for s in report.swapped] == ["jitops.rms_norm"], str(report)
    x = torch.randn(3, 5, 48, requires_grad=True)
    xr = x.detach().clone().requires_grad_()
    y, yr = model(x), reference(xr)
    torch.testing.assert_close(y, yr, atol=2e-6, rtol=2e-6)
    g = torch.randn_like(y)
    y.backward(g)
    yr.backward(g)
    torch.testing.assert_close(x.grad, xr.grad, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(model[1].weight.grad, reference[1].weight.grad, atol=2e-5, rtol=2e-5)
    assert jitops.unpatch(model) == 1 and type(model[1]) is type(reference[1])


def test_patched_llama_rms_norm_runs_its_own_float32_math_on_float64():
    """transformers' LlamaRMSNorm takes its statistics in float32 even for a float64 x; the swapped module keeps
    that exactly by running its own forward there."""
    import copy

    norm = _llama_norm(torch.float64)
    reference = copy.deepcopy(norm)
    jitops.patch(norm)
    x = torch.randn(4, 48, dtype=torch.float64)
    assert torch.equal(norm(x), reference(x))


def test_patch_leaves_rms_norm_alone_when_not_asked_and_names_subclasses():
    class MyNorm(nn.RMSNorm):
        def forward(self, x):
            return super().forward(x) * 2

    model = nn.Sequential(nn.RMSNorm(8), MyNorm(8))
    report = jitops.patch(model, ops=("linear",))
    assert not report.swapped
    report = jitops.patch(model, ops=("rms_norm",))
    assert [s.name for s in report.swapped] == ["0"]
    assert [(a.name, a.reason) for a in report.left_alone] == [("1", "a subclass of nn.RMSNorm with its own forward")]


def test_rms_norm_is_a_public_name_over_layer_norms_ops():
    public = jitops.find_public("rms_norm")
    x, w = torch.empty(64, 32, device="meta"), torch.empty(32, device="meta")
    item = public.manifest_item(x, [32], w)
    assert item["op"] == "rms_norm" and item["kwargs"]["rms"] is True
    assert item["kwargs"]["eps"] == torch.finfo(torch.float32).eps
    # A hand-written item without rms still builds the RMS kernels.
    entry, _, kwargs = public.form([[[64, 32], [32], None]], {"normalized_shape": [32]})
    assert entry is jitops.find("layer_norm_forward") and kwargs["rms"] is True
    # The ops keep layer_norm's name: misses, records and errors of a layer_norm call say layer_norm.
    assert jitops.find("layer_norm_backward").public == "layer_norm"
    assert jitops.find_public("layer_norm_backward").name == "layer_norm"
    assert "rms_norm" in jitops.public_names()
