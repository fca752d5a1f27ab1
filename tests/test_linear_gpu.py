"""jitops.linear on a real GPU against a float64 reference: N-D inputs read in place, a transposed (Conv1D-style)
weight, every activation, features that are not multiples of 8 (padded onto the TMA kernels), gradients of all
three inputs, opcheck and torch.compile.

The calls are data (CASES) so that their kernels can be built together beforehand:
`python tests/test_linear_gpu.py --manifest FILE` writes a prewarm manifest from a pass on meta tensors."""
from __future__ import annotations

import json
import sys
import zlib
from typing import NamedTuple

import pytest
import torch
import torch.nn.functional as F

import jitops

pytestmark = pytest.mark.gpu

TOLERANCE = {torch.bfloat16: 1.6e-2, torch.float16: 2e-3}


class Case(NamedTuple):
    lead: tuple[int, ...]      # leading dimensions of x
    k: int                     # in_features
    n: int                     # out_features
    bias: bool = True
    activation: str | None = None
    transposed: bool = False   # weight is a (K, N) parameter's .t() (transformers' Conv1D)
    dtype: torch.dtype = torch.bfloat16


CASES = [
    Case((4, 96), 256, 512),
    Case((384,), 256, 512, bias=False, dtype=torch.float16),
    Case((2, 3, 64), 128, 256, activation="gelu_tanh"),
    Case((2, 64), 128, 256, activation="gelu"),
    Case((200,), 128, 256, activation="relu"),
    Case((8, 64), 256, 768, transposed=True),
    Case((512,), 256, 1000 + 5),            # N not a multiple of 8 (an LM head)
    Case((256,), 100 + 3, 256),             # K not a multiple of 8
    Case((3, 37), 61, 77, activation="gelu_tanh", transposed=True),
    Case((1,), 256, 512),                   # one row
]


def make(case: Case, device: str, requires_grad: bool = True):
    g = torch.Generator(device="cpu").manual_seed(zlib.crc32(repr(case).encode()))  # hash() of a str varies
    x = torch.randn(*case.lead, case.k, generator=g).to(device, case.dtype)
    w = (torch.randn(case.k, case.n, generator=g) / case.k ** 0.5).to(device, case.dtype)
    w = w.t() if case.transposed else w.t().contiguous()   # (N, K), a view of a (K, N) tensor when transposed
    b = torch.randn(case.n, generator=g).to(device, case.dtype) if case.bias else None
    leaves = [t for t in (x, w, b) if t is not None]
    for t in leaves:
        t.requires_grad_(requires_grad)
    return x, w, b


def reference(x, w, b, activation):
    y = F.linear(x.double(), w.double(), b.double() if b is not None else None)
    if activation == "relu":
        return torch.relu(y)
    if activation:
        return F.gelu(y, approximate="tanh" if activation == "gelu_tanh" else "none")
    return y


@pytest.mark.parametrize("case", CASES, ids=[f"{c.lead}x{c.k}x{c.n}-{c.activation}-{'t' if c.transposed else 'n'}"
                                             f"-{str(c.dtype)[6:]}" for c in CASES])
def test_forward_and_gradients_against_float64(case):
    x, w, b = make(case, "cuda")
    y = jitops.linear(x, w, b, activation=case.activation)
    assert y.shape == (*case.lead, case.n) and y.is_contiguous() and y.dtype == case.dtype
    ref = reference(x, w, b, case.activation)
    tol = TOLERANCE[case.dtype]
    torch.testing.assert_close(y.double(), ref, rtol=tol, atol=tol * ref.abs().max().item())
    grad = torch.randn_like(y)
    got = torch.autograd.grad(y, [t for t in (x, w, b) if t is not None], grad)
    want = torch.autograd.grad(ref, [t for t in (x, w, b) if t is not None], grad.double())
    for g, r in zip(got, want):
        torch.testing.assert_close(g.double(), r.double(), rtol=tol, atol=tol * r.abs().max().item())
    if case.transposed:  # the weight's gradient lands in the parameter's own (K, N) layout
        assert got[1].t().is_contiguous()
    with torch.no_grad():  # the inference path fuses the activation into the epilogue
        torch.testing.assert_close(jitops.linear(x, w, b, activation=case.activation).double(), ref,
                                   rtol=tol, atol=tol * ref.abs().max().item())


def test_an_unaligned_width_reads_the_weight_unpadded_with_the_padded_bits():
    """N % 8 != 0: the padded problems read the (N, K) weight as N8 rows (TMA reads zeros past row N) where they
    used to copy it zero-padded, forward and input gradient.  The bits of the same GEMMs on the padded weight, and
    no pad of the weight once the kernels are loaded."""
    from torch.profiler import ProfilerActivity, profile

    case = CASES[6]
    assert case.n % 8 and not case.transposed
    x, w, b = make(case, "cuda")
    n, k, n8 = case.n, case.k, -(-case.n // 8) * 8
    grad = torch.randn(*case.lead, n, device="cuda", dtype=case.dtype)
    wp = F.pad(w.detach(), (0, 0, 0, n8 - n))
    want_y = jitops.gemm(x.detach(), wp.t(), bias=F.pad(b.detach(), (0, n8 - n)))[:, :n]
    want_dx = jitops.gemm(F.pad(grad, (0, n8 - n)), wp)[:, :k]
    torch.autograd.grad(jitops.linear(x, w, b), [x], grad)  # loads (and offers) every kernel of the step
    for _ in range(2):
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            y = jitops.linear(x, w, b)
            dx, = torch.autograd.grad(y, [x], grad)
        assert torch.equal(y, want_y) and torch.equal(dx, want_dx)
        pads = [e.input_shapes[0] for e in prof.events() if e.name == "aten::constant_pad_nd"]
        assert [n, k] not in pads, pads


def test_opcheck_and_compile():
    case = CASES[2]
    x, w, b = make(case, "cuda")
    torch.library.opcheck(torch.ops.jitops.linear.default, (x, w, b), {"activation": "gelu_tanh"})
    compiled = torch.compile(lambda x, w, b: jitops.linear(x, w, b, activation="gelu_tanh"), fullgraph=True)
    torch.testing.assert_close(compiled(x, w, b), jitops.linear(x, w, b, activation="gelu_tanh"))


def manifest(arch: str = "sm_90a") -> dict:
    """Every kernel the cases above call, from a pass on meta tensors (no GPU needed)."""
    with jitops.record_calls() as calls:
        for case in CASES:
            x, w, b = make(case, "meta")
            y = jitops.linear(x, w, b, activation=case.activation)
            y.backward(torch.ones_like(y))
            with torch.no_grad():
                jitops.linear(x, w, b, activation=case.activation)
    return calls.manifest([arch])


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--manifest":
    with open(sys.argv[2], "w") as f:
        json.dump(manifest(), f)
