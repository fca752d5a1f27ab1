"""PyTorch's own OpInfo samples through jitops (issue 19): the inputs PyTorch tests torch.add, F.gelu,
F.layer_norm, torch.mm, torch.matmul, F.linear and F.conv2d with, fed to jitops.add, gelu, layer_norm, gemm (mm,
matmul), linear and conv2d, on the CPU and (marked gpu) on CUDA, in float32, float16 and bfloat16 (and float64 on
the CPU).  Every sample ends as exactly one of:
- match: the forward output and every input gradient agree with a float64 reference within the dtype's
  tolerance, allowing twice torch's own error on the same sample (`_agrees`);
- rejected: a TypeError or ValueError that names the op and the argument, whose reason is one of REJECTIONS,
  each documented in docs/semantics.md;
- xfail: a known failure listed in KNOWN_FAILURES with its reason; the test checks it still fails, so a fix
  shows up as a failure here until the entry is removed.
A sample that gives a different result (wrong) or an error that is not a documented rejection (unclear) fails
the test; the failure lists every such sample of its op and dtype.  The counts per op and dtype are printed at
the end of the session (conftest.py) and, where $JITOPS_OPINFO_SUMMARY names a file, written there as JSON.

    python tests/test_opinfo.py [--device cpu|cuda]    # the counts as docs/semantics.md's table, no pytest
"""
from __future__ import annotations

import collections
import json
import os
import re
import warnings
from dataclasses import dataclass

import pytest
import torch

import jitops

CPU_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
CUDA_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# OpInfo name -> (jitops op that replaces it, the call)
OPS = {
    "add": ("add", lambda s: jitops.add(s.input, *s.args, **s.kwargs)),
    "nn.functional.gelu": ("gelu", lambda s: jitops.gelu(s.input, *s.args, **s.kwargs)),
    "nn.functional.layer_norm": ("layer_norm", lambda s: jitops.layer_norm(s.input, *s.args, **s.kwargs)),
    "nn.functional.rms_norm": ("rms_norm", lambda s: jitops.rms_norm(s.input, *s.args, **s.kwargs)),
    "mm": ("gemm", lambda s: jitops.gemm(s.input, *s.args, **s.kwargs)),
    "matmul": ("gemm", lambda s: jitops.gemm(s.input, *s.args, **s.kwargs)),
    "nn.functional.linear": ("linear", lambda s: jitops.linear(s.input, *s.args, **s.kwargs)),
    "nn.functional.conv2d": ("conv2d", lambda s: jitops.conv2d(s.input, *s.args, **s.kwargs)),
}

# Documented rejections: (jitops op, pattern the error message matches, reason).  Each reason is a section of
# docs/semantics.md ("What jitops rejects").  An error that matches none of these is an unclear error.
# (N-D matmul, float32 gemm/linear/conv2d on CUDA and grouped conv2d were rejected until issue 19's second half:
# every sample of them must now match.)  No OpInfo sample in the tested dtypes meets the two left.
REJECTIONS = [
    ("add", r"argument '(a|b)' has dtype \w+; jitops.add computes floating-point tensors only",
     "add-floating-point-only"),
    ("add", r"argument '(a|b)' is on \w+ but '(a|b)' is on \w+; move them to one device", "one-device"),
]

# Known failures: (device, OpInfo name, dtype, sample description) -> reason.  The test asserts each still fails.
KNOWN_FAILURES: dict[tuple[str, str, torch.dtype, str], str] = {}

# (atol, rtol) against the float64 reference, on top of twice torch's own error on the same sample.  fp32 and
# fp16 are torch.testing's defaults; bf16's rtol is one bf16 rounding (2^-7), where torch.testing allows two.
TOLERANCES = {torch.float64: (1e-7, 1e-7), torch.float32: (1e-5, 1.3e-6), torch.float16: (1e-5, 1e-3),
              torch.bfloat16: (1e-5, 8e-3)}

