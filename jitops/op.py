"""One way to declare an op, for jitops' own ops and for users' (a notebook cell is enough).

    scaled_add = jitops.op(
        "mylib::scaled_add(Tensor x, Tensor y, float alpha) -> Tensor",
        shape_class=lambda x, y, alpha: ScaledAddClass(jitops.cuda_type(x.dtype)),
        cuda=jitops.Impl(kernels=lambda cls, target: {"add": KERNEL.bind(T=cls.T)}, run=run_cuda),
        fake=lambda x, y, alpha: torch.empty_like(x),
        setup_context=..., backward=...,
    )

The declaration is registered once with torch.library (so autograd, torch.compile(fullgraph=True) and
torch.library.opcheck see a real op) and returns the public Python function.

Routes.  Going through the dispatcher costs 8.5 us a call with a Python kernel, 13.7 us once an autograd
kernel is registered, 10.6 us as an autograd.Function, where torch.add costs 6.4 us (H100).
So the public function, generated per op:
  - compiling, a torch function/dispatch mode, the profiler, or a tensor subclass -> torch.ops.<ns>.<name>;
  - a gradient to record -> the op's own autograd.Function (same setup_context and backward as registered);
  - otherwise -> the device implementation directly (7.7 us in the same probe).
"""
from __future__ import annotations

import contextlib
import inspect
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Sequence

import torch

from .config import config
from .launch import ensure_context
from .runtime import MissContext, runtime, stats
from .shapes import dtype_name, parse_dtype
from .specs import BuildRequest, Target

log = logging.getLogger("jitops")

KernelsFn = Callable[[Any, Target], Mapping[str, BuildRequest]]


class Impl(NamedTuple):
    """A device implementation: which kernels a shape class needs, and how to run them.

    kernels(shape_class, target) -> {name: BuildRequest};  run(kernels, *args) -> outputs
    where `kernels` holds the loaded kernels as attributes (kernels.forward(...))."""

    kernels: KernelsFn
    run: Callable[..., Any]


class Kernels:
    """The loaded kernels of one shape class on one device, as attributes; `.shape_class` is the class."""

    def __init__(self, loaded: Mapping[str, Any], shape_class: Any) -> None:
        self.__dict__.update(loaded)
        self.shape_class = shape_class

    def __repr__(self) -> str:
        return f"Kernels({', '.join(k for k in self.__dict__ if k != 'shape_class')})"


@dataclass(frozen=True)
class _Arg:
    name: str
    kind: str          # "tensor", "optional_tensor", "tensor_list" or "value"
    kwarg_only: bool
    has_default: bool
    default: Any
    dtype: bool = False  # a ScalarType argument: manifests name it ("bf16")


_REGISTRY: dict[str, "Op"] = {}

# Routes of a call (see Op._route).
_DIRECT, _EAGER_AUTOGRAD, _DISPATCHER = 0, 1, 2
_STRIDED = torch.strided
_is_compiling = torch.compiler.is_compiling
_function_mode = torch._C._is_torch_function_mode_enabled
_dispatch_stack = torch._C._len_torch_dispatch_stack
_profiling = torch.autograd._profiler_enabled


def dispatcher_wanted() -> bool:
    """Whether a call now belongs in torch's dispatcher (torch.compile tracing, a torch function or dispatch
    mode, the profiler): what every generated public function checks first, for code with a fast path of its
    own (jitops.linear's C++ host path) to check the same way."""
    return _is_compiling() or _function_mode() or _dispatch_stack() > 0 or _profiling()


_current_device = getattr(torch._C, "_cuda_getDevice", lambda: -1)
_C_APPLY = torch._C._FunctionBase.__dict__["apply"]  # autograd.Function's C apply, a classmethod descriptor


class _KernelsSlot(threading.local):
    # Set by a public function just before its autograd.Function's apply, read by forward: the loaded kernels
    # and the run function of their device's implementation.
    kernels: Any = None
    run: Any = None


_kernels_slot = _KernelsSlot()


def _kind(arg: torch._C.Argument) -> str:
    """Classify by torch's type objects, not their printed names (Tensor? prints as Optional[Tensor])."""
    t = arg.type
    if isinstance(t, torch.TensorType):
        return "tensor"
    if isinstance(t, torch.OptionalType) and isinstance(t.getElementType(), torch.TensorType):
        return "optional_tensor"
    if isinstance(t, torch.ListType) and isinstance(t.getElementType(), torch.TensorType):
        return "tensor_list"
    return "value"


def _is_dtype(arg: torch._C.Argument) -> bool:
    """ScalarType arguments print as int; their real_type names them."""
    return "ScalarType" in str(getattr(arg, "real_type", arg.type))


def _parse_arguments(schema: torch._C.FunctionSchema) -> list[_Arg]:
    args = []
    for a in schema.arguments:
        has_default = a.default_value is not None or a.has_default_value()
        args.append(_Arg(a.name, _kind(a), a.kwarg_only, has_default, a.default_value, _is_dtype(a)))
    return args


