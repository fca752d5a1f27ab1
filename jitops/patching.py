"""jitops.patch(model): swap jitops' ops into a model in place, and jitops.unpatch(model) to restore it.

    report = jitops.patch(model)                    # nn.Linear, transformers' Conv1D, nn.LayerNorm, RMSNorms,
                                                    # GELUs, nn.Conv2d
    print(report)                                   # what was swapped, what was fused, what was left alone and why
    jitops.unpatch(model)                           # the model as it was

How: each swapped module's class is replaced by a subclass whose forward calls jitops (`module.__class__`), so
parameters, buffers, names, hooks, weight tying and the state_dict stay exactly as they were, isinstance checks
still hold, and unpatch only puts the class back.  Where a Linear feeds a GELU inside one block (transformers'
GPT2MLP, BertIntermediate, ViTMLP/ViTIntermediate, timm's Mlp, two neighbours in an nn.Sequential), the pair
becomes one jitops.linear(..., activation="gelu" | "gelu_tanh") call and the GELU module passes its input through.

A swapped module still accepts every input its torch forward accepts: inputs jitops does not take (a dtype or
device it has no kernels for, conv2d's groups) run the original forward, and each such combination is logged once.
Under torch.autocast the inputs are cast as autocast would cast them for the torch op (linear and conv2d to the
autocast dtype, layer_norm to float32; an RMSNorm runs its own forward under autocast).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from .ops.conv2d import CPU_DTYPES as _CONV_CPU
from .ops.conv2d import CUDA_DTYPES as _CONV_CUDA
from .ops.conv2d import conv2d as _conv2d
from .ops.gelu import CPU_DTYPES as _GELU_CPU
from .ops.gelu import CUDA_DTYPES as _GELU_CUDA
from .ops.gelu import gelu as _gelu
from .ops.gemm_plan import CPU_DTYPES as _GEMM_CPU
from .ops.gemm_plan import CUDA_DTYPES as _GEMM_CUDA
from .ops.layer_norm import CPU_DTYPES as _LAYER_NORM_CPU
from .ops.layer_norm import CUDA_DTYPES as _LAYER_NORM_CUDA
from .ops.layer_norm import layer_norm as _layer_norm
from .ops.layer_norm import rms_norm as _rms_norm
from .ops.linear import linear as _linear

log = logging.getLogger("jitops")

OPS = ("linear", "layer_norm", "rms_norm", "gelu", "conv2d")

# What each op takes, by device kind; anything else runs the module's torch forward.
_LINEAR_DTYPES = {"cuda": frozenset(_GEMM_CUDA), "cpu": frozenset(_GEMM_CPU)}
_LAYER_NORM_DTYPES = {"cuda": frozenset(_LAYER_NORM_CUDA), "cpu": frozenset(_LAYER_NORM_CPU)}
_GELU_DTYPES = {"cuda": frozenset(_GELU_CUDA), "cpu": frozenset(_GELU_CPU)}
_CONV_DTYPES = {"cuda": frozenset(_CONV_CUDA), "cpu": frozenset(_CONV_CPU)}


# ---- the report -----------------------------------------------------------------------------------------------
_NOTHING = ("jitops.patch: nothing to swap: the model has no nn.Linear, Conv1D, nn.LayerNorm, RMSNorm, GELU or "
            "nn.Conv2d modules")

@dataclass
class Swapped:
    name: str       # the module's name in the model ("" for the model itself)
    kind: str       # its class, qualified ("torch.nn.Linear", "transformers.pytorch_utils.Conv1D")
    op: str         # what now runs: "jitops.linear", "jitops.linear + gelu_tanh", "jitops.layer_norm", ...


@dataclass
class LeftAlone:
    name: str
    kind: str
    reason: str


@dataclass
class PatchReport:
    """What jitops.patch did.  str(report) is a short table; the lists hold every module."""

    swapped: list[Swapped] = field(default_factory=list)
    fused: list[tuple[str, str, str]] = field(default_factory=list)  # (linear's name, GELU's name, activation)
    not_fused: list[tuple[str, str, str]] = field(default_factory=list)  # (linear's name, GELU's name, reason)
    left_alone: list[LeftAlone] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """Swapped modules per (kind, op)."""
        counts: dict[str, int] = {}
        for s in self.swapped:
            key = f"{s.kind} -> {s.op}"
            counts[key] = counts.get(key, 0) + 1
        return counts

    def __str__(self) -> str:
        if not self.swapped and not self.left_alone:
            return _NOTHING
        lines = [f"jitops.patch: {len(self.swapped)} modules swapped, {len(self.fused)} Linear+GELU pairs fused, "
                 f"{len(self.left_alone)} left alone"]
        lines += [f"  {n:4d} x {key}" for key, n in sorted(self.counts().items())]
        reasons: dict[tuple[str, str], list[str]] = {}
        for item in self.left_alone:
            reasons.setdefault((item.kind, item.reason), []).append(item.name or "<model>")
        for (kind, reason), names in sorted(reasons.items()):
            shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            lines.append(f"  left alone: {len(names)} x {kind} ({shown}): {reason}")
        for linear, act, reason in self.not_fused:
            lines.append(f"  not fused: {linear} + {act}: {reason}")
        return "\n".join(lines)


# ---- when a call falls back to the torch forward --------------------------------------------------------------
_fallbacks_logged: set[tuple] = set()


def _fall_back(module: nn.Module, why: str, *inputs: Any) -> None:
    """Log once per (class, reason, dtypes) that an input runs the original forward."""
    if torch.compiler.is_compiling():
        return
    key = (type(module).__name__, why, tuple(getattr(t, "dtype", None) for t in inputs))
    if key not in _fallbacks_logged:
        _fallbacks_logged.add(key)
        log.info("jitops.patch: %s runs its torch forward for %s", _original_class(type(module)).__name__, why)


_any_autocast = torch._C._is_any_autocast_enabled  # one C call; the per-device check reads x.device (0.3 us)


def _autocast_dtype(x: torch.Tensor) -> torch.dtype | None:
    if not _any_autocast():
        return None
    device = x.device.type
    if device in ("cuda", "cpu") and torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return None


def _device_kind(t: torch.Tensor) -> str | None:
    # Meta tensors stand for the GPU: jitops.record_calls() lists the kernels a model on meta will use there.
    return "cuda" if t.is_cuda or t.is_meta else "cpu" if t.is_cpu else None


# ---- forwards of the swapped classes --------------------------------------------------------------------------
# Each runs on every call of its module, so the common case (no autocast, a supported dtype) is a few attribute
# reads before the op; every other case is decided (and logged once) on the slow path.  (Under torch.compile an
# unaligned Linear is traced as torch's op by jitops.linear itself.)


def _linear_call(module: nn.Module, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 torch_forward: Callable[..., torch.Tensor], *torch_args: Any) -> torch.Tensor:
    activation = module.__dict__.get("_jitops_activation")
    if _any_autocast():
        cast = _autocast_dtype(x)
        if cast is not None:
            x, weight = x.to(cast), weight.to(cast)
            bias = bias.to(cast) if bias is not None else None
    dtype = x.dtype
    if weight.dtype is dtype and (bias is None or bias.dtype is dtype):
        if x.is_cuda or x.is_meta:
            if dtype in _LINEAR_DTYPES["cuda"]:
                return _linear(x, weight, bias, activation=activation)
        elif x.is_cpu and dtype in _LINEAR_DTYPES["cpu"]:
            return _linear(x, weight, bias, activation=activation)
    _fall_back(module, f"inputs of {dtype} (weight {weight.dtype}) on {x.device.type}", x, weight)
    y = torch_forward(module, *torch_args)
    if activation is not None:
        y = _ACTIVATE[activation](y)
    return y


def _linear_forward(self: nn.Module, input: torch.Tensor) -> torch.Tensor:
    return _linear_call(self, input, self.weight, self.bias, nn.Linear.forward, input)


def _conv1d_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    # transformers' Conv1D: x @ weight + bias with weight (in, out); weight.t() is read in place.
    return _linear_call(self, x, self.weight.t(), self.bias, _original_class(type(self)).forward, x)


def _layer_norm_forward(self: nn.Module, input: torch.Tensor) -> torch.Tensor:
    x, weight, bias = input, self.weight, self.bias
    if _autocast_dtype(x) is not None:  # autocast runs layer_norm in float32
        x = x.float()
        weight = weight.float() if weight is not None else None
        bias = bias.float() if bias is not None else None
    dtype = x.dtype
    if (weight is None or weight.dtype is dtype) and (bias is None or bias.dtype is dtype) and \
            dtype in _LAYER_NORM_DTYPES.get(_device_kind(x), ()):
        return _layer_norm(x, self.normalized_shape, weight, bias, self.eps)
    _fall_back(self, f"input of {x.dtype} with parameters of "
                     f"{weight.dtype if weight is not None else None} on {x.device.type}", x, weight)
    return nn.LayerNorm.forward(self, input)


def _rms_norm_forward(self: nn.Module, input: torch.Tensor) -> torch.Tensor:
    # nn.RMSNorm: F.rms_norm(x, normalized_shape, weight, eps); transformers' LlamaRMSNorm and its copies: the same
    # over the last dimension, eps in variance_epsilon.  Theirs rounds x * rstd to x's dtype before the weight;
    # jitops rounds once.
    # transformers' takes its statistics in float32 whatever x's dtype: a float64 x runs that forward.
    weight = self.weight
    dtype = input.dtype
    if not _any_autocast() and (weight is None or weight.dtype is dtype) and \
            dtype in _LAYER_NORM_DTYPES.get(_device_kind(input), ()):
        if not self.__dict__["_jitops_hf"]:
            return _rms_norm(input, self.normalized_shape, weight, self.eps)
        if dtype is not torch.float64:
            return _rms_norm(input, weight.shape, weight, self.variance_epsilon)
    _fall_back(self, f"input of {dtype} with a weight of {weight.dtype if weight is not None else None} on "
                     f"{input.device.type}, or autocast", input, weight)
    return _original_class(type(self)).forward(self, input)


def _gelu_forward(self: nn.Module, input: torch.Tensor) -> torch.Tensor:
    if input.dtype in _GELU_DTYPES.get(_device_kind(input), ()):
        return _gelu(input, self.__dict__["_jitops_approximate"])
    _fall_back(self, f"input of {input.dtype} on {input.device.type}", input)
    return _original_class(type(self)).forward(self, input)


def _fused_gelu_forward(self: nn.Module, input: torch.Tensor) -> torch.Tensor:
    return input  # the Linear before it applies the activation in its epilogue


def _conv2d_forward(self: nn.Module, input: torch.Tensor) -> torch.Tensor:
    x, weight, bias = input, self.weight, self.bias
    cast = _autocast_dtype(x)
    if cast is not None:
        x, weight = x.to(cast), weight.to(cast)
        bias = bias.to(cast) if bias is not None else None
    dtype = x.dtype
    if weight.dtype is dtype and (bias is None or bias.dtype is dtype) and x.dim() in (3, 4) and \
            dtype in _CONV_DTYPES.get(_device_kind(x), ()):
        return _conv2d(x, weight, bias, self.stride, self.__dict__["_jitops_padding"], self.dilation)
    _fall_back(self, f"input of {x.dtype}, {x.dim()}-D, on {x.device.type}", x, weight)
    return nn.Conv2d.forward(self, input)


_ACTIVATE = {"gelu": F.gelu, "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"), "relu": torch.relu}


# ---- recognising modules --------------------------------------------------------------------------------------
def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _display(cls: type) -> str:
    """How the report names a class: nn.Linear, transformers' Conv1D as transformers.pytorch_utils.Conv1D."""
    if cls.__module__.startswith("torch.nn.modules."):
        return f"nn.{cls.__qualname__}"
    return _qualname(cls)