OUTCOMES: list["Outcome"] = []  # every sample of this session, for the summary


@dataclass
class Outcome:
    device: str
    opinfo: str
    dtype: torch.dtype
    sample: str
    kind: str     # "match", "rejected", "xfail", "wrong" or "unclear"
    detail: str   # the rejection reason, the known failure's reason, or what went wrong


# ---- samples --------------------------------------------------------------------------------------------------
def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        layout = "" if value.is_contiguous() else " strided"
        return f"T{tuple(value.shape)}{layout}"
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(_describe(v) for v in value) + ")"
    return repr(value)


def describe(sample) -> str:
    parts = [_describe(sample.input)] + [_describe(a) for a in sample.args]
    parts += [f"{k}={_describe(v)}" for k, v in sample.kwargs.items()]
    return ", ".join(parts)


def _map(value, fn):
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_map(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: _map(v, fn) for k, v in value.items()}
    return value


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


class _Sample:
    """A sample's arguments with fresh leaves (converted to `dtype` when given): each of the three runs (jitops,
    torch in the sample's dtype, torch in float64) gets its own autograd graph."""

    def __init__(self, sample, dtype: torch.dtype | None = None) -> None:
        def leaf(t: torch.Tensor) -> torch.Tensor:
            copy = t.detach()
            if dtype is not None and copy.is_floating_point():
                copy = copy.to(dtype)
            return copy.clone().requires_grad_(t.requires_grad)
        self.input, self.args, self.kwargs = _map(sample.input, leaf), _map(sample.args, leaf), \
            _map(sample.kwargs, leaf)
        self.leaves = [t for t in _tensors([self.input, self.args, self.kwargs]) if t.requires_grad]


def _run(call, sample, dtype: torch.dtype, grad_seed: int):
    """(output, input gradients) of call(sample) for a fixed random output gradient, whose values are those of
    the sample's dtype in every run (the float64 reference gets the same rounded values, so that it is the exact
    answer for the inputs the others see: layer_norm's dx cancels, and a gradient rounded in one run only moved
    bf16 results by 4%)."""
    out = call(sample)
    if not sample.leaves or not isinstance(out, torch.Tensor) or not out.requires_grad:
        return out, []
    generator = torch.Generator().manual_seed(grad_seed)
    grad = torch.randn(out.shape, generator=generator, dtype=torch.float64).to(dtype).to(out.device, out.dtype)
    return out, list(torch.autograd.grad(out, sample.leaves, grad, allow_unused=True))


# ---- comparison -----------------------------------------------------------------------------------------------
def _agrees(ours: torch.Tensor, theirs: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype) -> str | None:
    """None if ours is as close to the float64 reference as the dtype allows, else what differs.  Allowed:
    atol + rtol * |reference| + 2 * |torch's own error| element by element; NaN and infinities where the reference
    or torch has them."""
    if ours.dtype != theirs.dtype:
        return f"dtype {ours.dtype}, torch gives {theirs.dtype}"
    if ours.shape != theirs.shape:
        return f"shape {tuple(ours.shape)}, torch gives {tuple(theirs.shape)}"
    o, t, r = (x.detach().to("cpu", torch.float64) for x in (ours, theirs, reference))
    atol, rtol = TOLERANCES[dtype]
    o_nan, t_nan, r_nan = o.isnan(), t.isnan(), r.isnan()
    if (o_nan & ~(t_nan | r_nan)).any() or (t_nan & r_nan & ~o_nan).any():
        return "NaN where torch and the reference disagree with it"
    finite = ~(o_nan | t_nan | r_nan)
    o, t, r = o[finite], t[finite], r[finite]
    infinite = r.isinf() | t.isinf()
    if (infinite & (o != r) & (o != t)).any():
        return "an infinity where neither torch nor the reference has it"
    error = (o - r).abs()
    allowed = atol + rtol * r.abs() + 2 * (t - r).abs()
    bad = ~infinite & (error > allowed)
    if bad.any():
        i = int(bad.nonzero()[0, 0]) if bad.dim() else 0
        return (f"{int(bad.sum())} of {bad.numel()} elements off, e.g. {o.flatten()[i].item():.6g} where the float64 "
                f"reference is {r.flatten()[i].item():.6g} and torch gives {t.flatten()[i].item():.6g}")
    return None


