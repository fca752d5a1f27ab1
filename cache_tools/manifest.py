"""Manifests, JITOPS_RECORD files and the built-in ops' PREWARM items -> the kernels to build.

A manifest item names one op, its dtypes and example calls (docs/cache_tools.md):
    {"op": "gelu", "dtypes": ["bf16", "fp16"], "shapes": [[[4096, 8192]]], "kwargs": {"approximate": "tanh"}}
Each entry of "shapes" is one call: the shapes of its tensor arguments in order (null for an absent optional
tensor, a list of shapes for a Tensor[] argument).  "strides" (parallel to "shapes") replays non-contiguous
calls; "archs" on an item overrides the manifest's.

"op" is a public op (what users call: layer_norm, grouped_gemm, gemm ...), and the item builds every kernel a
call of it can use: the no-grad path, the path that records a gradient, and that gradient's backward ("grad":
false or true keeps one path).  An item with "kernel_op" (the internal op the call reached, e.g.
layer_norm_backward) builds exactly that op's call: JITOPS_RECORD lines are such items, with "archs".  An
internal op's name as "op" means the same.

Everything is validated before anything is built: a bad item raises UsageError naming the file, the item and
what to change.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import jitops
from jitops import Target, native
from jitops.light_gemm import LIGHT_GEMM
from jitops.shapes import parse_dtype
from jitops.specs import BuildRequest

from .common import UsageError, normalize_arch, parse_archs

ITEM_KEYS = ("op", "kernel_op", "grad", "dtypes", "shapes", "kwargs", "strides", "archs")
MANIFEST_KEYS = ("archs", "ops")


class RejectedCalls(UsageError):
    """Calls the op's own checks reject: `reasons` has the op's reason for each call and arch."""

    def __init__(self, message: str, reasons: list[str]) -> None:
        super().__init__(message)
        self.reasons = reasons


@dataclass(frozen=True)
class Call:
    """One example call: one op, one dtype, one entry of "shapes"."""

    op: str                     # the public op
    dtype: str
    shapes: list[Any]
    kwargs: dict[str, Any]
    strides: list[Any] | None
    archs: tuple[str, ...]
    where: str                  # "m.json ops[2]" or "misses.jsonl:17", for messages
    kernel_op: str | None = None  # exactly this op's call (a JITOPS_RECORD line); None: everything op can use
    grad: bool | None = None      # only the path that records a gradient (True) or the one that does not (False)

    def item(self) -> dict[str, Any]:
        """This call as a manifest item (what JITOPS_RECORD would write for it, less the archs)."""
        item: dict[str, Any] = {"op": self.op}
        if self.kernel_op is not None:
            item["kernel_op"] = self.kernel_op
        if self.grad is not None:
            item["grad"] = self.grad
        item.update({"dtypes": [self.dtype], "shapes": [self.shapes], "kwargs": self.kwargs})
        if self.strides is not None:
            item["strides"] = [self.strides]
        return item

    def describe(self) -> str:
        text = self.op + (f" ({self.kernel_op})" if self.kernel_op and self.kernel_op != self.op else "")
        text += f" {self.dtype} {json.dumps(self.shapes)}"
        if self.kwargs:
            text += " " + " ".join(f"{k}={v}" for k, v in self.kwargs.items())
        if self.grad is not None:
            text += " with grad" if self.grad else " without grad"
        return text


@dataclass(frozen=True)
class Job:
    """One kernel to build: a request for one target, and the call that asks for it."""

    op: str               # the public op
    kernel_op: str        # the op whose call needs the kernel (layer_norm_backward)
    name: str             # the kernel's name in that op ("forward", "cpu", ...)
    request: BuildRequest
    target: Target
    arch: str             # the exact compile target (sm_90 for a portable kernel asked for sm_90a)
    shape_class: str
    call: Call
    item: dict[str, Any]  # that op's call as an exact manifest item (for JITOPS_RECORD and offline errors)

    @property
    def label(self) -> str:
        return self.request.label()


@dataclass
class Plan:
    jobs: list[Job]
    skipped: list[dict[str, str]]  # calls not built on a target: {"where", "call", "arch", "kind", "reason"}
    # calls that need no compiled kernel on a target (torch's code runs them there: grouped_gemm on sm_80, gemm on
    # the CPU): {"where", "call", "op", "arch"}.  Said, so that an item building nothing is not a mystery.
    no_kernel: list[dict[str, str]] = field(default_factory=list)

    def no_kernel_summary(self) -> str | None:
        """'grouped_gemm on cpu and sm_80, gemm on cpu: no compiled kernel needed there (torch's code runs them)'."""
        if not self.no_kernel:
            return None
        archs: dict[str, list[str]] = {}
        for item in self.no_kernel:
            found = archs.setdefault(item["op"], [])
            if item["arch"] not in found:
                found.append(item["arch"])
        parts = [f"{op} on {' and '.join(sorted(found))}" for op, found in archs.items()]
        return f"{', '.join(parts)}: no compiled kernel needed there (torch's code runs those calls)"