class Op:
    """A declared op.  Call it like a function; `.overload` is the torch.ops OpOverload."""

    def __init__(self, schema: str, *, shape_class: Callable[..., Any], fake: Callable[..., Any],
                 cuda: Impl | None = None, cpu: Impl | None = None,
                 setup_context: Callable[..., None] | None = None, backward: Callable[..., Any] | None = None,
                 keyword_only: Sequence[str] = (), doc: str | None = None,
                 fallback: Callable[..., Any] | None = None,
                 companions: Callable[..., Sequence[tuple[Any, tuple[Any, ...]]]] | None = None,
                 coerce: Callable[..., tuple] | None = None) -> None:
        qualname, _, signature = schema.partition("(")
        namespace, _, name = qualname.rpartition("::")
        self.namespace = namespace or "jitops"
        self.name = name
        self.qualname = f"{self.namespace}::{name}"
        self.schema_text = f"{name}({signature}"
        self.schema = torch._C.parse_schema(f"{self.qualname}({signature}")
        self.args = _parse_arguments(self.schema)
        if any(a.kwarg_only for a in self.args):
            # torch's register_autograd differentiates positional arguments only.
            raise ValueError(f"jitops.op {self.qualname}: declare every argument positionally in the schema and "
                             "name the ones that should be keyword-only in Python with keyword_only=(...)")
        unknown = set(keyword_only) - {a.name for a in self.args}
        if unknown:
            raise ValueError(f"jitops.op {self.qualname}: keyword_only names unknown arguments {sorted(unknown)}")
        self.keyword_only = tuple(keyword_only)
        self.shape_class = shape_class
        self.fake = fake
        self.impls: dict[str, Impl] = {k: v for k, v in (("cuda", cuda), ("cpu", cpu)) if v is not None}
        self.setup_context, self.backward = setup_context, backward
        # fallback(k, *args) -> the same outputs through torch's own ops, called like run with no kernels in k
        # (only k.shape_class): what a call runs while its kernels compile in the background
        # (JITOPS_COMPILE=background).  Ops without one always wait for their kernels.
        self.fallback = fallback
        # coerce(*args) -> args: what an op takes in a tensor's place besides a tensor (jitops.add: Python
        # numbers, as torch.add), turned into tensors.  Called first on calls whose tensor arguments are not all
        # plain tensors, and on the dispatcher route; never on the common call.
        self.coerce = coerce
        self._pending: dict[tuple[int, Any], list[Any]] = {}  # (device, class) -> background compiles
        self.companions = companions
        # The public op this one belongs to (jitops.public() sets it for internal ops), and whether its
        # arguments are that public function's (then its errors name the public function).
        self.public = self.display_name
        self.is_entry = True
        self.__doc__ = doc
        self._memo: dict[tuple[int, Any], Kernels] = {}
        self._targets: dict[int, Target] = {}
        self._tensor_positions = [i for i, a in enumerate(self.args) if a.kind == "tensor"]
        self._optional_positions = [i for i, a in enumerate(self.args) if a.kind == "optional_tensor"]
        self._list_positions = [i for i, a in enumerate(self.args) if a.kind == "tensor_list"]
        self._differentiable = [i for i, a in enumerate(self.args) if a.kind != "value"]
        self._plain = bool(self._tensor_positions) and not self._list_positions
        self._cuda = self.impls.get("cuda")
        self._cpu = self.impls.get("cpu")
        self._autograd = self._make_autograd_function()
        self._register()
        self.function = self._make_function()

    # ---- registration with torch.library -------------------------------------------------------------------
    def _register(self) -> None:
        previous = _REGISTRY.get(self.qualname)
        if previous is not None:  # re-running a notebook cell: replace the old registration
            previous._library._destroy()
            previous._memo.clear()
        self._library = torch.library.Library(self.namespace, "FRAGMENT")
        self._library.define(self.schema_text, tags=(torch.Tag.pt2_compliant_tag,))
        for device_type in self.impls:
            key = "CUDA" if device_type == "cuda" else "CPU"
            self._library.impl(self.name, self._from_dispatcher, key)
        torch.library.register_fake(self.qualname, self._fake_from_dispatcher, lib=self._library)
        if self.backward is not None:
            if self.setup_context is None:
                raise TypeError(f"jitops.op {self.qualname}: a backward needs a setup_context")
            torch.library.register_autograd(self.qualname, self._backward, setup_context=self._setup_context,
                                            lib=self._library)
        self.overload = getattr(getattr(torch.ops, self.namespace), self.name).default
        _REGISTRY[self.qualname] = self

    def _positional(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
        """All arguments in schema order: the dispatcher may pass some as keywords and omit defaulted ones."""
        if not kwargs and len(args) == len(self.args):
            return args
        values = list(args)
        for a in self.args[len(args):]:
            values.append(kwargs[a.name] if a.name in kwargs else a.default)
        return tuple(values)

    def _from_dispatcher(self, *args: Any, **kwargs: Any) -> Any:
        return self._run_device(self._positional(args, kwargs))

    def _fake_from_dispatcher(self, *args: Any, **kwargs: Any) -> Any:
        args = self._positional(args, kwargs)
        self._check_devices(args)
        self.shape_class(*args)  # the same input checks as a real call, at trace time
        return self.fake(*args)

    def _setup_context(self, ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        self._pad_needs_input_grad(ctx)
        self.setup_context(ctx, inputs, output)  # type: ignore[misc]

    def _pad_needs_input_grad(self, ctx: Any) -> None:
        """The dispatcher omits trailing defaulted arguments (conv2d(x, w) for conv2d(x, w, bias=None)), and
        needs_input_grad then has fewer entries than the schema has arguments: ops index it by schema position
        (conv2d's backward read needs_input_grad[2] and raised IndexError under the profiler)."""
        needs = ctx.needs_input_grad
        if len(needs) < len(self.args):
            ctx.needs_input_grad = tuple(needs) + (False,) * (len(self.args) - len(needs))

    def _backward(self, ctx: Any, *grads: Any) -> tuple[Any, ...]:
        """The op's backward returns one gradient per Tensor/Tensor?/Tensor[] argument, in order; non-tensor
        arguments get None here, and so does every input that does not need a gradient."""
        self._pad_needs_input_grad(ctx)
        tensor_grads = self._tensor_grads(self.backward(ctx, *grads))  # type: ignore[misc]
        result: list[Any] = [None] * len(self.args)
        # Omitted trailing arguments (see _pad_needs_input_grad) are no inputs and need no gradient; the surplus
        # Nones returned are allowed.
        needs = ctx.needs_input_grad
        for position, grad in zip(self._differentiable, tensor_grads):
            if needs[position]:
                result[position] = grad
        return tuple(result)

    # ---- the public function -------------------------------------------------------------------------------
    def _make_function(self) -> Callable[..., Any]:
        """A real Python function with the schema's signature (names, defaults, keyword-only arguments)."""
        params, defaults, kwdefaults = [], [], {}
        star_done = False
        for a in self.args:
            keyword = a.name in self.keyword_only
            if keyword and not star_done:
                params.append("*")
                star_done = True
            elif star_done and not keyword:
                raise ValueError(f"jitops.op {self.qualname}: keyword_only arguments must come last in the schema")
            params.append(a.name)
            if a.has_default:
                if keyword:
                    kwdefaults[a.name] = a.default
                else:
                    defaults.append(a.default)
        source = f"def {self.name}({', '.join(params)}):\n" + self._hot_path_body()
        namespace: dict[str, Any] = {
            "__call": self._call, "__run_device": self._run_device, "__overload": self.overload,
            "__shape_class": self.shape_class, "__memo": self._memo, "__stats": stats,
            "__run": self._cuda.run if self._cuda else None, "__cpu_run": self._cpu.run if self._cpu else None,
            "__Tensor": torch.Tensor,
            "__Parameter": torch.nn.Parameter, "__strided": _STRIDED, "__is_compiling": _is_compiling,
            "__function_mode": _function_mode, "__dispatch_stack": _dispatch_stack, "__profiling": _profiling,
            "__grad_enabled": torch.is_grad_enabled, "__current_device": _current_device, "__several": True,
            "__grad_call": self._autograd.apply if self._autograd is not None else self.overload,
            "__functorch": torch._C._are_functorch_transforms_active, "__slot": _kernels_slot,
            "__capply": _C_APPLY.__get__(None, self._autograd) if self._autograd is not None else None,
            "__coerce": self.coerce}
        exec(compile(source, f"<jitops op {self.qualname}>", "exec"), namespace)  # noqa: S102 - generated
        self._hot_globals = namespace
        function = namespace[self.name]
        function.__defaults__ = tuple(defaults) or None
        function.__kwdefaults__ = kwdefaults or None
        function.__doc__ = self.__doc__
        function.__qualname__ = function.__name__ = self.name
        function.__module__ = "jitops"
        function.op = self  # type: ignore[attr-defined]
        return function

    def _hot_path_body(self) -> str:
        """The public function's body.  Every call pays for it, so it is generated with the argument positions
        unrolled, in one frame: plain dense tensors all on the current GPU or all on the CPU, no mode, not
        compiling, a shape class already loaded -> straight to the device implementation (through the op's
        autograd.Function's C apply when a gradient is to be recorded).  Anything else takes self._call.
        (Each torch attribute read costs ~0.07 us and each Python call ~0.1 us on the dev box; the budget for
        all of jitops' own work is ~2 us a call: benchmarks/bench_jit_latency.py.)"""
        names = [a.name for a in self.args]
        everything = ", ".join(names)
        if not self._plain or (self._cuda is None and self._cpu is None):
            return f"    return __call({everything})\n"
        required = [self.args[i].name for i in self._tensor_positions]
        optional = [self.args[i].name for i in self._optional_positions]
        first = required[0]
        not_plain = [f"(type({n}) is not __Tensor and type({n}) is not __Parameter)" for n in required] + \
            [f"({n} is not None and type({n}) is not __Tensor and type({n}) is not __Parameter)" for n in optional]
        grads = [f"{n}.requires_grad" for n in required] + [f"({n} is not None and {n}.requires_grad)"
                                                             for n in optional]
        elsewhere = [f"{first}.layout is not __strided"] + \
            [f"{n}.get_device() != __i or {n}.layout is not __strided" for n in required[1:]] + \
            [f"({n} is not None and ({n}.get_device() != __i or {n}.layout is not __strided))" for n in optional]
        # get_device() is -1 on the CPU and on the meta device alike: is_cpu tells them apart (a meta tensor, or
        # one CPU tensor among meta ones, takes the general path).
        not_cpu = [f"not {first}.is_cpu or {first}.layout is not __strided"] + \
            [f"not {n}.is_cpu or {n}.layout is not __strided" for n in required[1:]] + \
            [f"({n} is not None and (not {n}.is_cpu or {n}.layout is not __strided))" for n in optional]
        slow = f"__run_device(({everything},))"
        if self._autograd is not None:
            # With a gradient to record: the autograd.Function through its C apply (Function.apply's Python
            # wrapper unwraps functorch wrappers over every argument first: 2.6 us of a 31 us call on the dev
            # box), the kernels found here and their run function handed to its forward through a thread-local
            # slot, so the forward does not look them up again.
            def with_grad(run: str) -> str:
                return (f"        if __functorch():\n"
                        f"            return __grad_call({everything})\n"
                        f"        __slot.kernels = __k\n"
                        f"        __slot.run = {run}\n"
                        f"        return __capply({everything})\n")
            # Other calls with a gradient (a first call, another GPU): the C apply too, the forward finding the
            # kernels itself (the slot is empty).
            slow_grad = f"(__grad_call({everything}) if __functorch() else __capply({everything}))"
        else:
            def with_grad(run: str) -> str:
                return f"        return __grad_call({everything})\n"
            slow_grad = f"__grad_call({everything})"
        to_dispatcher = f"__overload(*__coerce({everything}))" if self.coerce else f"__overload({everything})"
        body = (
            f"    if __is_compiling() or __function_mode() or __dispatch_stack() or __profiling():\n"
            f"        return {to_dispatcher}\n"
            f"    if {' or '.join(not_plain)}:\n"
            f"        return __call({everything})\n"
            f"    __grad = __grad_enabled() and ({' or '.join(grads)})\n"
            f"    __i = {first}.get_device()\n")
        if self._cpu is not None:
            # CPU tensors: the same memo (device index -1) and the CPU implementation's run.
            body += (
                f"    if __i < 0:\n"
                f"        if {' or '.join(not_cpu)}:\n"
                f"            return {slow_grad} if __grad else {slow}\n"
                f"        __k = __memo.get((-1, __shape_class({everything})))\n"
                f"        if __k is None:\n"
                f"            return {slow_grad} if __grad else {slow}\n"
                f"        if __grad:\n"
                + "\n".join("    " + line for line in with_grad("__cpu_run").splitlines()) + "\n"
                f"        __stats.memory_hits += 1\n"
                f"        return __cpu_run(__k, {everything})\n")
        if self._cuda is None:
            return body + f"    return {slow_grad} if __grad else {slow}\n"
        if self._cpu is None:
            elsewhere.insert(0, "__i < 0")
        return body + (
            f"    if {' or '.join(elsewhere)} or (__several and __i != __current_device()):\n"
            f"        return {slow_grad} if __grad else {slow}\n"
            f"    __k = __memo.get((__i, __shape_class({everything})))\n"
            f"    if __k is None:\n"
            f"        return {slow_grad} if __grad else {slow}\n"
            f"    if __grad:\n"
            f"{with_grad('__run')}"
            f"    __stats.memory_hits += 1\n"
            f"    return __run(__k, {everything})\n")

    def _call(self, *args: Any) -> Any:
        if self.coerce is not None:
            args = self.coerce(*args)
        route = self._route(args)
        if route == _DIRECT:
            return self._run_device(args)
        if route == _EAGER_AUTOGRAD:
            return self._autograd.apply(*args)
        return self.overload(*args)

    def _route(self, args: tuple[Any, ...]) -> int:
        """Which path a call takes; cheapest checks first (this runs on every call)."""
        if _is_compiling():
            return _DISPATCHER
        if _function_mode() or _dispatch_stack() or _profiling():
            return _DISPATCHER  # modes and the profiler expect to see the op in the dispatcher
        grad = torch.is_grad_enabled()
        needs_grad = False
        for i in self._tensor_positions:
            t = args[i]
            if type(t) is not torch.Tensor and type(t) is not torch.nn.Parameter:
                if not isinstance(t, torch.Tensor):
                    raise TypeError(f"{self.label}: argument '{self.args[i].name}' must be a torch.Tensor, "
                                    f"got {type(t).__name__}")
                return _DISPATCHER  # subclasses (FakeTensor, DTensor, ...): the dispatcher knows what to do
            if grad and t.requires_grad:
                needs_grad = True
        for i in self._optional_positions:
            t = args[i]
            if t is not None:
                if type(t) is not torch.Tensor and type(t) is not torch.nn.Parameter:
                    return _DISPATCHER
                if grad and t.requires_grad:
                    needs_grad = True
        for i in self._list_positions:
            for t in args[i]:
                if type(t) is not torch.Tensor and type(t) is not torch.nn.Parameter or grad and t.requires_grad:
                    return _DISPATCHER  # autograd.Function does not see tensors inside lists: register_autograd does
        if not needs_grad:
            return _DIRECT
        return _EAGER_AUTOGRAD if self._autograd is not None else _DISPATCHER

    # ---- running on a device -------------------------------------------------------------------------------
    def _tensors(self, args: tuple[Any, ...]) -> list[tuple[str, torch.Tensor]]:
        found = []
        for i, a in enumerate(self.args):
            value = args[i]
            if a.kind in ("tensor", "optional_tensor") and isinstance(value, torch.Tensor):
                found.append((a.name, value))
            elif a.kind == "tensor_list":
                found += [(f"{a.name}[{j}]", t) for j, t in enumerate(value) if isinstance(t, torch.Tensor)]
        return found

    def _check_devices(self, args: tuple[Any, ...]) -> torch.Tensor:
        """Every tensor argument dense and on one device; returns the first.  The full (slower) check."""
        tensors = self._tensors(args)
        for i in self._tensor_positions:
            if not isinstance(args[i], torch.Tensor):
                raise TypeError(f"{self.label}: argument '{self.args[i].name}' must be a torch.Tensor, "
                                f"got {type(args[i]).__name__}")
        if not tensors:
            lists = [a.name for a in self.args if a.kind == "tensor_list"]
            if lists:
                raise ValueError(f"{self.label}: argument{'s' if len(lists) > 1 else ''} "
                                 f"{' and '.join(repr(n) for n in lists)} hold no tensors; give at least one (the "
                                 "tensors say which device and dtype to run on)")
            raise ValueError(f"{self.label}: no tensor arguments")
        for name, t in tensors:
            if t.layout != torch.strided:
                raise TypeError(f"{self.label}: argument '{name}' has layout {t.layout}; only dense (strided) "
                                "tensors are supported: call .to_dense() first")
        first_name, first = tensors[0]
        for name, t in tensors[1:]:
            if t.device != first.device:
                raise ValueError(f"{self.label}: argument '{name}' is on {t.device} but '{first_name}' is on "
                                 f"{first.device}; move them to one device")
        return first

    def _first_tensor(self, args: tuple[Any, ...]) -> torch.Tensor | None:
        """The common case, checked in a few attribute reads (0.05 us each, where .device costs 0.3 us): every
        argument a dense Tensor on one GPU, or every one on the CPU.  None when anything differs; the full
        check then explains what."""
        if not self._plain:
            return None
        first = args[self._tensor_positions[0]]
        index = first.get_device()
        if index < 0 and not first.is_cpu:
            return None
        for i in self._tensor_positions:
            t = args[i]
            if t.get_device() != index or t.layout is not _STRIDED or (index < 0 and not t.is_cpu):
                return None
        for i in self._optional_positions:
            t = args[i]
            if t is not None and (t.get_device() != index or t.layout is not _STRIDED or
                                  (index < 0 and not t.is_cpu)):
                return None
        return first

    def _run_device(self, args: tuple[Any, ...]) -> Any:
        first = self._first_tensor(args)
        if first is not None:
            device_index = first.get_device()
            impl = self._cuda if device_index >= 0 else self._cpu
        else:
            first = self._check_devices(args)
            if first.is_meta:
                return self._run_meta(args)
            impl = self.impls.get("cuda" if first.is_cuda else first.device.type)
            device_index = first.get_device()
        if impl is None:
            raise ValueError(f"{self.label}: inputs are on {first.device}, but this op runs on "
                             f"{' and '.join(self.impls)} only")
        shape_class = self.shape_class(*args)
        kernels = self._memo.get((device_index, shape_class))
        if kernels is None:
            kernels = self._load(impl, shape_class, "cuda" if device_index >= 0 else "cpu", device_index, args)
            if kernels is None:  # compiling in the background: torch's implementation meanwhile
                stats.fallbacks += 1
                return self.fallback(Kernels({}, shape_class), *args)  # type: ignore[misc]
        else:
            stats.memory_hits += 1
        if device_index >= 0 and device_index != _current_device():
            with torch.cuda.device(device_index):
                return impl.run(kernels, *args)
        return impl.run(kernels, *args)

    def _run_meta(self, args: tuple[Any, ...]) -> Any:
        """Meta tensors (a model built on device="meta"): the checks and the shape class as a GPU call would
        meet them, then the fake implementation's outputs.  Nothing compiles or launches; inside
        jitops.record_calls() the call is recorded as a manifest item, so a GPU-less machine can list (and
        prewarm) the kernels a model will use."""
        shape_class = self.shape_class(*args)
        if _meta_recorders:
            item = self.manifest_item(args)
            for recorder in _meta_recorders:
                recorder.add(item, self, shape_class)
        return self.fake(*args)

    def _make_autograd_function(self) -> type | None:
        """Eager calls that need a gradient use this autograd.Function, which runs the device implementation
        directly: 10.6 us a call where going through register_autograd's dispatcher path costs 13.7 us
        (probe, H100).  Both run the op's own setup_context and backward."""
        if self.backward is None or self._list_positions:
            return None
        op = self
        slot = _kernels_slot

        def forward(ctx, *args):
            kernels = slot.kernels
            if kernels is None:
                # The hot path did not find this class's kernels: most often the first call with a gradient, so
                # start loading (compiling) the backward's kernels while the forward's own load.  Only here: a
                # repeated prefetch cost 7.2 us a call (its shape class, a lock and a set) on every gemm call.
                if op.companions is not None:
                    op.prefetch(*args)
                output = op._run_device(args)
            else:  # the hot path found them (a CPU call, or a CUDA call on the current device)
                slot.kernels = None
                stats.memory_hits += 1
                output = slot.run(kernels, *args)
            op.setup_context(ctx, args, output)  # type: ignore[misc]
            return output

        # Built with type() so the autograd node is named after the op: grad_fn=<jitops_geluBackward>.
        return type(f"jitops_{self.name}", (torch.autograd.Function,),
                    {"forward": staticmethod(forward), "backward": staticmethod(self._make_backward())})

    def _make_backward(self) -> Callable[..., tuple[Any, ...]]:
        """The autograd.Function's backward: _backward's results, generated with the positions unrolled (2.3 us
        of wrapper a backward on the dev box, against 0.1 us for the op's backward itself, in a trivial probe).
        The Function's apply gets every argument, so needs_input_grad needs no padding."""
        count = len(self._differentiable)
        gradient = {position: j for j, position in enumerate(self._differentiable)}
        results = [f"__g[{gradient[p]}] if __needs[{p}] else None" if p in gradient else "None"
                   for p in range(len(self.args))]
        source = ("def backward(ctx, *grads):\n"
                  "    __g = __op.backward(ctx, *grads)\n"
                  f"    if type(__g) is not tuple or len(__g) != {count}:\n"
                  "        __g = __op._tensor_grads(__g)\n"
                  "    __needs = ctx.needs_input_grad\n"
                  f"    return ({', '.join(results)},)\n")
        namespace: dict[str, Any] = {"__op": self}
        exec(compile(source, f"<jitops backward {self.qualname}>", "exec"), namespace)  # noqa: S102 - generated
        return namespace["backward"]

    def _tensor_grads(self, tensor_grads: Any) -> tuple[Any, ...]:
        """The op's backward's result as a tuple of one gradient per Tensor/Tensor?/Tensor[] argument."""
        if not isinstance(tensor_grads, (tuple, list)):
            tensor_grads = (tensor_grads,)
        if len(tensor_grads) != len(self._differentiable):
            raise RuntimeError(f"jitops.{self.name}: backward returned {len(tensor_grads)} gradients for "
                               f"{len(self._differentiable)} tensor arguments")
        return tuple(tensor_grads)

    def target(self, device_type: str, device_index: int) -> Target:
        if device_type == "cpu":
            return Target("cpu")
        target = self._targets.get(device_index)
        if target is None:
            target = self._targets[device_index] = Target("cuda", torch.cuda.get_device_capability(device_index))
        return target

    def _load(self, impl: Impl, shape_class: Any, device_type: str, device_index: int,
              args: tuple[Any, ...]) -> Kernels | None:
        """The class's kernels, loaded and remembered; None while they compile in the background."""
        memo_key = (device_index, shape_class)
        pending = self._pending.get(memo_key)
        if pending is not None:
            if not all(f.done() for f in pending) or any(f.exception() is not None for f in pending):
                return None  # still compiling, or a compile failed (warned once): torch's implementation
            del self._pending[memo_key]
        target = self.target(device_type, device_index)
        context = self.miss_context(shape_class, self.manifest_item(args))
        index = device_index if device_index >= 0 else None
        requests = impl.kernels(shape_class, target)
        if self.fallback is not None and config.compile_mode == "background" and not config.offline:
            loaded = {name: runtime.get_kernel(request, target, index, context, build=False)
                      for name, request in requests.items()}
            missing = [name for name, kernel in loaded.items() if kernel is None]
            if missing:
                prepare = (lambda: ensure_context(device_index)) if device_index >= 0 else None
                self._pending[memo_key] = [runtime.submit(requests[name], target, index, context, prepare)
                                           for name in missing]
                return None
        else:
            loaded = {name: runtime.get_kernel(request, target, index, context)
                      for name, request in requests.items()}
        kernels = Kernels(loaded, shape_class)
        self._memo[(device_index, shape_class)] = kernels
        if device_index >= 0:
            # With one visible GPU the tensor's device is always the current one: the hot path skips asking
            # (0.21 us of its ~12 on the H100).  Known only now: asking at import would initialise CUDA.
            self._hot_globals["__several"] = torch.cuda.device_count() > 1
        return kernels

    def loaded(self, device_index: int, shape_class: Any) -> Kernels | None:
        """The kernels of `shape_class` on a device if this process has loaded them, else None.  For an op's
        backward that launches another op's kernels without re-validating inputs it built itself."""
        return self._memo.get((device_index, shape_class))

    def load(self, device_index: int, shape_class: Any, args: tuple[Any, ...]) -> Kernels | None:
        """The kernels of `shape_class` on a CUDA device, loaded (compiled on a cold cache) and remembered as a
        call with `args` would load them, without running them; None while they compile in the background.  `args`
        only describe the call (the miss records and manifests): placeholders will do.  For an op's backward that
        launches another op's kernels on operands no call of it could take (jitops.linear's unpadded weight)."""
        kernels = self._memo.get((device_index, shape_class))
        if kernels is None:
            kernels = self._load(self.impls["cuda"], shape_class, "cuda", device_index, args)
        return kernels

    def clear_memory(self) -> None:
        self._memo.clear()
        self._pending.clear()

    # ---- manifests: recording a call and replaying it without a GPU --------------------------------------------
    def miss_context(self, shape_class: Any, item: dict[str, Any] | None) -> MissContext:
        """Who asks for this op's kernels, for the runtime: the public op and this op as detail (the names an
        entry's meta.json, a JITOPS_RECORD line, progress lines and CacheMissError carry)."""
        return MissContext(self.public, shape_class, item, kernel_op=self.display_name)

    def manifest_item(self, args: tuple[Any, ...]) -> dict[str, Any]:
        """This call as a JITOPS_RECORD / prewarm manifest item: dtype, tensor shapes, other arguments."""
        shapes: list[Any] = []
        strides: list[Any] = []
        dtype = None
        contiguous = True
        for i, a in enumerate(self.args):
            value = args[i]
            if a.kind == "tensor_list":
                shapes.append([list(t.shape) for t in value])
                strides.append([list(t.stride()) for t in value])
                contiguous &= all(t.is_contiguous() for t in value)
                dtype = dtype or (value[0].dtype if value else None)
            elif a.kind in ("tensor", "optional_tensor"):
                shapes.append(list(value.shape) if value is not None else None)
                strides.append(list(value.stride()) if value is not None else None)
                if value is not None:
                    contiguous &= value.is_contiguous()
                    dtype = dtype or value.dtype
        kwargs = {a.name: _jsonable(args[i]) for i, a in enumerate(self.args) if a.kind == "value"}
        # The public op, and this op as "kernel_op": replaying the item builds exactly this call's kernels (an
        # item without kernel_op builds every kernel the public op can use: its backward, its no-grad path).
        item: dict[str, Any] = {"op": self.public, "kernel_op": self.display_name,
                                "dtypes": [dtype_name(dtype)] if dtype else [], "shapes": [shapes], "kwargs": kwargs}
        if not contiguous:
            item["strides"] = [strides]
        return item

    def example_args(self, dtype: str, shapes: Sequence[Any], kwargs: Mapping[str, Any],
                     strides: Sequence[Any] | None = None, device: str = "meta") -> tuple[Any, ...]:
        """Arguments for one manifest call that hold no memory and need no GPU.

        device="meta" (default) gives meta tensors, which shape classes treat like GPU tensors (not is_cpu).
        device="cpu" gives fake CPU tensors (is_cpu is True), so the shape class applies the rules a real CPU
        call meets: prewarming for the `cpu` target must build the kernels a CPU call asks for.  (The first
        fake tensor imports torch._dynamo: about 2 s.)"""
        torch_dtype = parse_dtype(dtype)
        if device == "meta":
            make = _meta
        else:
            from torch._subclasses.fake_tensor import FakeTensorMode

            mode = FakeTensorMode()

            def make(shape: Sequence[int], stride: Sequence[int] | None, dtype: torch.dtype) -> torch.Tensor:
                with mode:
                    return _empty(shape, stride, dtype, device)
        tensor_args = [a for a in self.args if a.kind != "value"]
        if len(shapes) != len(tensor_args):
            given = f"{len(shapes)} shape{'' if len(shapes) == 1 else 's'}"
            raise ValueError(f"{self.label}: {given} given for {len(tensor_args)} tensor arguments "
                             f"({', '.join(a.name for a in tensor_args)}): give one shape per tensor argument, in "
                             "order (null, or --shape none, for an absent optional one)")
        unknown = set(kwargs) - {a.name for a in self.args if a.kind == "value"}
        if unknown:
            raise ValueError(f"{self.label}: unknown argument(s) {sorted(unknown)} in manifest kwargs")
        strides = strides or [None] * len(shapes)
        shape_iter = iter(zip(shapes, strides))
        values: list[Any] = []
        for a in self.args:
            if a.kind == "value":
                if a.name in kwargs:
                    value = kwargs[a.name]
                    if a.dtype and isinstance(value, str):
                        value = parse_dtype(value)
                    values.append(value)
                elif a.has_default:
                    values.append(a.default)
                else:
                    raise ValueError(f"{self.label}: manifest call lacks argument '{a.name}'")
                continue
            shape, stride = next(shape_iter)
            if a.kind == "tensor_list":
                stride = stride or [None] * len(shape)
                values.append([make(s, st, torch_dtype) for s, st in zip(shape, stride)])
            elif shape is None:
                if a.kind != "optional_tensor":
                    raise ValueError(f"{self.label}: argument '{a.name}' is a required tensor; its shape "
                                     "cannot be null")
                values.append(None)
            else:
                values.append(make(shape, stride, torch_dtype))
        return tuple(values)

    def requests_for(self, args: tuple[Any, ...], target: Target) -> dict[str, BuildRequest]:
        """The build requests a call with `args` (e.g. from example_args) needs on `target`."""
        impl = self.impls.get(target.device_type)
        if impl is None:
            raise ValueError(f"{self.label}: no {target.device_type} implementation")
        return dict(impl.kernels(self.shape_class(*args), target))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.function(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<jitops op {self.qualname}>"

    # ---- names, and the calls a call leads to --------------------------------------------------------------
    @property
    def display_name(self) -> str:
        """jitops' own ops by short name ('gelu'), others qualified ('mylib::scaled_add'): what manifests use."""
        return self.name if self.namespace == "jitops" else self.qualname

    @property
    def label(self) -> str:
        """How errors name the function the user called: 'jitops.layer_norm' for layer_norm_inference (it takes
        jitops.layer_norm's arguments), 'jitops.layer_norm_backward' for the backward op."""
        registered_public = self.is_entry and self.public != self.display_name
        return f"jitops.{self.public if registered_public else self.name}"

    def companion_calls(self, args: tuple[Any, ...], needs: Sequence[bool] | None = None) -> list[tuple["Op", tuple]]:
        """The op calls that the backward of a call with `args` makes (the op's `companions` declaration), each as
        (Op, args).  `needs`: whether each tensor argument needs a gradient, like ctx.needs_input_grad (default:
        all).  Works on meta and fake tensors, so manifests expand without a GPU."""
        if self.companions is None:
            return []
        if needs is None:
            needs = (True,) * len(self._differentiable)
        calls = self.companions(*args, needs=tuple(needs))
        return [(getattr(fn, "op", fn), tuple(call_args)) for fn, call_args in calls]

    def prefetch(self, *args: Any) -> list[threading.Thread]:
        """Start loading (compiling, on a cold cache) the kernels this call's backward will need, each in a daemon
        thread, so they build while the forward's own kernels do.  For a call on a GPU whose inputs require a
        gradient; once per (device, op, shape class) in a process.  Errors are left for the backward itself to
        raise; the runtime's per-kernel locks make it wait for a compile still in flight."""
        tensors = [t for _, t in self._tensors(args)]
        if not tensors or tensors[0].is_cpu or self.companions is None:
            return []
        index = max(tensors[0].get_device(), 0)  # (meta tensors, in tests: device 0)
        needs = []
        for i in self._differentiable:
            value = args[i]
            items = value if isinstance(value, (list, tuple)) else [value]
            needs.append(any(isinstance(t, torch.Tensor) and t.requires_grad for t in items))
        try:
            key = (index, self.qualname, self.shape_class(*args), tuple(needs))
        except Exception:  # noqa: BLE001 - bad inputs: the call itself raises the error
            return []
        with _PREFETCH_GUARD:
            if key in _PREFETCHED:  # the common case: a training loop's later steps
                return []
            _PREFETCHED.add(key)
        started = []
        for op_, call_args in self.companion_calls(args, needs):
            try:
                cls = op_.shape_class(*call_args)
                impl = op_.impls.get("cuda")
                if impl is None:
                    continue
                target = op_.target("cuda", index)
                with _PREFETCH_GUARD:
                    if (index, op_.qualname, cls) in _PREFETCHED:  # another forward's backward asked already
                        continue
                    _PREFETCHED.add((index, op_.qualname, cls))
                requests = impl.kernels(cls, target)
            except Exception as exc:  # noqa: BLE001 - the backward reports bad inputs with its own checks
                log.debug("no prefetch for %s: %s", op_.qualname, exc)
                continue
            context = op_.miss_context(cls, op_.manifest_item(call_args))
            for request in requests.values():
                thread = threading.Thread(target=_load_quietly, args=(request, target, index, context), daemon=True,
                                          name=f"jitops-prefetch-{request.kernel}")
                thread.start()
                started.append(thread)
        return started


_PREFETCHED: set[tuple[int, str, Any]] = set()
_PREFETCH_GUARD = threading.Lock()


def _load_quietly(request: BuildRequest, target: Target, index: int, context: MissContext) -> None:
    try:
        ensure_context(index)  # a fresh thread has no current CUDA context
        runtime.get_kernel(request, target, index, context)
    except Exception as exc:  # noqa: BLE001 - the backward raises it with full context when it needs the kernel
        log.debug("background compile of %s failed: %s", request.label(), exc)


def _empty(shape: Sequence[int], stride: Sequence[int] | None, dtype: torch.dtype, device: str) -> torch.Tensor:
    if stride is None:
        return torch.empty(tuple(shape), dtype=dtype, device=device)
    return torch.empty_strided(tuple(shape), tuple(stride), dtype=dtype, device=device)


def _meta(shape: Sequence[int], stride: Sequence[int] | None, dtype: torch.dtype) -> torch.Tensor:
    return _empty(shape, stride, dtype, "meta")


def _jsonable(value: Any) -> Any:
    if isinstance(value, torch.dtype):
        return dtype_name(value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def op(schema: str, *, shape_class: Callable[..., Any], fake: Callable[..., Any], cuda: Impl | None = None,
       cpu: Impl | None = None, setup_context: Callable[..., None] | None = None,
       backward: Callable[..., Any] | None = None, keyword_only: Sequence[str] = (),
       doc: str | None = None, fallback: Callable[..., Any] | None = None,
       companions: Callable[..., Sequence[tuple[Any, tuple[Any, ...]]]] | None = None,
       coerce: Callable[..., tuple] | None = None) -> Callable[..., Any]:
    """Declare an op and return its public function (its `.op` attribute is the Op).  See module docstring.

    fallback(k, *args) -> outputs through torch's own ops, called like run (k holds only k.shape_class): what
    a call runs while its kernels compile in the background (JITOPS_COMPILE=background).
    companions(*args, needs) -> [(op function, args), ...]: the op calls the backward of a call with `args` makes,
    for the tensor arguments whose `needs` flag is set (one per Tensor/Tensor?/Tensor[] argument, like
    ctx.needs_input_grad).  New tensors in them come from shapes.placeholder(), so it runs on meta and fake
    tensors: prewarm builds a public op's backward from a manifest item, and Op.prefetch() starts compiling
    the backward while the forward compiles.
    coerce(*args) -> args: non-tensor values the op takes where its schema has a Tensor, made tensors (see
    Op.coerce)."""
    return Op(schema, shape_class=shape_class, fake=fake, cuda=cuda, cpu=cpu, setup_context=setup_context,
              backward=backward, keyword_only=keyword_only, doc=doc, fallback=fallback,
              companions=companions, coerce=coerce).function


class CallRecorder:
    """The calls jitops' ops saw on meta tensors inside `record_calls()`, as manifest items (no duplicates)."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.classes: list[tuple[Op, Any, dict[str, Any]]] = []  # (op, shape class, its first manifest item)
        self._seen: set[str] = set()
        self._seen_classes: set[tuple[str, Any]] = set()

    def add(self, item: dict[str, Any], op: "Op | None" = None, shape_class: Any = None) -> None:
        import json

        key = json.dumps(item, sort_keys=True)
        if key not in self._seen:
            self._seen.add(key)
            self.items.append(item)
        if op is not None and (op.qualname, shape_class) not in self._seen_classes:
            self._seen_classes.add((op.qualname, shape_class))
            self.classes.append((op, shape_class, item))

    def manifest(self, archs: Sequence[str]) -> dict[str, Any]:
        """A prewarm manifest (`jitops-cache prewarm --manifest FILE`) for the recorded calls."""
        return {"archs": list(archs), "ops": list(self.items)}


_meta_recorders: list[CallRecorder] = []


@contextlib.contextmanager
def record_calls() -> Iterator[CallRecorder]:
    """Record every jitops op call made on meta tensors inside the block:

        with torch.device("meta"):
            model = build_model()
        with jitops.record_calls() as calls:
            model(inputs_on_meta).sum().backward()
        json.dump(calls.manifest(["sm_90a"]), open("kernels.json", "w"))   # then: jitops-cache prewarm --manifest
    """
    recorder = CallRecorder()
    _meta_recorders.append(recorder)
    try:
        yield recorder
    finally:
        _meta_recorders.remove(recorder)


def registered() -> dict[str, Op]:
    """Every op declared in this process, by qualified name."""
    return dict(_REGISTRY)


def find(name: str) -> Op:
    """An op by name ('gelu' or 'jitops::gelu').  jitops' built-in ops are registered when jitops is imported
    (importing jitops.op imports jitops first)."""
    qualname = name if "::" in name else f"jitops::{name}"
    try:
        return _REGISTRY[qualname]
    except KeyError:
        raise ValueError(f"jitops: unknown op {name!r}; {_known()}") from None


# ---- public names -----------------------------------------------------------------------------------------------
class Public:
    """A name users call, and the ops that carry it.

    jitops.layer_norm is a Python function over three ops: layer_norm_forward when a gradient is recorded,
    layer_norm_inference when none is, and layer_norm_backward in the backward.  Registering it (jitops.public)
    gives manifests, JITOPS_RECORD lines, explain, list, verify and errors one name for all three.  An op
    declared with jitops.op and no public() around it is its own public op.

    entries: the ops that take the public function's arguments, one per form (grouped_gemm: a list form and a
        ragged form); their errors say jitops.<name>.
    parts: ops only its calls reach (backward ops); they keep their own name in errors and show it as detail.
    form(shapes, kwargs) -> (entry, shapes, kwargs): which entry's argument list a manifest call of the public
        name is written in, and that call in it (default: the first entry, unchanged).
    calls(entry, args, grad) -> [(op function, args), ...]: the op calls the public function makes for a call
        given as `args` of `entry`, when a gradient is recorded (grad=True) or not (default: [(entry, args)]).
    bind(*args, **kwargs) -> (entry, args): a call of the public function as a call of one entry (default: by
        the function's signature, onto the first entry's arguments of the same names)."""

    def __init__(self, name: str, function: Callable[..., Any], entries: Sequence[Any], parts: Sequence[Any] = (),
                 form: Callable[..., tuple[Any, Any, Any]] | None = None,
                 calls: Callable[..., Sequence[tuple[Any, tuple[Any, ...]]]] | None = None,
                 bind: Callable[..., tuple[Any, tuple[Any, ...]]] | None = None) -> None:
        self.name = name
        self.function = function
        self.entries: tuple[Op, ...] = tuple(getattr(e, "op", e) for e in entries)
        self.parts: tuple[Op, ...] = tuple(getattr(p, "op", p) for p in parts)
        self._form = form
        self._calls = calls
        self._bind = bind

    def bind(self, *args: Any, **kwargs: Any) -> tuple[Op, tuple[Any, ...]]:
        if self._bind is not None:
            entry, entry_args = self._bind(*args, **kwargs)
            return getattr(entry, "op", entry), tuple(entry_args)
        entry = self.entries[0]
        bound = inspect.signature(self.function).bind(*args, **kwargs)
        bound.apply_defaults()
        return entry, tuple(bound.arguments[a.name] for a in entry.args)

    def manifest_item(self, *args: Any, grad: bool | None = None, **kwargs: Any) -> dict[str, Any]:
        """A call of the public function (real, meta or fake tensors) as a manifest item of the public name,
        which builds everything the call can use (`grad`: only the path with or without a gradient)."""
        entry, entry_args = self.bind(*args, **kwargs)
        item = entry.manifest_item(entry_args)
        del item["kernel_op"]
        item["op"] = self.name
        if grad is not None:
            item["grad"] = grad
        return item

    @property
    def ops(self) -> tuple[Op, ...]:
        return self.entries + self.parts

    def form(self, shapes: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[Op, Sequence[Any], Mapping[str, Any]]:
        if self._form is None:
            return self.entries[0], shapes, kwargs
        entry, shapes, kwargs = self._form(shapes, kwargs)
        return getattr(entry, "op", entry), shapes, kwargs

    def calls(self, entry: Op, args: tuple[Any, ...], grad: bool | None = None) -> list[tuple[Op, tuple]]:
        """Every op call a call of the public function makes: its direct calls on the grad path (grad=True),
        the no-grad path (False) or both (None), and on the grad path its backward's calls (Op.companions)."""
        found: list[tuple[Op, tuple]] = []
        for path in ((False, True) if grad is None else (grad,)):
            direct = [(entry, args)] if self._calls is None else \
                [(getattr(fn, "op", fn), tuple(a)) for fn, a in self._calls(entry, args, path)]
            for op_, op_args in direct:
                found.append((op_, op_args))
                if path:
                    found += op_.companion_calls(op_args)
        return found

    def __repr__(self) -> str:
        return f"<jitops public op {self.name}: {', '.join(o.display_name for o in self.ops)}>"


_PUBLIC: dict[str, Public] = {}


def public(name: str, function: Callable[..., Any], *, entries: Sequence[Any], parts: Sequence[Any] = (),
           form: Callable[..., tuple[Any, Any, Any]] | None = None,
           calls: Callable[..., Sequence[tuple[Any, tuple[Any, ...]]]] | None = None,
           bind: Callable[..., tuple[Any, tuple[Any, ...]]] | None = None, shared: bool = False) -> Public:
    """Register the public name of a Python function over several ops (see Public).  shared: a second name over
    ops another public name owns (rms_norm over layer_norm's ops, with rms=True): manifests and find_public know
    it, and the ops keep the owner's name (misses, records and explain say layer_norm)."""
    registered_public = Public(name, function, entries, parts, form, calls, bind)
    if not shared:
        for declared in registered_public.ops:
            declared.public = name
            declared.is_entry = declared in registered_public.entries
    _PUBLIC[name] = registered_public
    return registered_public


def public_names() -> list[str]:
    """The names users call: registered public names and every op that belongs to no other."""
    names = set(_PUBLIC)
    names.update(o.display_name for o in _REGISTRY.values() if o.public == o.display_name)
    return sorted(names)


def find_public(name: str) -> Public:
    """The public op called `name` ('layer_norm', 'gemm', 'mylib::scaled_add'), or the one the op called `name`
    belongs to ('layer_norm_backward' -> layer_norm)."""
    short = name.removeprefix("jitops::")
    if short in _PUBLIC:
        return _PUBLIC[short]
    declared = find(name)
    if declared.public in _PUBLIC:
        return _PUBLIC[declared.public]
    return Public(declared.display_name, declared.function, (declared,))


def _known() -> str:
    internal = sorted(o.display_name for o in _REGISTRY.values() if o.public != o.display_name)
    return (f"known ops: {', '.join(public_names())}" +
            (f" (and the ops inside them: {', '.join(internal)})" if internal else ""))


__all__ = ["Impl", "Kernels", "Op", "Public", "op", "public", "registered", "find", "find_public", "public_names",
           "dispatcher_wanted",
           "record_calls", "CallRecorder"]
