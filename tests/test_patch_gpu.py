"""jitops.patch on the GPU: the benchmark's real configs (HF GPT-2 and Llama, timm ViT-B/16 and ResNet-50, bf16)
against the unpatched model, CUDA-graph capture and replay of a patched training step, torch.compile's
reduce-overhead mode, and the conv2d backward that raised IndexError (a deep copy of a bf16 channels_last model,
convolutions without bias, backward under torch.profiler).

The shapes are bench_models.py's, so `bench_models.py --prewarm-only` builds every kernel these tests load."""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import jitops

pytestmark = pytest.mark.gpu

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
bench_models = pytest.importorskip("bench_models")


def _model(name: str):
    model = bench_models.MODELS[name](tiny=False)
    torch.manual_seed(0)
    with torch.device("cuda"):
        net = model.build()
    net = net.to(torch.bfloat16)
    if model.channels_last:
        net = net.to(memory_format=torch.channels_last)
    return model, net.train(), bench_models.batch_for(model, "cuda", torch.bfloat16)


def _grads(model, net, batch):
    torch.manual_seed(2)
    loss = model.loss(net, batch)
    loss.backward()
    grads = {n: p.grad.float() for n, p in net.named_parameters() if p.grad is not None}
    net.zero_grad(set_to_none=True)
    return loss.float(), grads


def _assert_close_grads(grads, ref_grads, rel):
    assert grads.keys() == ref_grads.keys()
    floor = 1e-3 * max(g.norm().item() for g in ref_grads.values())
    for name, ref in ref_grads.items():
        err = (grads[name] - ref).norm().item() / max(ref.norm().item(), floor)
        assert err < rel, f"{name}: relative error {err:.3g}"


@pytest.mark.parametrize("name", ["gpt2", "llama", "vit", "resnet50"])
def test_patched_real_model_matches_unpatched(name):
    """bf16 end to end: the loss within 1e-2 relative and each gradient within 5e-2 of the unpatched model's
    (both round every op's output to bf16, in different orders)."""
    if name in ("vit", "resnet50") and not bench_models._timm_available():
        pytest.skip("timm is not installed")
    model, net, batch = _model(name)
    reference = copy.deepcopy(net)
    report = jitops.patch(net)
    assert report.swapped, str(report)
    loss, grads = _grads(model, net, batch)
    ref_loss, ref_grads = _grads(model, reference, batch)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-2, atol=1e-2)
    _assert_close_grads(grads, ref_grads, 5e-2)


def test_cuda_graph_capture_and_replay_of_a_patched_training_step():
    """A patched timm ViT-B/16 forward and backward (linear, fused linear+GELU, layer_norm, conv2d) captured with
    torch.cuda.graph and replayed on new data in the static input: the same loss and gradients as an eager
    patched step on that data."""
    if not bench_models._timm_available():
        pytest.skip("timm is not installed")
    model, net, batch = _model("vit")
    net.eval()  # no drop-out or stochastic depth: a replay and an eager step must draw nothing random
    jitops.patch(net)
    images, labels = batch
    static_images = images.clone()
    params = list(net.parameters())
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up off the default stream: every kernel is loaded before capture
        for _ in range(2):
            model.loss(net, (static_images, labels)).backward()
    torch.cuda.current_stream().wait_stream(stream)
    for p in params:
        p.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = model.loss(net, (static_images, labels))
        static_loss.backward()
    new_images = torch.randn_like(images)
    static_images.copy_(new_images)
    graph.replay()
    torch.cuda.synchronize()
    captured_grads = {n: p.grad.float().clone() for n, p in net.named_parameters()}
    captured_loss = static_loss.float().clone()
    for p in params:
        p.grad = None
    eager_loss = model.loss(net, (new_images, labels))
    eager_loss.backward()
    torch.testing.assert_close(captured_loss, eager_loss.float(), rtol=1e-3, atol=1e-3)
    _assert_close_grads(captured_grads, {n: p.grad.float() for n, p in net.named_parameters()}, 1e-2)


def test_reduce_overhead_compile_of_a_patched_model():
    """torch.compile(mode="reduce-overhead") (CUDA graphs through inductor) on a patched GPT-2: forward and
    backward match the eager patched model."""
    model, net, batch = _model("gpt2")
    net.eval()  # no dropout: the compiled and eager steps draw different masks
    jitops.patch(net)
    compiled = torch.compile(net, mode="reduce-overhead")
    for _ in range(3):  # the third call replays the recorded graph
        loss = model.loss(compiled, batch)
        loss.backward()
        grads = {n: p.grad.float().clone() for n, p in net.named_parameters()}
        net.zero_grad(set_to_none=True)
    ref_loss, ref_grads = _grads(model, net, batch)
    torch.testing.assert_close(loss.float(), ref_loss, rtol=1e-2, atol=1e-2)
    _assert_close_grads(grads, ref_grads, 5e-2)


def test_conv2d_backward_of_a_deep_copied_channels_last_model_under_the_profiler():
    """The reported failure: IndexError at ctx.needs_input_grad[2] in conv2d's backward (no bias, profiler on,
    so the call went through the dispatcher, which omits the defaulted bias)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(64, 64, 3, padding=1, bias=False), torch.nn.ReLU(),
                              torch.nn.Conv2d(64, 64, 3, padding=1, bias=False))
    net = net.to("cuda", torch.bfloat16).to(memory_format=torch.channels_last)
    patched = copy.deepcopy(net)
    jitops.patch(patched)
    x = torch.randn(32, 64, 56, 56, device="cuda", dtype=torch.bfloat16).contiguous(
        memory_format=torch.channels_last).requires_grad_()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]):
        out = patched(x)
        out.float().square().mean().backward()
    ours = (x.grad.clone(), [p.grad.clone() for p in patched.parameters()])
    x.grad = None
    F.mse_loss(net(x).float(), torch.zeros_like(out, dtype=torch.float32), reduction="mean").backward()
    torch.testing.assert_close(ours[0], x.grad, rtol=2e-2, atol=2e-2 * x.grad.abs().max().item())
    for g, p in zip(ours[1], net.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=2e-2, atol=2e-2 * p.grad.abs().max().item())


def test_prefetch_loads_every_kernel_of_a_step_before_its_first_call():
    """jitops.prefetch's meta pass lists the step's kernels; with them cached it loads them all, so the first
    real step loads nothing more (and compiles nothing)."""
    model, net, batch = _model("gpt2")
    jitops.patch(net, prefetch=False)
    jitops.clear_memory_cache()
    compiles = jitops.stats.compiles
    report = jitops.prefetch(net, *batch, labels=batch[0])
    assert report.skipped is None and report.kernels >= 10, report
    disk_hits = jitops.stats.disk_hits
    model.loss(net, batch).backward()
    assert jitops.stats.disk_hits == disk_hits and jitops.stats.compiles == compiles
