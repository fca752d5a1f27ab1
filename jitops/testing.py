"""Op tester: an op against its reference, over dtypes and shapes, forward and backward, plus gradcheck,
torch.library.opcheck and torch.compile(fullgraph=True).

    from jitops.testing import check_op
    check_op(jitops.gelu, lambda x, approximate: F.gelu(x, approximate=approximate),
             samples=lambda dtype, device: [(torch.randn(7, 1000, dtype=dtype, device=device), "tanh")],
             dtypes=[torch.float32, torch.float64], device="cpu")

The reference runs in float64 on the CPU on upcast copies of the inputs; outputs are compared with a
tolerance per dtype.  Every failure names the op, the sample and the dtype.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import torch

# (rtol, atol) per dtype for results computed with fp32 accumulation.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-10, 1e-10),
    torch.float32: (2e-5, 2e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}


@dataclass
class Report:
    op: str
    checked: list[str] = field(default_factory=list)

    def add(self, what: str) -> None:
        self.checked.append(what)

    def __str__(self) -> str:
        return f"{self.op}: {len(self.checked)} checks passed"


def _map(value: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_map(v, fn) for v in value)
    return value


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _describe(args: Sequence[Any]) -> str:
    parts = []
    for a in args:
        if isinstance(a, torch.Tensor):
            layout = "" if a.is_contiguous() else f" strides {tuple(a.stride())}"
            parts.append(f"Tensor{tuple(a.shape)}{layout}")
        elif isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor):
            parts.append(f"[{', '.join(str(tuple(t.shape)) for t in a)}]")
        else:
            parts.append(repr(a))
    return f"({', '.join(parts)})"


def assert_close(actual: Any, expected: Any, dtype: torch.dtype, what: str,
                 tolerances: dict[torch.dtype, tuple[float, float]] | None = None) -> None:
    rtol, atol = (tolerances or TOLERANCES).get(dtype, TOLERANCES[torch.float32])
    actual_t, expected_t = _tensors(actual), _tensors(expected)
    if len(actual_t) != len(expected_t):
        raise AssertionError(f"{what}: {len(actual_t)} outputs, reference has {len(expected_t)}")
    for i, (a, e) in enumerate(zip(actual_t, expected_t)):
        if a.shape != e.shape:
            raise AssertionError(f"{what}: output {i} has shape {tuple(a.shape)}, reference {tuple(e.shape)}")
        a64 = a.detach().to("cpu", torch.float64)
        e64 = e.detach().to("cpu", torch.float64)
        if torch.isnan(a64).any() and not torch.isnan(e64).any():
            raise AssertionError(f"{what}: output {i} has NaN where the reference has none")
        # Scale atol by the reference's magnitude so large values do not fail on rounding alone.
        scale = max(float(e64.abs().max()) if e64.numel() else 0.0, 1.0)
        torch.testing.assert_close(a64, e64, rtol=rtol, atol=atol * scale, equal_nan=True,
                                   msg=lambda m: f"{what}, output {i}: {m}")


def noncontiguous(t: torch.Tensor) -> torch.Tensor:
    """The same values in a strided (non-contiguous) view: every other element of a buffer twice as long in
    the last dimension."""
    if t.dim() == 0 or t.numel() == 0:
        return t
    shape = list(t.shape)
    shape[-1] *= 2
    wide = torch.zeros(shape, dtype=t.dtype, device=t.device)
    view = wide[..., ::2]
    view.copy_(t)
    return view.requires_grad_(t.requires_grad)


def check_forward(fn: Callable[..., Any], reference: Callable[..., Any], args: Sequence[Any], dtype: torch.dtype,
                  name: str, tolerances: dict | None = None) -> Any:
    out = fn(*args)
    ref_args = _map(args, lambda t: t.detach().to("cpu", torch.float64) if t.is_floating_point() else t.cpu())
    expected = reference(*ref_args)
    assert_close(out, expected, dtype, f"{name} forward {_describe(args)} {dtype}", tolerances)
    return out


def check_backward(fn: Callable[..., Any], reference: Callable[..., Any], args: Sequence[Any], dtype: torch.dtype,
                   name: str, tolerances: dict | None = None, seed: int = 0) -> None:
    inputs = [t for t in _tensors(args) if t.is_floating_point()]
    if not inputs:
        return
    leaves = _map(args, lambda t: t.detach().clone().requires_grad_(t.is_floating_point()))
    ref_leaves = _map(args, lambda t: t.detach().to("cpu", torch.float64).requires_grad_(t.is_floating_point())
                      if t.is_floating_point() else t.cpu())
    out = fn(*leaves)
    expected = reference(*ref_leaves)
    outs, exps = _tensors(out), _tensors(expected)
    generator = torch.Generator().manual_seed(seed)
    grads = [torch.randn(o.shape, generator=generator, dtype=torch.float64) for o in outs]
    got = torch.autograd.grad(outs, [t for t in _tensors(leaves) if t.requires_grad],
                              [g.to(o.device, o.dtype) for g, o in zip(grads, outs)], allow_unused=True)
    want = torch.autograd.grad(exps, [t for t in _tensors(ref_leaves) if t.requires_grad], grads, allow_unused=True)
    for i, (g, w) in enumerate(zip(got, want)):
        if w is None:
            continue
        if g is None:
            raise AssertionError(f"{name} backward {_describe(args)} {dtype}: input {i} got no gradient")
        assert_close(g, w, dtype, f"{name} backward {_describe(args)} {dtype}, grad of input {i}", tolerances)


def check_gradcheck(fn: Callable[..., Any], args: Sequence[Any], name: str) -> None:
    args64 = _map(args, lambda t: t.detach().to(torch.float64).requires_grad_(True) if t.is_floating_point() else t)
    if not torch.autograd.gradcheck(lambda *a: fn(*a), tuple(args64), eps=1e-6, atol=1e-5, rtol=1e-4,
                                    fast_mode=True):
        raise AssertionError(f"{name}: gradcheck failed for {_describe(args)}")


def check_opcheck(op: Any, args: Sequence[Any], name: str) -> None:
    overload = op.op.overload if hasattr(op, "op") else op
    torch.library.opcheck(overload, tuple(args))


def check_compile(fn: Callable[..., Any], args: Sequence[Any], name: str, backend: str = "aot_eager") -> None:
    """torch.compile(fullgraph=True) gives the eager result, forward and backward."""
    torch._dynamo.reset()  # samples of other ranks would otherwise pile up recompiles of one function
    compiled = torch.compile(fn, fullgraph=True, backend=backend)
    eager = fn(*args)
    got = compiled(*args)
    for e, g in zip(_tensors(eager), _tensors(got)):
        torch.testing.assert_close(g, e, msg=lambda m: f"{name} under torch.compile {_describe(args)}: {m}")
    if any(t.requires_grad for t in _tensors(args)):
        leaves = [t for t in _tensors(args) if t.requires_grad]
        sum(o.float().sum() for o in _tensors(compiled(*args))).backward()
        grads = [t.grad.clone() for t in leaves]
        for t in leaves:
            t.grad = None
        sum(o.float().sum() for o in _tensors(fn(*args))).backward()
        for g, t in zip(grads, leaves):
            torch.testing.assert_close(g, t.grad, msg=lambda m: f"{name} compiled backward: {m}")
            t.grad = None


def check_op(fn: Callable[..., Any], reference: Callable[..., Any], *,
             samples: Callable[[torch.dtype, torch.device], Iterable[Sequence[Any]]],
             dtypes: Sequence[torch.dtype], device: str | torch.device = "cpu",
             backward: bool = True, gradcheck: bool = True, opcheck: bool = True, compile: bool = False,
             noncontiguous_inputs: bool = True, tolerances: dict | None = None) -> Report:
    """Run every check over every dtype and sample; raises AssertionError on the first failure."""
    device = torch.device(device)
    name = getattr(fn, "__name__", repr(fn))
    report = Report(name)
    for dtype in dtypes:
        for index, args in enumerate(samples(dtype, device)):
            variants = [tuple(args)]
            if noncontiguous_inputs and any(t.dim() > 0 and t.numel() > 1 for t in _tensors(args)):
                variants.append(tuple(_map(args, noncontiguous)))
            for variant in variants:
                check_forward(fn, reference, variant, dtype, name, tolerances)
                report.add(f"forward {dtype} {_describe(variant)}")
                if backward:
                    check_backward(fn, reference, variant, dtype, name, tolerances)
                    report.add(f"backward {dtype} {_describe(variant)}")
            if opcheck:
                check_opcheck(fn, args, name)
                report.add(f"opcheck {dtype} {_describe(args)}")
            if compile and index == 0:
                check_compile(fn, _map(args, lambda t: t.detach().requires_grad_(t.is_floating_point()
                                                                                  and backward)), name)
                report.add(f"torch.compile {dtype} {_describe(args)}")
    if gradcheck and any(d in (torch.float64,) for d in dtypes):
        for args in samples(torch.float64, device):
            if all(t.numel() <= 4096 for t in _tensors(args)):
                check_gradcheck(fn, args, name)
                report.add(f"gradcheck {_describe(args)}")
    return report
