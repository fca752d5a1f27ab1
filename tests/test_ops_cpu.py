"""The built-in ops' CPU path (C++ through load_inline) against torch, with gradients, gradcheck, opcheck and
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