# ---- reading ---------------------------------------------------------------------------------------------------
def load_manifest(path: str | Path) -> list[Call]:
    """A JSON manifest, or YAML (.yaml/.yml) when PyYAML is installed."""
    path = Path(path)
    text = _read(path, "manifest")
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise UsageError(f"{path}: YAML manifests need PyYAML (pip install pyyaml, or jitops[yaml]); "
                             "or write the manifest as JSON") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise UsageError(f"{path}: not valid YAML: {exc}") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{path}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno} "
                             "(YAML manifests need a .yaml or .yml name)") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: a manifest is an object with an \"ops\" list, e.g. "
                         '{"archs": ["sm_90a"], "ops": [{"op": "gelu", "dtypes": ["bf16"], "shapes": [[[4096, 8192]]]}]}')
    _check_keys(data, MANIFEST_KEYS, f"{path}")
    if "ops" not in data:
        raise UsageError(f"{path}: the manifest has no \"ops\" list")
    if not isinstance(data["ops"], list):
        raise UsageError(f"{path}: \"ops\" must be a list of items, got {type(data['ops']).__name__}")
    archs = _archs(data.get("archs"), f"{path} \"archs\"")
    calls: list[Call] = []
    for index, item in enumerate(data["ops"]):
        calls += parse_item(item, archs, f"{path} ops[{index}]")
    return calls


def load_record(path: str | Path) -> list[Call]:
    """A JITOPS_RECORD file: one manifest item with "archs" per line."""
    path = Path(path)
    calls: list[Call] = []
    for number, line in enumerate(_read(path, "record file").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{where}: not a JSON object ({exc.msg}); a JITOPS_RECORD file has one JSON "
                             "object per line: fix or delete that line") from None
        calls += parse_item(item, (), where)
    return calls


def builtin_calls() -> list[Call]:
    """Every built-in op's common shape classes (jitops.ops.PREWARM, which each op module extends)."""
    from jitops.ops import PREWARM

    calls: list[Call] = []
    for index, item in enumerate(PREWARM):
        calls += parse_item(item, (), f"jitops.ops.PREWARM[{index}]")
    return calls


def parse_item(item: Any, archs: Sequence[str], where: str) -> list[Call]:
    """Validate one manifest item and expand it into calls (one per dtype and entry of "shapes")."""
    if not isinstance(item, dict):
        raise UsageError(f"{where}: an item is an object like "
                         '{"op": "gelu", "dtypes": ["bf16"], "shapes": [[[4096, 8192]]]}, '
                         f"got {type(item).__name__}")
    _check_keys(item, ITEM_KEYS, where)
    op, kernel_op = _resolve(item, where)
    grad = item.get("grad")
    if grad is not None and not isinstance(grad, bool):
        raise UsageError(f"{where}: \"grad\" must be true (only calls that record a gradient, and their "
                         "backward), false (only calls that do not) or absent (both)")
    if grad is not None and kernel_op is not None:
        raise UsageError(f"{where}: \"grad\" chooses among the calls of the public op {op}; an item naming "
                         f"{kernel_op} builds exactly that call: drop one of them")
    where = f"{where} ({op if kernel_op is None else kernel_op})"
    dtypes = item.get("dtypes")
    if not isinstance(dtypes, list) or not dtypes or not all(isinstance(d, str) for d in dtypes):
        raise UsageError(f"{where}: \"dtypes\" must be a non-empty list of names such as [\"bf16\", \"fp32\"]")
    for dtype in dtypes:
        try:
            parse_dtype(dtype)
        except ValueError as exc:
            raise UsageError(f"{where}: {str(exc).removeprefix('jitops: ')}") from None
    calls_shapes = item.get("shapes")
    if not isinstance(calls_shapes, list) or not calls_shapes:
        raise UsageError(f"{where}: \"shapes\" must be a non-empty list of calls, each a list of the tensor "
                         "arguments' shapes: [[[4096, 8192]]] is one call with one tensor")
    for number, shapes in enumerate(calls_shapes):
        _check_call_shapes(shapes, f"{where} shapes[{number}]", "shape")
    strides = item.get("strides")
    if strides is not None:
        if not isinstance(strides, list) or len(strides) != len(calls_shapes):
            raise UsageError(f"{where}: \"strides\" must be a list with one entry per call in \"shapes\"")
        for number, call_strides in enumerate(strides):
            if call_strides is not None:
                _check_call_shapes(call_strides, f"{where} strides[{number}]", "stride")
    kwargs = item.get("kwargs", {})
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict):
        raise UsageError(f"{where}: \"kwargs\" must be an object of the op's other arguments, e.g. "
                         '{"approximate": "tanh"}')
    item_archs = _archs(item.get("archs"), f"{where} \"archs\"") or tuple(archs)
    return [Call(op, dtype, shapes, dict(kwargs), strides[number] if strides else None, item_archs, where,
                 kernel_op, grad)
            for dtype in dtypes for number, shapes in enumerate(calls_shapes)]


