"""jitops.patch / unpatch on real model code (transformers' GPT-2, Llama, ViT and ResNet, tiny configs), on the CPU.

Every patched model must give the unpatched model's logits, loss and gradients, train to the same losses, keep
its parameters, names, weight tying and state_dict, and come back exactly with unpatch.  (timm needs a
torchvision matching the CPU torch, which the CPU machines lack: timm's models are covered on the GPU.)
"""
from __future__ import annotations

import copy
import logging
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import jitops
from jitops.patching import _original_class

transformers = pytest.importorskip("transformers")


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=64, n_positions=32, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg), lambda: (torch.randint(0, 64, (2, 12)),)


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=32, intermediate_size=88, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=64, max_position_embeddings=32, bos_token_id=0,
                      eos_token_id=0, pad_token_id=0)
    return LlamaForCausalLM(cfg), lambda: (torch.randint(0, 64, (2, 12)),)


def vit():
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=16,
                    patch_size=4, num_labels=5, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return ViTForImageClassification(cfg), lambda: (torch.randn(2, 3, 16, 16),)


def resnet():
    from transformers import ResNetConfig, ResNetForImageClassification

    cfg = ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=5)
    return ResNetForImageClassification(cfg), lambda: (torch.randn(2, 3, 32, 32),)


MODELS = {"gpt2": gpt2, "llama": llama, "vit": vit, "resnet": resnet}
# What each model's report must name (module kinds), and its fused Linear+GELU pairs.
EXPECTED = {
    "gpt2": ({"transformers.pytorch_utils.Conv1D", "nn.LayerNorm", "transformers.activations.NewGELUActivation",
              "nn.Linear"}, 2),
    "llama": ({"nn.Linear", "transformers.models.llama.modeling_llama.LlamaRMSNorm"}, 0),
    "vit": ({"nn.Linear", "nn.LayerNorm", "nn.Conv2d", "transformers.activations.GELUActivation"}, 2),
    "resnet": ({"nn.Conv2d", "nn.Linear"}, 0),
}


def _loss(model, inputs):
    out = model(*inputs)
    logits = out.logits
    if logits.dim() == 3:  # language models: next-token loss on the inputs
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), inputs[0][:, 1:].reshape(-1)), logits
    return F.cross_entropy(logits, torch.arange(logits.shape[0]) % logits.shape[-1]), logits


def _pair(name, dtype):
    torch.manual_seed(0)
    model, make_inputs = MODELS[name]()
    model = model.to(dtype).train()
    reference = copy.deepcopy(model)
    torch.manual_seed(1)
    inputs = tuple(t.to(dtype) if t.is_floating_point() else t for t in make_inputs())
    return model, reference, inputs