def _rejection(name: str, error: Exception) -> str | None:
    """The documented reason of a rejection, or None if the error is not a clear, documented one."""
    if not isinstance(error, (TypeError, ValueError)):
        return None
    message = str(error)
    if f"jitops.{name}" not in message or not re.search(r"arguments? '", message):
        return None
    for op_name, pattern, reason in REJECTIONS:
        if op_name == name and re.search(pattern, message):
            return reason
    return None


def classify(opinfo: str, sample, dtype: torch.dtype, index: int) -> tuple[str, str]:
    """(kind, detail) of one sample: match, rejected, wrong or unclear (known failures are applied by the
    caller)."""
    name, call = OPS[opinfo]
    torch_op = _opinfo(opinfo).op
    try:
        ours, ours_grads = _run(call, _Sample(sample), dtype, index)
    except Exception as error:  # noqa: BLE001 - classified below
        reason = _rejection(name, error)
        if reason is not None:
            return "rejected", reason
        return "unclear", f"{type(error).__name__}: {error}"
    reference_call = lambda s: torch_op(s.input, *s.args, **s.kwargs)  # noqa: E731
    theirs, theirs_grads = _run(reference_call, _Sample(sample), dtype, index)
    reference, reference_grads = _run(reference_call, _Sample(sample, torch.float64), dtype, index)
    problem = _agrees(ours, theirs, reference, dtype)
    if problem:
        return "wrong", f"forward: {problem}"
    for i, (g, t, r) in enumerate(zip(ours_grads, theirs_grads, reference_grads)):
        if r is None and t is None:
            continue
        if g is None:
            return "wrong", f"gradient of input {i}: none, torch computes one"
        problem = _agrees(g, t, r, dtype)
        if problem:
            return "wrong", f"gradient of input {i}: {problem}"
    return "match", ""


_OP_DB: dict = {}


def _opinfo(name: str):
    """The OpInfo entry (importing op_db takes about 10 s, so only when a test asks)."""
    if not _OP_DB:
        from torch.testing._internal.common_methods_invocations import op_db  # needs expecttest

        for entry in op_db:
            if entry.name in OPS and not entry.variant_test_name:
                _OP_DB[entry.name] = entry
    return _OP_DB[name]


def run_samples(opinfo: str, device: str, dtype: torch.dtype) -> list[Outcome]:
    entry = _opinfo(opinfo)
    if dtype not in entry.supported_dtypes(device):
        return []
    requires_grad = entry.supports_autograd and dtype in entry.supported_backward_dtypes(device)
    outcomes = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # padding="same" with an even kernel warns about the copy it makes
        for index, sample in enumerate(entry.reference_inputs(device, dtype, requires_grad=requires_grad)):
            text = describe(sample)
            kind, detail = classify(opinfo, sample, dtype, index)
            known = KNOWN_FAILURES.get((device, opinfo, dtype, text))
            if known is not None:
                kind, detail = ("xfail", known) if kind in ("wrong", "unclear") else ("fixed", known)
            outcomes.append(Outcome(device, opinfo, dtype, text, kind, detail))
    OUTCOMES.extend(outcomes)
    return outcomes


def _check(opinfo: str, device: str, dtype: torch.dtype) -> None:
    outcomes = run_samples(opinfo, device, dtype)
    if not outcomes:
        pytest.skip(f"torch itself has no {opinfo} for {dtype} on {device}")
    problems = [f"  {o.kind}: {opinfo}({o.sample}): {o.detail}" for o in outcomes
                if o.kind in ("wrong", "unclear", "fixed")]
    assert not problems, (f"{len(problems)} of {len(outcomes)} OpInfo samples of {opinfo} in {dtype} on {device} "
                          "are wrong, unclear, or known failures that now pass (remove them from KNOWN_FAILURES):\n"
                          + "\n".join(problems))


