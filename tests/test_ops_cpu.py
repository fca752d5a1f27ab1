"""The built-in ops' CPU path (C++ through the cxx backend) against torch, with gradients, gradcheck, opcheck and
torch.compile.  The first test compiles each CPU kernel (about 30 s each on a 2-core machine)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import jitops
from jitops.testing import check_op

SIZES = [(1,), (7,), (1000,), (4097,), (3, 5, 7), (0,), (2, 0, 3)]
DTYPES = [torch.float32, torch.float64]


def unary_samples(*extra):
    def samples(dtype, device):
        generator = torch.Generator().manual_seed(0)
        return [(torch.randn(size, generator=generator, dtype=dtype).to(device), *extra) for size in SIZES]
    return samples


def binary_samples(dtype, device):
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(size, generator=generator, dtype=dtype).to(device),
             torch.randn(size, generator=generator, dtype=dtype).to(device)) for size in SIZES]


def test_add_cpu():
    report = check_op(jitops.add, torch.add, samples=binary_samples, dtypes=DTYPES, device="cpu", compile=True)
    assert len(report.checked) > 20


def add_positional(a, b, alpha):
    return jitops.add(a, b, alpha=alpha)


add_positional.op = jitops.add.op  # check_op runs opcheck on the op behind the function

# Broadcast pairs: a column against a row, both sides broadcast, 0-d operands, empty dimensions, and a pattern
# whose broadcast dimensions alternate (seven groups that do not merge).
BROADCAST = [((5, 1), (5,)), ((10, 1, 5), (1, 10, 5)), ((3,), ()), ((), ()), ((0, 1, 3), (0, 10, 3)),
             ((4, 1, 1), (7, 1)), ((2, 3, 1, 4, 1, 5, 1), (3, 7, 1, 6, 5, 2)), ((1, 4097), (3, 1))]


def broadcast_samples(dtype, device):
    generator = torch.Generator().manual_seed(2)
    return [(torch.randn(a, generator=generator, dtype=dtype).to(device),
             torch.randn(b, generator=generator, dtype=dtype).to(device), alpha)
            for (a, b), alpha in zip(BROADCAST, [1, 2, -3.125, 1, 0.5, 1, 2, -1])]


def test_add_broadcasting_and_alpha_cpu():
    """Forward and gradients (each summed over its broadcast dimensions, b's times alpha) against torch.add in
    float64, on contiguous and strided inputs, every CPU dtype; gradcheck, opcheck, torch.compile."""
    report = check_op(add_positional, lambda a, b, alpha: torch.add(a, b, alpha=alpha), samples=broadcast_samples,
                      dtypes=[torch.float32, torch.float64, torch.float16, torch.bfloat16], device="cpu",
                      compile=True)
    assert len(report.checked) > 100


def _tensor(shape, dtype, seed):
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 3).to(dtype)


f16, bf16, f32, f64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
# (a, b): type promotion as torch.result_type, Python numbers and 0-d tensors in either place.
PROMOTION = [
    (lambda: _tensor((3, 4), f16, 0), lambda: _tensor((4,), f32, 1)),        # fp16 + fp32 -> fp32
    (lambda: _tensor((5,), bf16, 0), lambda: _tensor((5,), f16, 1)),         # bf16 + fp16 -> fp32
    (lambda: _tensor((2, 3), f32, 0), lambda: _tensor((), f64, 1)),          # an fp64 0-d tensor -> fp32
    (lambda: _tensor((), f32, 0), lambda: _tensor((3,), f16, 1)),            # an fp32 0-d tensor -> fp16
    (lambda: _tensor((4, 1), f32, 0), lambda: _tensor((1, 3), f64, 1)),      # fp32 + fp64 -> fp64
    (lambda: _tensor((7,), f16, 0), lambda: 0.1),                            # a Python float rounds to fp16
    (lambda: 2.5, lambda: _tensor((4,), bf16, 1)),                           # a number as a
    (lambda: _tensor((3,), f64, 0), lambda: 3),                              # an int
    (lambda: _tensor((3,), f32, 0), lambda: True),                           # a bool
    (lambda: -8.5, lambda: 1.75),                                            # two numbers: a 0-d CPU tensor
]


@pytest.mark.parametrize("case", range(len(PROMOTION)))
@pytest.mark.parametrize("alpha", [1, -3.125])
def test_add_type_promotion_and_numbers_match_torch(case, alpha):
    a, b = (make() for make in PROMOTION[case])
    want = torch.add(a, b, alpha=alpha)
    got = jitops.add(a, b, alpha=alpha)
    assert got.dtype == want.dtype and got.shape == want.shape
    if alpha == 1:  # the same conversions and one rounding: bit for bit
        assert torch.equal(got, want)
    else:  # a + alpha * b: torch rounds it with an FMA in some of its loops and not in others
        low = got.dtype in (f16, bf16)  # one rounding of a product of ~3 near a cancelling sum: an absolute error
        torch.testing.assert_close(got, want, rtol=1e-2 if low else 1e-6, atol=1e-2 if low else 1e-5)
    tensors = [t for t in (a, b) if isinstance(t, torch.Tensor)]
    if not tensors:
        return
    leaves = [t.detach().requires_grad_() for t in tensors]
    ref_leaves = [t.detach().requires_grad_() for t in tensors]
    args = lambda leaves: [leaves.pop(0) if isinstance(t, torch.Tensor) else t for t in (a, b)]  # noqa: E731
    grad = torch.randn(want.shape, generator=torch.Generator().manual_seed(9)).to(want.dtype)
    jitops.add(*args(list(leaves)), alpha=alpha).backward(grad)
    torch.add(*args(list(ref_leaves)), alpha=alpha).backward(grad)
    for ours, theirs in zip(leaves, ref_leaves):
        assert ours.grad.dtype == ours.dtype and ours.grad.shape == ours.shape
        torch.testing.assert_close(ours.grad, theirs.grad)


@pytest.mark.parametrize("dtype", [f16, bf16])
def test_add_number_beside_a_16_bit_cuda_tensor_stays_fp32(monkeypatch, dtype):
    """On CUDA torch adds a Python number to a 16-bit tensor in fp32, unrounded (its kernels read scalars in their
    compute type), where its CPU kernels round the number to the tensor's dtype first.  jitops passes the number
    as alpha on a 0-d one; forced here on the CPU (whose kernel computes in fp32 too), the result is the fp32
    sum's rounding, and the number's place, a or b, does not matter.  tests/test_add_gpu.py checks it against
    torch on a GPU."""
    from jitops.ops import add as add_module

    monkeypatch.setattr(add_module, "_scalar_in_fp32", lambda t: t.dtype in (f16, bf16))
    x = (_tensor((64, 64), dtype, 3) / 30).requires_grad_()
    want = (x.detach().float() + torch.tensor(0.1, dtype=f32)).to(dtype)
    assert not torch.equal(want, torch.add(x.detach(), 0.1))  # the CPU's rounding differs on these values
    got = jitops.add(x, 0.1)
    assert torch.equal(got, want) and torch.equal(jitops.add(0.1, x.detach()), want)
    assert torch.equal(jitops.add(x.detach(), 0.05, alpha=2), (x.detach().float() + torch.tensor(0.1, dtype=f32))
                       .to(dtype))
    got.backward(torch.ones_like(got))
    assert torch.equal(x.grad, torch.ones_like(x))
    with pytest.raises(TypeError, match="argument 'alpha' must be a Python number"):
        jitops.add(x.detach(), 0.1, alpha=torch.tensor(2.0))


def test_add_numbers_through_torch_compile():
    x = torch.randn(6, 1, dtype=torch.float64)
    compiled = torch.compile(lambda x: jitops.add(x, 0.5, alpha=2) + jitops.add(1.5, x.t()), fullgraph=True,
                             backend="aot_eager")
    torch.testing.assert_close(compiled(x), torch.add(x, 0.5, alpha=2) + torch.add(1.5, x.t()))


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_gelu_cpu(approximate):
    check_op(jitops.gelu, lambda x, a: F.gelu(x, approximate=a), samples=unary_samples(approximate),
             dtypes=DTYPES, device="cpu", compile=True)


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_gelu_cpu_half_precision_through_the_fp32_kernel(approximate):
    check_op(jitops.gelu, lambda x, a: F.gelu(x, approximate=a), samples=unary_samples(approximate),
             dtypes=[torch.float16, torch.bfloat16], device="cpu", gradcheck=False)


def test_gelu_backward_op_cpu():
    check_op(jitops.gelu_backward,
             lambda g, x, a: torch.autograd.grad(F.gelu(x.requires_grad_(), approximate=a), x, g)[0],
             samples=lambda dtype, device: [(torch.randn(33, dtype=dtype), torch.randn(33, dtype=dtype), "tanh")],
             dtypes=DTYPES, backward=False, gradcheck=False)


def test_only_needed_gradients_flow():
    a = torch.randn(10, dtype=torch.float64, requires_grad=True)
    b = torch.randn(10, dtype=torch.float64)
    out = jitops.add(a, b)
    assert out.grad_fn is not None
    out.sum().backward()
    assert torch.equal(a.grad, torch.ones(10, dtype=torch.float64)) and b.grad is None


def test_second_call_is_a_memory_hit_and_counters_move():
    x = torch.randn(100)
    jitops.gelu(x)
    jitops.reset_stats()
    jitops.gelu(x)
    jitops.gelu(torch.randn(5000))  # same shape class: sizes are runtime arguments
    assert jitops.stats.memory_hits == 2 and jitops.stats.compiles == 0


def test_fresh_process_is_a_disk_hit(session_cache):
    import subprocess
    import sys
    jitops.gelu(torch.randn(10))  # make sure it is cached
    code = ("import torch, jitops; x = torch.randn(10); "
            "assert torch.allclose(jitops.gelu(x), torch.nn.functional.gelu(x), atol=1e-6); "
            "s = jitops.stats; print(s.disk_hits, s.compiles)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, "JITOPS_CACHE_DIR": str(session_cache)}).stdout.split()
    assert out == ["1", "0"]


def test_grad_through_torch_ops_path_matches_direct_call():
    x = torch.randn(64, dtype=torch.float64)
    direct = jitops.gelu(x, "tanh")
    via_dispatcher = torch.ops.jitops.gelu.default(x, "tanh")
    assert torch.equal(direct, via_dispatcher)