# GELU module classes by qualified name -> the approximation they compute (same function; rounding may differ:
# transformers' NewGELU evaluates the tanh form in several torch ops, jitops in one kernel).
_GELU_KINDS = {
    "transformers.activations.GELUActivation": "none",
    "transformers.activations.NewGELUActivation": "tanh",
    "transformers.activations.GELUTanh": "tanh",
    "transformers.activations.PytorchGELUTanh": "tanh",
    "transformers.activations.FastGELUActivation": "tanh",
    "transformers.activations.AccurateGELUActivation": "tanh",
    "timm.layers.activations.GELU": "none",
    "timm.layers.activations.GELUTanh": "tanh",
}
_CONV1D = "transformers.pytorch_utils.Conv1D"
# Subclasses of nn.LayerNorm whose forward is F.layer_norm over the module's own attributes (when the predicate
# holds): timm's LayerNorm unless its apex "fast norm" path is on.
_LAYER_NORM_ALIKES = {"timm.layers.norm.LayerNorm": lambda m: not getattr(m, "_fast_norm", False)}
# transformers' RMSNorms whose forward is LlamaRMSNorm's: weight * (x * rsqrt(mean(x^2) + variance_epsilon)), the
# statistics in float32.  (Gemma's scales by 1 + weight: not here.)
_HF_RMS_NORMS = frozenset(f"transformers.models.{m}.modeling_{m}.{c}RMSNorm" for m, c in (
    ("llama", "Llama"), ("mistral", "Mistral"), ("qwen2", "Qwen2"), ("mixtral", "Mixtral")))