TOLERANCE = {torch.float64: 1e-10, torch.float32: 2e-5}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("name", list(MODELS))
def test_patched_model_matches_logits_loss_and_every_gradient(name, dtype):
    model, reference, inputs = _pair(name, dtype)
    names_before = [n for n, _ in model.named_parameters()]
    report = jitops.patch(model)
    kinds, fused = EXPECTED[name]
    assert {s.kind for s in report.swapped} >= kinds, str(report)
    assert len(report.fused) == fused, str(report)
    assert [n for n, _ in model.named_parameters()] == names_before
    loss, logits = _loss(model, inputs)
    ref_loss, ref_logits = _loss(reference, inputs)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(logits, ref_logits, rtol=tol, atol=tol)
    torch.testing.assert_close(loss, ref_loss, rtol=tol, atol=tol)
    loss.backward()
    ref_loss.backward()
    for (n, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        assert (p.grad is None) == (q.grad is None), n
        if q.grad is not None:
            # Gradients that are zero in exact arithmetic (a key bias under softmax) hold rounding noise:
            # compare against the model's largest gradient as well.
            scale = max(q.grad.abs().max().item(), 1e-3)
            torch.testing.assert_close(p.grad, q.grad, rtol=tol * 10, atol=tol * 10 * scale, msg=n)


@pytest.mark.parametrize("name", list(MODELS))
def test_patched_model_trains_three_steps_to_the_same_losses(name):
    model, reference, inputs = _pair(name, torch.float64)
    jitops.patch(model)
    losses = []
    for m in (model, reference):
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        seen = []
        for _ in range(3):
            loss, _ = _loss(m, inputs)
            loss.backward()
            opt.step()
            opt.zero_grad()
            seen.append(loss.item())
        losses.append(seen)
    assert losses[0] == pytest.approx(losses[1], rel=1e-9, abs=1e-12)
    assert losses[0][2] < losses[0][0]  # it trained


def test_weight_tying_state_dict_and_unpatch_restore_the_model_exactly():
    model, reference, inputs = _pair("gpt2", torch.float64)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    classes = {n: type(m) for n, m in model.named_modules()}
    report = jitops.patch(model)
    assert model.lm_head.weight is model.transformer.wte.weight
    assert list(model.state_dict()) == list(state)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    assert isinstance(model.transformer.h[0].ln_1, nn.LayerNorm)  # isinstance checks still hold
    assert type(model.transformer.h[0].ln_1) is not nn.LayerNorm
    assert jitops.unpatch(model) == len(report.swapped)
    assert {n: type(m) for n, m in model.named_modules()} == classes
    assert not any(k.startswith("_jitops") for m in model.modules() for k in m.__dict__)
    torch.testing.assert_close(_loss(model, inputs)[0], _loss(reference, inputs)[0], rtol=0, atol=0)
    assert jitops.unpatch(model) == 0  # nothing left to restore


def test_patching_twice_is_harmless_and_a_patched_model_pickles(tmp_path):
    model, reference, inputs = _pair("gpt2", torch.float64)
    first = jitops.patch(model)
    second = jitops.patch(model)
    assert not second.swapped and len(second.left_alone) == len(first.swapped)
    assert {a.reason for a in second.left_alone} == {"already patched"}
    path = tmp_path / "model.pt"
    torch.save(model, path)
    loaded = torch.load(path, weights_only=False)
    torch.testing.assert_close(_loss(loaded, inputs)[0], _loss(reference, inputs)[0])


def test_report_names_kinds_and_reasons_for_what_it_leaves_alone():
    class OwnForward(nn.Linear):
        def forward(self, x):
            return super().forward(x) * 2

    model = nn.Sequential(
        nn.Conv2d(4, 4, 3, groups=2, padding=1),              # grouped: left alone
        nn.Conv2d(4, 4, 3, padding=1, padding_mode="reflect"),  # reflect padding: left alone
        nn.Conv2d(4, 4, 3, padding="same"),                    # swapped (symmetric "same")
        nn.Conv2d(4, 4, 2, padding="same"),                    # even kernel: asymmetric "same", swapped too
        nn.Flatten(), OwnForward(4 * 6 * 6, 8), nn.Linear(8, 8), nn.GELU(approximate="tanh"), nn.Linear(8, 3),
    ).double()
    reference = copy.deepcopy(model)
    report = jitops.patch(model)
    reasons = {a.name: a.reason for a in report.left_alone}
    assert "groups=2" in reasons["0"] and "reflect" in reasons["1"]
    assert "own forward" in reasons["5"]
    assert [s.name for s in report.swapped] == ["2", "3", "6", "7", "8"]
    assert report.fused == [("6", "7", "gelu_tanh")]
    text = str(report)
    assert "left alone" in text and "groups=2" in text and "nn.Conv2d" in text
    x = torch.randn(2, 4, 6, 6, dtype=torch.float64)
    torch.testing.assert_close(model(x), reference(x))


def test_nothing_to_swap_says_so(caplog):
    model = nn.Sequential(nn.ReLU(), nn.Dropout())
    with caplog.at_level(logging.WARNING, logger="jitops"):
        report = jitops.patch(model)
    assert not report.swapped and "nothing to swap" in str(report)
    assert any("nothing to swap" in r.getMessage() for r in caplog.records)


def test_bad_arguments_name_the_argument():
    with pytest.raises(TypeError, match="'model'"):
        jitops.patch(object())
    with pytest.raises(ValueError, match="'ops'.*rmsnorm"):
        jitops.patch(nn.Linear(2, 2), ops=("linear", "rmsnorm"))


def test_ops_choose_what_is_swapped():
    model = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.LayerNorm(8)).double()
    report = jitops.patch(model, ops=("layer_norm",))
    assert [s.op for s in report.swapped] == ["jitops.layer_norm"] and not report.fused
    jitops.unpatch(model)
    report = jitops.patch(model, fuse=False)
    assert not report.fused and len(report.swapped) == 3


def test_unsupported_inputs_run_the_torch_forward(caplog):
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    reference = copy.deepcopy(model)
    jitops.patch(model)
    x = torch.randn(3, 8, dtype=torch.complex64)  # jitops computes real floating-point dtypes only
    model.to(torch.complex64)
    reference.to(torch.complex64)
    with caplog.at_level(logging.INFO, logger="jitops"):
        out = model(x)
    torch.testing.assert_close(out, reference(x))
    assert any("torch forward" in r.getMessage() for r in caplog.records)