def _resolve(item: dict[str, Any], where: str) -> tuple[str, str | None]:
    """(public op, exact op or None) of an item: {"op": "layer_norm"} is the public op; {"op": "layer_norm",
    "kernel_op": "layer_norm_backward"} and {"op": "layer_norm_backward"} the exact call of an internal op."""
    name, kernel_op = item.get("op"), item.get("kernel_op")
    if not isinstance(name, str) or not name:
        raise UsageError(f"{where}: \"op\" must name an op, e.g. \"gelu\" or \"layer_norm\"")
    if kernel_op is not None and (not isinstance(kernel_op, str) or not kernel_op):
        raise UsageError(f"{where}: \"kernel_op\" must name an op of {name}, e.g. \"layer_norm_backward\"")
    try:
        public = jitops.find_public(name)
        exact = jitops.find(kernel_op) if kernel_op is not None else None
    except ValueError as exc:
        missing = kernel_op if kernel_op is not None and "::" in kernel_op else name
        hint = "; an op declared in your own code needs --import MODULE (the module that declares it)" \
            if "::" in missing and not missing.startswith("jitops::") else ""
        raise UsageError(f"{where}: {str(exc).removeprefix('jitops: ')}{hint}") from None
    if exact is None and public.name != name.removeprefix("jitops::"):
        exact = jitops.find(name)  # an internal op named as "op"
    if exact is not None and exact not in public.ops:
        raise UsageError(f"{where}: \"kernel_op\" {kernel_op!r} is not an op of {public.name} (its ops: "
                         f"{', '.join(o.display_name for o in public.ops)})")
    return public.name, exact.display_name if exact is not None else None


def _read(path: Path, what: str) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        raise UsageError(f"{what} {path} not found") from None
    except IsADirectoryError:
        raise UsageError(f"{what} {path} is a directory, not a file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {what} {path}: {exc}") from None


def _check_keys(obj: dict[str, Any], allowed: Sequence[str], where: str) -> None:
    unknown = [k for k in obj if k not in allowed and not str(k).startswith("_")]
    if unknown:
        raise UsageError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; allowed: "
                         f"{', '.join(allowed)} (keys starting with _ are comments)")