# Blocks whose forward runs `linear` then `act` on its result and nothing else reads the Linear's output.
_MLP_BLOCKS = {
    "transformers.models.gpt2.modeling_gpt2.GPT2MLP": ("c_fc", "act"),
    "transformers.models.bert.modeling_bert.BertIntermediate": ("dense", "intermediate_act_fn"),
    "transformers.models.roberta.modeling_roberta.RobertaIntermediate": ("dense", "intermediate_act_fn"),
    "transformers.models.vit.modeling_vit.ViTIntermediate": ("dense", "intermediate_act_fn"),
    "transformers.models.vit.modeling_vit.ViTMLP": ("fc1", "activation_fn"),
    "timm.layers.mlp.Mlp": ("fc1", "act"),
}


def _gelu_approximate(module: nn.Module) -> str | None:
    """The approximation of a GELU module jitops can run, or None if it is not one (or computes another
    function: QuickGELU, clipped GELUs)."""
    cls = type(module)
    if cls is nn.GELU:
        return module.approximate
    kind = _GELU_KINDS.get(_qualname(cls))
    if kind is not None and cls.forward is not nn.Module.forward:
        return kind
    return None


def _is_conv1d(module: nn.Module) -> bool:
    return _qualname(type(module)) == _CONV1D


def _plain(module: nn.Module, base: type) -> bool:
    """An instance of `base` (or a subclass that keeps its forward): a subclass with its own forward computes
    something else (quantized, LoRA, ...) and is left alone."""
    return isinstance(module, base) and type(module).forward is base.forward