# ---- tests ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("opinfo", list(OPS))
def test_opinfo_samples_cpu(opinfo, dtype):
    _check(opinfo, "cpu", dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("opinfo", list(OPS))
def test_opinfo_samples_cuda(opinfo, dtype):
    _check(opinfo, "cuda", dtype)


def test_rejections_are_recognised_and_anything_else_is_unclear():
    """The classifier itself: a documented rejection counts as one; an error without the op and argument, or
    with a reason missing from REJECTIONS, does not."""
    with pytest.raises(TypeError) as info:
        jitops.add(torch.ones(3, dtype=torch.int32), torch.ones(3))
    assert _rejection("add", info.value) == "add-floating-point-only"
    with pytest.raises(ValueError) as info:
        jitops.add(torch.ones(3), torch.ones(3, device="meta"))
    assert _rejection("add", info.value) == "one-device"
    assert _rejection("conv2d", ValueError("invalid literal for int() with base 10: 's'")) is None
    assert _rejection("gemm", ValueError("jitops.gemm: argument 'a' is odd")) is None
    assert _rejection("add", RuntimeError(str(info.value))) is None  # a rejection is a TypeError or ValueError
    # The forms issue 19 added are no rejection any more: a message like the old ones counts as unclear.
    assert _rejection("gemm", ValueError("jitops.gemm: argument 'a' must be a 2-D (M, K) matrix")) is None
    assert _rejection("conv2d", ValueError("jitops.conv2d: argument 'groups' is 4; grouped and depthwise "
                                           "convolutions are not implemented yet")) is None


def test_every_rejection_reason_is_documented():
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "semantics.md").read_text()
    for _, _, reason in REJECTIONS:
        assert f"`{reason}`" in text, f"docs/semantics.md does not explain the rejection {reason!r}"


def test_comparison_allows_torchs_own_error_and_no_more():
    reference = torch.tensor([9.077, 1.0], dtype=torch.float64)
    theirs = torch.tensor([9.0625, 1.0], dtype=torch.bfloat16)
    assert _agrees(torch.tensor([9.0625, 1.0], dtype=torch.bfloat16), theirs, reference, torch.bfloat16) is None
    assert _agrees(torch.tensor([9.5, 1.0], dtype=torch.bfloat16), theirs, reference, torch.bfloat16)
    exact = torch.zeros(1, dtype=torch.float64)
    assert "elements off" in _agrees(torch.tensor([-6.7e-05]), torch.zeros(1), exact, torch.float32)
    nan = torch.tensor([float("nan")], dtype=torch.float64)
    assert _agrees(torch.tensor([float("nan")]), torch.tensor([float("nan")]), nan, torch.float32) is None
    assert _agrees(torch.tensor([1.0]), torch.tensor([float("nan")]), nan, torch.float32)


# ---- the summary ----------------------------------------------------------------------------------------------
KINDS = ("match", "rejected", "xfail", "wrong", "unclear", "fixed")