def test_fused_linear_gelu_matches_and_unfuses_on_unpatch():
    torch.manual_seed(0)
    from transformers.models.gpt2.modeling_gpt2 import GPT2MLP
    from transformers import GPT2Config

    mlp = GPT2MLP(64, GPT2Config(n_embd=16, resid_pdrop=0.0)).double()
    reference = copy.deepcopy(mlp)
    report = jitops.patch(mlp)
    assert report.fused == [("c_fc", "act", "gelu_tanh")]
    assert _original_class(type(mlp.act)).__name__ == "NewGELUActivation"
    x = torch.randn(2, 5, 16, dtype=torch.float64, requires_grad=True)
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            torch.testing.assert_close(mlp(x), reference(x))
    jitops.unpatch(mlp)
    assert "_jitops_activation" not in mlp.c_fc.__dict__


def test_compiled_patched_model_fullgraph():
    """torch.compile(fullgraph=True) traces the patched forwards and jitops' ops (fake kernels, registered
    autograd) without a graph break; aot_eager keeps the CPU test short."""
    model, reference, inputs = _pair("gpt2", torch.float32)
    jitops.patch(model)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    loss, _ = _loss(compiled, inputs)
    ref_loss, _ = _loss(reference, inputs)
    torch.testing.assert_close(loss, ref_loss, rtol=2e-5, atol=2e-5)
    loss.backward()
    ref_loss.backward()
    for (n, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        scale = max(q.grad.abs().max().item(), 1e-3)
        torch.testing.assert_close(p.grad, q.grad, rtol=2e-4, atol=2e-4 * scale, msg=n)


def test_meta_model_records_its_kernel_calls():
    """A model on meta tensors runs jitops' checks and fake kernels: record_calls lists the calls a GPU step
    would make (a prewarm manifest), with nothing compiled."""
    from transformers import GPT2Config, GPT2LMHeadModel

    with torch.device("meta"):
        model = GPT2LMHeadModel(GPT2Config(n_embd=64, n_layer=1, n_head=4, vocab_size=128)).to(torch.bfloat16)
    jitops.patch(model)
    ids = torch.zeros(2, 16, dtype=torch.long, device="meta")
    before = jitops.stats.compiles
    with jitops.record_calls() as calls:
        model(input_ids=ids, labels=ids).loss.backward()
    assert jitops.stats.compiles == before
    ops = {item.get("kernel_op", item["op"]) for item in calls.items}  # the public name, and the exact op
    assert {"linear", "layer_norm_forward", "layer_norm_backward", "gemm", "gelu", "gelu_backward"} <= ops
    assert {item["op"] for item in calls.items} <= set(jitops.public_names())
    manifest = calls.manifest(["sm_90a"])
    assert manifest["archs"] == ["sm_90a"] and manifest["ops"] == calls.items


def test_under_torch_compile_an_unaligned_linear_is_traced_as_torchs_op(monkeypatch):
    """Compiled, a Linear whose widths are not multiples of 8 is left to inductor (which pads it inside the graph);
    eager, it takes jitops' padded kernels.  The rule is jitops.linear's, so a patched model and a direct call
    follow it alike.  Meta tensors stand for the GPU; tracing is simulated."""
    linear_module = sys.modules["jitops.ops.linear"]

    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(16, 24), nn.Linear(24, 50)).to(torch.bfloat16)
    jitops.patch(model, prefetch=False)
    x = torch.empty(4, 16, device="meta", dtype=torch.bfloat16)

    def linear_calls():
        with jitops.record_calls() as calls:
            y = model(x)
        assert y.shape == (4, 50) and y.is_meta
        return [item["shapes"][0][1] for item in calls.items if item["op"] == "linear"]

    assert linear_calls() == [[24, 16], [50, 24]]
    monkeypatch.setattr(linear_module, "_compiling", lambda: True)
    assert linear_calls() == [[24, 16]]
    w = torch.empty(50, 24, device="meta", dtype=torch.bfloat16)
    with jitops.record_calls() as calls:
        y = jitops.linear(torch.empty(4, 24, device="meta", dtype=torch.bfloat16), w, activation="gelu")
    assert y.shape == (4, 50) and calls.items == []