def _archs(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
        raise UsageError(f"{where}: must be a list of archs such as [\"sm_90a\", \"cpu\"]")
    try:
        return tuple(parse_archs(value))
    except UsageError as exc:
        raise UsageError(f"{where}: {exc}") from None


def _is_dims(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                           for d in value)


def _check_call_shapes(shapes: Any, where: str, what: str) -> None:
    if not isinstance(shapes, list):
        raise UsageError(f"{where}: one call is a list of {what}s, one per tensor argument, e.g. "
                         "[[4096, 8192], [8192]]")
    for position, shape in enumerate(shapes):
        ok = shape is None or _is_dims(shape) or (isinstance(shape, list) and all(_is_dims(s) for s in shape))
        if not ok:
            raise UsageError(f"{where}: tensor argument {position} has {what} {json.dumps(shape)}; use a list of "
                             "non-negative integers, null for an absent optional tensor, or a list of those "
                             "lists for a Tensor[] argument")


# ---- planning --------------------------------------------------------------------------------------------------
def _with_native_host(jobs: dict[tuple[BuildRequest, str], Job]) -> None:
    """A plan with the light GEMM kernel (linear's, or conv2d's built with LIGHT_CONV) also builds the C++ host
    path (jitops/native.py), which runs that kernel's problems: a deployment image then has it too, and an offline
    process loads it instead of running every Linear and Conv2d through Python.  It is C++ for this machine's
    torch, built like the CPU kernels."""
    light = next((job for job in jobs.values() if job.request.kernel == LIGHT_GEMM.name), None)
    if light is None or not jitops.config.native_host:
        return
    request = native.HOST_PATH.bind()
    target = Target("cpu")
    jobs.setdefault((request, request.arch(target)),
                    Job(light.op, light.kernel_op, "host", request, target, request.arch(target), "the C++ host path",
                        light.call, light.item))


def plan(calls: Iterable[Call], arch_override: Sequence[str] = (), strict: bool = True) -> Plan:
    """The kernels `calls` need on their archs (or on `arch_override`), deduplicated.

    A call of a public op expands into every op call it can lead to (jitops.Public.calls: the no-grad path,
    the grad path and its backward); a call with kernel_op is that op's call alone.  A call an op has no
    implementation for on a target (gemm's CUTLASS kernels on cpu) is skipped.  A call the op rejects (fp16 on
    the CPU path) is an error when `strict` (a user's manifest: say it before building anything), and skipped
    otherwise (--all-builtin: the common classes are written for the GPU)."""
    jobs: dict[tuple[BuildRequest, str], Job] = {}
    skipped: list[dict[str, str]] = []
    no_kernel: list[dict[str, str]] = []
    errors: list[str] = []
    reasons: list[str] = []  # each error's reason alone, the op's words (explain prints them its own way)
    for call in calls:
        archs = list(arch_override) or list(call.archs)
        if not archs:
            raise UsageError(f"{call.where}: no arch to build for; give --arch (e.g. --arch sm_90a,cpu) or an "
                             "\"archs\" list in the manifest")
        public = jitops.find_public(call.op)
        if call.kernel_op is not None:
            entry, shapes, kwargs = jitops.find(call.kernel_op), call.shapes, call.kwargs
        else:
            try:
                entry, shapes, kwargs = public.form(call.shapes, call.kwargs)
            except ValueError as exc:
                reasons.append(str(exc).removeprefix('jitops: '))
                errors.append(f"{call.where}: {call.describe()}: {reasons[-1]}")
                continue
        for arch in archs:
            target = Target.parse(arch)
            where = {"where": call.where, "call": call.describe(), "arch": normalize_arch(arch)}
            if target.device_type not in entry.impls:
                skipped.append(dict(where, kind="no implementation",
                                    reason=f"{public.name} has no {target.device_type} implementation"))
                continue
            try:
                args = entry.example_args(call.dtype, shapes, kwargs, call.strides,
                                          device="cpu" if target.device_type == "cpu" else "meta")
                entry.shape_class(*args)  # the op's own checks, before anything derived from the call
                op_calls = [(entry, args)] if call.kernel_op is not None else public.calls(entry, args, call.grad)
                found = []
                for op_, op_args in op_calls:
                    if target.device_type in op_.impls:
                        found.append((op_, op_args, op_.requests_for(op_args, target), str(op_.shape_class(*op_args))))
            except Exception as exc:  # noqa: BLE001 - the op's own checks: TypeError, ValueError, KeyError...
                reason = str(exc).removeprefix("jitops: ") or type(exc).__name__
                if strict:
                    reasons.append(reason)
                    errors.append(f"{call.where}: {call.describe()} on {normalize_arch(arch)}: {reason}")
                else:
                    skipped.append(dict(where, kind="rejected", reason=reason))
                continue
            if not any(requests for _, _, requests, _ in found):
                no_kernel.append(dict(where, op=public.name))
            for op_, op_args, requests, shape_class in found:
                for name, request in requests.items():
                    key = (request, request.arch(target))
                    if key not in jobs:
                        jobs[key] = Job(public.name, op_.display_name, name, request, target, request.arch(target),
                                        shape_class, call, op_.manifest_item(op_args))
    _with_native_host(jobs)
    if errors:
        shown = errors[:20] + ([f"... and {len(errors) - 20} more"] if len(errors) > 20 else [])
        raise RejectedCalls("the op rejects these calls (nothing was built):\n  " + "\n  ".join(shown) +
                            "\nFix the items, or give such an item its own \"archs\" list.", reasons)
    return Plan(list(jobs.values()), skipped, no_kernel)