def _conv2d_problem(module: nn.Conv2d) -> tuple[str | None, Any]:
    """(reason it cannot be swapped, padding to pass to jitops.conv2d)."""
    if module.groups != 1:
        return f"groups={module.groups}: jitops.conv2d has no grouped convolution", None
    if module.padding_mode != "zeros":
        return f"padding_mode={module.padding_mode!r}: jitops.conv2d pads with zeros only", None
    padding = module.padding
    if isinstance(padding, str):  # "same" (asymmetric where it must be) and "valid": jitops.conv2d takes them
        return None, padding
    return None, tuple(padding)


# ---- swapped classes ------------------------------------------------------------------------------------------
_PATCHED: dict[tuple[type, str], type] = {}


def _patched_class(cls: type, kind: str, forward: Callable[..., Any]) -> type:
    """A subclass of cls whose forward is jitops'; one per (class, kind), registered in this module so that
    pickling a patched model finds it."""
    key = (cls, kind)
    patched = _PATCHED.get(key)
    if patched is None:
        name = f"Jitops{kind}_{cls.__name__}"
        patched = type(name, (cls,), {"forward": forward, "_jitops_original": cls, "__module__": __name__})
        patched.__qualname__ = name
        globals()[name] = patched
        _PATCHED[key] = patched
    return patched


def _original_class(cls: type) -> type:
    return cls.__dict__.get("_jitops_original", cls)


def _is_patched(module: nn.Module) -> bool:
    return "_jitops_original" in type(module).__dict__


def _swap(module: nn.Module, kind: str, forward: Callable[..., Any], **state: Any) -> None:
    module.__class__ = _patched_class(type(module), kind, forward)
    module.__dict__.update({f"_jitops_{k}": v for k, v in state.items()})