def test_shape_classes_of_fake_cuda_parameters_read_no_data_pointer():
    """torch.compile's fake parameters pass isinstance(t, nn.Parameter); reading their data pointer raised
    'Cannot access data pointer of Tensor' in reduce-overhead compiles of a patched model on the GPU."""
    import warnings

    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(), warnings.catch_warnings():
        warnings.simplefilter("error")  # the deprecation warning that precedes the error
        # (No views of fake CUDA tensors: without a GPU, t() and slicing abort in the device guard.)
        def param(*shape):
            return nn.Parameter(torch.empty(*shape, device="cuda", dtype=torch.bfloat16))

        x = torch.empty(8, 16, device="cuda", dtype=torch.bfloat16)
        w, b, kn, ln_w = param(32, 16), param(32), param(16, 32), param(16)
        assert isinstance(w, nn.Parameter) and type(w) is not nn.Parameter
        assert jitops.linear.op.shape_class(x, w, b, None).align == 8
        assert jitops.gemm.op.shape_class(x, kn, None, None, None).align == 8
        assert jitops.layer_norm_forward.op.shape_class(x, [16], ln_w, None, 1e-5).dtype == torch.bfloat16


def test_prefetch_runs_once_per_input_signature_and_skips_cpu_models(monkeypatch):
    """The forward pre-hook calls jitops.prefetch on a model's first call with each new input shape; a model
    on the CPU is skipped (the meta pass stands for the GPU), and unpatch removes the hook."""
    import jitops.patching as patch_module

    model, reference, inputs = _pair("gpt2", torch.float64)
    seen = []
    real = patch_module.prefetch
    monkeypatch.setattr(patch_module, "prefetch", lambda m, *a, **k: seen.append(real(m, *a, **k)))
    jitops.patch(model)
    model(*inputs)
    model(*inputs)
    model(inputs[0][:, :5])
    assert len(seen) == 2 and all("not on a GPU" in r.skipped for r in seen)
    jitops.unpatch(model)
    model(inputs[0][:, :3])
    assert len(seen) == 2


def test_prefetch_survives_a_meta_pass_the_model_cannot_make():
    class NeedsData(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(8, 8)

        def forward(self, x):
            if x.sum().item() > 0:  # data-dependent: no meta tensor can answer
                return self.linear(x)
            return x

    model = NeedsData().double()
    jitops.patch(model)
    x = torch.randn(2, 8, dtype=torch.float64)
    # On the CPU the prefetch is skipped before its meta pass; call it on a model that claims a GPU's
    # parameters by giving it meta parameters only through the pass itself:
    report = jitops.prefetch(model, x)
    assert report.skipped and report.submitted == 0
    model(x)


def test_ops_on_meta_tensors_return_fake_outputs():
    """Meta tensors stand for a GPU call: jitops.record_calls() and jitops.prefetch depend on it."""
    y = jitops.gelu(torch.randn(3, 5, device="meta"), "tanh")
    assert y.is_meta and y.shape == (3, 5)
    out = jitops.linear(torch.empty(2, 7, 16, device="meta", dtype=torch.bfloat16),
                        torch.empty(24, 16, device="meta", dtype=torch.bfloat16))
    assert out.is_meta and out.shape == (2, 7, 24)
    with pytest.raises(TypeError, match="jitops.linear.*'x'"):  # the checks still run
        jitops.linear(torch.empty(2, 16, device="meta", dtype=torch.int32),
                      torch.empty(24, 16, device="meta", dtype=torch.int32))


@pytest.mark.parametrize("lead", [(8, 16), (128,)])
@pytest.mark.parametrize("n, k, transposed", [(100, 64, False), (100, 64, True), (64, 61, False), (77, 61, True)])
def test_unaligned_linear_backward_on_meta_records_its_padded_gemms(lead, n, k, transposed):
    """Features that are not multiples of 8 take the padded path on a GPU; its backward runs on meta tensors
    too (the meta pass of jitops.prefetch), with 2-D operands for every GEMM.  An N-D input with an aligned K and
    an unaligned N (GPT-2's LM head) once passed the 3-D input itself to jitops.gemm."""
    x = torch.empty(*lead, k, device="meta", dtype=torch.bfloat16, requires_grad=True)
    w = torch.empty(k, n, device="meta", dtype=torch.bfloat16).t() if transposed else \
        torch.empty(n, k, device="meta", dtype=torch.bfloat16)
    w.requires_grad_()
    with jitops.record_calls() as calls:
        y = jitops.linear(x, w)
        y.backward(torch.ones_like(y))
    assert x.grad.shape == x.shape and w.grad.shape == w.shape
    gemms = [item for item in calls.items if item.get("kernel_op", item["op"]) == "gemm"]
    assert len(gemms) == 2 and all(len(shape) == 2 for item in gemms for shape in item["shapes"][0][:2])
    # the backward's calls are the ones the op declares (prewarm builds exactly these)
    declared = jitops.linear.op.companion_calls((x, w, None, None))
    assert len(declared) == 2