def summary_lines(outcomes: list[Outcome] | None = None) -> list[str]:
    """docs/semantics.md's table: counts per device, op and dtype, and the rejections by reason."""
    outcomes = OUTCOMES if outcomes is None else outcomes
    counts: dict[tuple[str, str, str], collections.Counter] = collections.defaultdict(collections.Counter)
    reasons: collections.Counter = collections.Counter()
    for o in outcomes:
        counts[(o.device, o.opinfo, str(o.dtype).removeprefix("torch."))][o.kind] += 1
        if o.kind in ("rejected", "xfail"):
            reasons[(o.device, o.kind, o.detail)] += 1
    lines = ["| device | OpInfo op | dtype | samples | match | rejected | xfail | wrong | unclear |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    totals: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for (device, opinfo, dtype), c in sorted(counts.items()):
        lines.append(f"| {device} | {opinfo} | {dtype} | {sum(c.values())} | {c['match']} | {c['rejected']} | "
                     f"{c['xfail']} | {c['wrong']} | {c['unclear']} |")
        totals[device].update(c)
    for device, c in sorted(totals.items()):
        total = sum(c.values())
        lines.append(f"| {device} | all | all | {total} | {c['match']} ({100 * c['match'] / total:.1f}%) | "
                     f"{c['rejected']} | {c['xfail']} | {c['wrong']} | {c['unclear']} |")
        if c["fixed"]:
            lines.append(f"{device}: {c['fixed']} known failures now pass (remove them from KNOWN_FAILURES)")
    lines.append("")
    lines += [f"{device} {kind}: {reason}: {n}" for (device, kind, reason), n in sorted(reasons.items())]
    return lines


def write_summary(path: str, outcomes: list[Outcome] | None = None) -> None:
    outcomes = OUTCOMES if outcomes is None else outcomes
    records = [{"device": o.device, "opinfo": o.opinfo, "dtype": str(o.dtype).removeprefix("torch."),
                "sample": o.sample, "kind": o.kind, "detail": o.detail} for o in outcomes]
    with open(path, "w") as out:
        json.dump({"summary": summary_lines(outcomes), "samples": records}, out, indent=1)


def record_cuda_manifest(archs: list[str]) -> dict:
    """A prewarm manifest of the kernels the CUDA run of this suite compiles, forward and backward: the samples
    on meta tensors (which shape classes treat as CUDA tensors), recorded by jitops.record_calls().  Built by
    `python -m cache_tools prewarm --manifest`, it spares the GPU machine the compiles (the CUTLASS 3 GEMMs take
    about a minute each through nvcc)."""
    def meta(t: torch.Tensor) -> torch.Tensor:
        copy = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
        return copy.requires_grad_(t.requires_grad)

    with jitops.record_calls() as calls, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for opinfo, (name, call) in OPS.items():
            entry = _opinfo(opinfo)
            for dtype in CUDA_DTYPES:
                for sample in entry.reference_inputs("cpu", dtype, requires_grad=True):
                    args = _Sample(sample)
                    args.input, args.args, args.kwargs = (_map(v, meta) for v in (args.input, args.args, args.kwargs))
                    args.leaves = [t for t in _tensors([args.input, args.args, args.kwargs]) if t.requires_grad]
                    try:
                        out = call(args)
                        if args.leaves and out.requires_grad:
                            torch.autograd.grad(out, args.leaves, torch.ones_like(out), allow_unused=True)
                    except (TypeError, ValueError):  # the documented rejections: nothing to build
                        pass
    return calls.manifest(archs)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--cuda-manifest", metavar="FILE",
                        help="write the prewarm manifest of the CUDA run's kernels (sm_90a) to FILE and stop")
    options = parser.parse_args()
    if options.cuda_manifest:
        manifest = record_cuda_manifest(["sm_90a"])
        with open(options.cuda_manifest, "w") as out:
            json.dump(manifest, out, indent=1)
        print(f"{len(manifest['ops'])} calls -> {options.cuda_manifest}")
        raise SystemExit(0)
    device = options.device
    for opinfo in OPS:
        for dtype in CPU_DTYPES if device == "cpu" else CUDA_DTYPES:
            run_samples(opinfo, device, dtype)
    print("\n".join(summary_lines()))
    for o in OUTCOMES:
        if o.kind in ("wrong", "unclear", "fixed"):
            print(f"{o.kind}: {o.opinfo} {o.dtype} ({o.sample}): {o.detail}")
    if os.environ.get("JITOPS_OPINFO_SUMMARY"):
        write_summary(os.environ["JITOPS_OPINFO_SUMMARY"])