# ---- compiling a step's kernels together ----------------------------------------------------------------------
@dataclass
class PrefetchReport:
    kernels: int = 0          # kernels the step uses (one per op, shape class and kernel name)
    submitted: int = 0        # of which were not loaded yet and went to the compile pool
    seconds: float = 0.0      # the meta pass plus, in blocking mode, the wait for the pool
    skipped: str | None = None  # why nothing was done, if so


_MAX_PREFETCHED_SIGNATURES = 8


def prefetch(model: nn.Module, *args: Any, wait: bool | None = None, **kwargs: Any) -> PrefetchReport:
    """Compile every kernel a forward (and, with gradients on, a backward) of `model` on these inputs will use,
    all at once in the worker pool, instead of one at a time as the calls arrive: a pass of the model on meta
    tensors (torch.func.functional_call with meta parameters: no memory, nothing launched) lists the jitops calls
    and their shape classes first.  wait: block until they are ready (default: in blocking mode, yes; with
    JITOPS_COMPILE=background, no).  jitops.patch does this on a model's first call for each new input shape.
    Any failure of the meta pass (model code that needs real data) only means nothing is prefetched."""
    import time

    from torch.func import functional_call

    from .config import config
    from .launch import ensure_context
    from .op import record_calls
    from .runtime import runtime

    report = PrefetchReport()
    if config.offline:
        report.skipped = "offline mode compiles nothing"
        return report
    started = time.perf_counter()
    first = next(model.parameters(), None)
    if first is None or not first.is_cuda:
        # The meta pass stands for the GPU (meta tensors meet the CUDA dtype rules); CPU kernels are few and
        # compile as they are called.
        report.skipped = "the model's parameters are not on a GPU"
        return report
    device_type, device_index = "cuda", first.get_device()

    def to_meta(t: Any) -> Any:
        if isinstance(t, torch.Tensor) and not t.is_meta:
            meta = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
            return meta.requires_grad_(t.requires_grad) if t.is_floating_point() else meta
        return t

    tensors = {n: to_meta(p) for n, p in model.named_parameters()}
    tensors.update({n: to_meta(b) for n, b in model.named_buffers()})
    meta_args = torch.utils._pytree.tree_map(to_meta, args)
    meta_kwargs = torch.utils._pytree.tree_map(to_meta, kwargs)
    model.__dict__["_jitops_in_prefetch"] = True
    try:
        with record_calls() as calls:
            out = functional_call(model, tensors, meta_args, meta_kwargs, tie_weights=True, strict=False)
            leaves = [t for t in torch.utils._pytree.tree_leaves(out)
                      if isinstance(t, torch.Tensor) and t.requires_grad]
            if leaves and torch.is_grad_enabled():
                torch.autograd.backward(leaves, [torch.ones_like(t) for t in leaves])
    except Exception as exc:  # noqa: BLE001 - model code that needs real data: calls compile as they come
        report.skipped = f"the meta pass failed: {type(exc).__name__}: {exc}"
        log.debug("jitops.prefetch: %s", report.skipped)
        return report
    finally:
        model.__dict__.pop("_jitops_in_prefetch", None)
    futures = []
    for op, shape_class, item in calls.classes:
        impl = op.impls.get(device_type)
        if impl is None:
            continue
        target = op.target(device_type, device_index)
        context = op.miss_context(shape_class, item)
        for request in impl.kernels(shape_class, target).values():
            report.kernels += 1
            if runtime.get_kernel(request, target, device_index, context, build=False) is None:
                futures.append(runtime.submit(request, target, device_index, context,
                                              lambda: ensure_context(device_index)))
    report.submitted = len(futures)
    if futures:
        log.info("jitops.prefetch: compiling %d kernels for this step, %d at a time", len(futures), config.jobs)
        if wait if wait is not None else config.compile_mode == "blocking":
            import concurrent.futures

            concurrent.futures.wait(futures)
    report.seconds = time.perf_counter() - started
    return report


def _prefetch_hook(model: nn.Module, args: tuple, kwargs: dict) -> None:
    """A patched model's forward pre-hook: prefetch once per new input signature (up to a few)."""
    if "_jitops_in_prefetch" in model.__dict__ or torch.compiler.is_compiling():
        return
    signature = tuple((tuple(t.shape), t.dtype) for t in torch.utils._pytree.tree_leaves((args, kwargs))
                      if isinstance(t, torch.Tensor))
    seen = model.__dict__.setdefault("_jitops_prefetched", set())
    if signature in seen or len(seen) >= _MAX_PREFETCHED_SIGNATURES:
        return
    seen.add(signature)
    if any(isinstance(t, torch.Tensor) and t.is_meta for t in torch.utils._pytree.tree_leaves((args, kwargs))):
        return
    prefetch(model, *args, **kwargs)


# ---- patch / unpatch ------------------------------------------------------------------------------------------
def patch(model: nn.Module, ops: Iterable[str] = OPS, *, fuse: bool = True, prefetch: bool = True) -> PatchReport:
    """Swap jitops into `model` in place; returns a PatchReport (print it).  `ops` chooses among "linear"
    (nn.Linear and transformers' Conv1D), "layer_norm", "rms_norm" (nn.RMSNorm and transformers' LlamaRMSNorm and
    its copies), "gelu" and "conv2d"; fuse=False keeps Linear and GELU
    apart.  prefetch: on the model's first call with each new input shape, compile every kernel of the step at
    once (jitops.prefetch).  Patching twice is harmless; jitops.unpatch(model) restores the model."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"jitops.patch: argument 'model' must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(ops, str):
        ops = (ops,)
    ops = tuple(ops)
    unknown = [o for o in ops if o not in OPS]
    if unknown:
        raise ValueError(f"jitops.patch: argument 'ops' names {unknown}; choose among {list(OPS)}")
    report = PatchReport()
    modules = list(model.named_modules(remove_duplicate=False))
    uses: dict[int, int] = {}
    for _, m in modules:
        uses[id(m)] = uses.get(id(m), 0) + 1
    seen: set[int] = set()
    fused_gelus: set[int] = set()
    if fuse and "linear" in ops and "gelu" in ops:
        for name, block in modules:
            for linear_name, act_name, linear, act in _mlp_pairs(block):
                reason = _fusion_problem(linear, act, uses)
                full = (f"{name}.{linear_name}" if name else linear_name, f"{name}.{act_name}" if name else act_name)
                if reason is not None:  # each is still swapped on its own below
                    if type(block) is not nn.Sequential or reason != _NOT_A_PAIR:
                        report.not_fused.append((*full, reason))
                    continue
                activation = "gelu" if _gelu_approximate(act) == "none" else "gelu_tanh"
                linear.__dict__["_jitops_activation"] = activation
                fused_gelus.add(id(act))
                report.fused.append((*full, activation))
    for name, m in modules:
        if id(m) in seen:
            continue
        seen.add(id(m))
        kind = _display(_original_class(type(m)))
        if _is_patched(m):
            report.left_alone.append(LeftAlone(name, kind, "already patched"))
            continue
        swapped = _patch_one(m, ops, id(m) in fused_gelus)
        if swapped is None:
            continue
        if swapped.startswith("jitops."):
            report.swapped.append(Swapped(name, kind, swapped))
        else:
            m.__dict__.pop("_jitops_activation", None)
            report.left_alone.append(LeftAlone(name, kind, swapped))
    if prefetch and report.swapped and "_jitops_prefetch_hook" not in model.__dict__:
        model.__dict__["_jitops_prefetch_hook"] = model.register_forward_pre_hook(_prefetch_hook, with_kwargs=True)
    if not report.swapped:
        log.warning("%s", report if report.left_alone else _NOTHING)
    return report


def _patch_one(m: nn.Module, ops: tuple[str, ...], fused_away: bool) -> str | None:
    """Swap one module; returns the jitops op now running, a reason it was left alone, or None when it is no
    kind jitops replaces (or of a kind not asked for)."""
    if _plain(m, nn.Linear) or _is_conv1d(m):
        if "linear" not in ops:
            return None
        activation = m.__dict__.get("_jitops_activation")
        if _is_conv1d(m):
            if type(m).forward is not _original_class(type(m)).forward or m.weight.dim() != 2:
                return "Conv1D with an unexpected forward or weight"
            _swap(m, "Conv1D", _conv1d_forward)
        else:
            _swap(m, "Linear", _linear_forward)
        if activation is not None:
            m.__dict__["_jitops_activation"] = activation
        return "jitops.linear" + (f" + {activation}" if activation else "")
    if isinstance(m, nn.Linear):
        return "a subclass of nn.Linear with its own forward" if "linear" in ops else None
    alike = _LAYER_NORM_ALIKES.get(_qualname(type(m)))
    if _plain(m, nn.LayerNorm) or (alike is not None and alike(m)):
        if "layer_norm" not in ops:
            return None
        _swap(m, "LayerNorm", _layer_norm_forward)
        return "jitops.layer_norm"
    if isinstance(m, nn.LayerNorm):
        return "a subclass of nn.LayerNorm with its own forward" if "layer_norm" in ops else None
    hf_rms = _qualname(type(m)) in _HF_RMS_NORMS
    if hf_rms or _plain(m, nn.RMSNorm):
        if "rms_norm" not in ops:
            return None
        weight = getattr(m, "weight", None)
        if hf_rms and not (isinstance(weight, torch.Tensor) and weight.dim() == 1 and
                           isinstance(getattr(m, "variance_epsilon", None), float)):
            return "an RMSNorm without a 1-D weight and a float variance_epsilon"
        _swap(m, "RMSNorm", _rms_norm_forward, hf=hf_rms)
        return "jitops.rms_norm"
    if isinstance(m, nn.RMSNorm):
        return "a subclass of nn.RMSNorm with its own forward" if "rms_norm" in ops else None
    approximate = _gelu_approximate(m)
    if approximate is not None:
        if "gelu" not in ops:
            return None
        if fused_away:
            _swap(m, "FusedGELU", _fused_gelu_forward)
            return "jitops.linear's epilogue (fused into the Linear before it)"
        _swap(m, "GELU", _gelu_forward, approximate=approximate)
        return "jitops.gelu"
    if _plain(m, nn.Conv2d):
        if "conv2d" not in ops:
            return None
        problem, padding = _conv2d_problem(m)
        if problem is not None:
            return problem
        _swap(m, "Conv2d", _conv2d_forward, padding=padding)
        return "jitops.conv2d"
    if isinstance(m, nn.Conv2d):
        return "a subclass of nn.Conv2d with its own forward" if "conv2d" in ops else None
    return None


def _mlp_pairs(block: nn.Module):
    """(linear's attribute, act's attribute, linear, act) pairs inside `block` whose linear output goes
    straight into the act and nowhere else."""
    qualname = _qualname(type(block))
    names = _MLP_BLOCKS.get(qualname)
    if names is not None and type(block).forward is type(block).__dict__.get("forward", None):
        linear, act = getattr(block, names[0], None), getattr(block, names[1], None)
        if isinstance(linear, nn.Module) and isinstance(act, nn.Module):
            yield names[0], names[1], linear, act
    if type(block) is nn.Sequential:
        children = list(block.named_children())
        for (n1, m1), (n2, m2) in zip(children, children[1:]):
            yield n1, n2, m1, m2


_NOT_A_PAIR = "not a Linear followed by a GELU jitops computes"


def _fusion_problem(linear: nn.Module, act: nn.Module, uses: dict[int, int]) -> str | None:
    if not (_plain(linear, nn.Linear) or _is_conv1d(linear)) or _gelu_approximate(act) is None:
        return _NOT_A_PAIR
    if uses.get(id(act), 0) > 1 or uses.get(id(linear), 0) > 1:
        return "the module is used in more than one place"
    if linear._forward_hooks or linear._forward_pre_hooks or act._forward_hooks or act._forward_pre_hooks:
        return "forward hooks would see the fused values"
    if "_jitops_activation" in linear.__dict__:
        return "already fused"
    return None


def unpatch(model: nn.Module) -> int:
    """Undo jitops.patch: every swapped module gets its class back.  Returns how many were restored."""
    restored = 0
    hook = model.__dict__.pop("_jitops_prefetch_hook", None)
    if hook is not None:
        hook.remove()
    model.__dict__.pop("_jitops_prefetched", None)
    for m in model.modules():
        if _is_patched(m):
            m.__class__ = _original_class(type(m))
            for key in [k for k in m.__dict__ if k.startswith("_jitops_")]:
                del m.__dict__[key]
            restored += 1
        else:
            m.__dict__.pop("_jitops_activation", None)
    return restored


__all__ = ["patch", "unpatch", "prefetch", "PatchReport", "PrefetchReport", "Swapped", "LeftAlone", "OPS"]
