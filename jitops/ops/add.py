"""jitops.add(a, b, *, alpha=1): a + alpha * b, elementwise, as torch.add computes it.

The smallest op on the runtime, and the one the hot-call benchmark measures.  What it takes, as torch.add does:
- broadcasting by torch's rules (trailing dimensions equal or 1), with nothing expanded in memory: the kernels
  read a broadcast dimension through stride 0;
- a and b tensors, 0-d tensors or Python numbers (bool, int, float); two numbers give a 0-d CPU tensor, as
  torch.add(2.0, 3.0) does;
- alpha, a Python number that scales b;
- type promotion: the result has torch.result_type(a, b) (fp16 + fp32 tensors -> fp32; an fp16 tensor plus a
  Python float or an fp64 0-d tensor -> fp16), inputs converted to it before the sum as torch converts them.
What it rejects, with a TypeError or ValueError naming the argument (docs/semantics.md):
- integer, bool and complex tensors, numbers and alpha: jitops.add computes floating-point dtypes only (fp32,
  fp16, bf16, fp64), where torch.add also adds integers and complex numbers;
- tensors on two devices, a 0-d CPU tensor beside CUDA tensors included (torch takes that one as a scalar:
  pass b.item(), or move it);
- shapes that do not broadcast; inputs whose broadcast still needs more than MAX_DIMS dimensions once
  neighbouring dimensions are merged (only alternating broadcast dimensions can do that).
The output is contiguous (torch's may follow the inputs' memory format; the values are the same).

Two paths.  The common call - the same shape, one dtype, alpha == 1 - keeps a shape class of two lookups and
kernels/add.cu's 16-byte vectors (non-contiguous inputs are copied first).  Every other call takes
kernels/add_broadcast.cu, which reads each input through its strides in its own dtype (a narrower one widened
exactly), so neither broadcasting nor a strided view nor a narrower dtype costs a copy.  CUDA: fp32, fp16,
bf16, fp64 through NVRTC.  CPU: the same dtypes through the host C++ compiler (cxx); fp16 and bf16 are computed
by the fp32 kernel on fp32 copies with one rounding at the end, which is how torch's CPU add computes them.

Gradients: a's is the output's gradient and b's is the output's gradient times alpha, each summed over the
dimensions its input was broadcast over and cast to its input's dtype (torch's rules; see backward).
"""
from __future__ import annotations

import ctypes
import functools
import math
import numbers
from typing import NamedTuple

import torch

from .. import shapes
from ..launch import UNCAPPED_GRID, elementwise_grid
from ..op import Impl, op
from ..specs import CppLibrary, CudaKernel, Source, Target

CUDA_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
CPU_DTYPES = CUDA_DTYPES
CPU_COMPUTE = shapes.CPU_COMPUTE  # fp16 and bf16 through the fp32 kernel, as torch's CPU add computes them
# An input of a narrower dtype than the result is read in its own dtype and widened exactly in the kernel; a
# wider one (only a 0-d tensor can be wider than torch.result_type) is converted on the host first.
WIDENS_EXACTLY = {(torch.float16, torch.float32), (torch.bfloat16, torch.float32), (torch.float16, torch.float64),
                  (torch.bfloat16, torch.float64), (torch.float32, torch.float64)}
MAX_DIMS = 6  # kernels/add_broadcast.cu's (size, stride, stride) triples
BLOCK = 256
INDEX32_LIMIT = 2**31  # 32-bit index math while every index and offset stays below this


class AddClass(NamedTuple):
    """The common call: one shape, one dtype, alpha == 1 (kernels/add.cu)."""

    dtype: torch.dtype
    vec: int  # elements per access: 16 bytes when both inputs are 16-byte aligned
    contiguous: bool  # both inputs: run_cuda copies neither (the kernel is the same either way)


class BroadcastClass(NamedTuple):
    """Every other call (kernels/add_broadcast.cu; on the CPU, add.cpp's add_strided)."""

    dtype: torch.dtype     # the result's: torch.result_type(a, b)
    a_dtype: torch.dtype   # a as the kernel reads it: its own dtype, or the result's for a wider 0-d a
    b_dtype: torch.dtype
    dims: int              # dimensions left once _plan merged them (0: the CPU, or sizes not known yet)
    index: str             # "unsigned" (32-bit) or "long long"
    copy: bool = False     # the inputs are made contiguous first: their own strides need more than MAX_DIMS
    expand: bool = False   # both are copied out to the result's shape: even contiguous, more than MAX_DIMS groups
    # Always None.  AddClass.contiguous is True or False, so the `if not cls.contiguous` that the common call
    # makes anyway sends this class to the general path without a test of its own on that call.
    contiguous: None = None


_CLASSES: dict[tuple[torch.dtype, int, bool], AddClass] = {}
_SIZELESS: dict[tuple[torch.dtype, torch.dtype, torch.dtype], "BroadcastClass"] = {}  # the CPU's general classes
_PYTHON_REALS = (int, float, bool)  # checked by type before the slower isinstance(numbers.Real) (numpy's too)
_WIDEST = {dtype: 16 // size for dtype, size in shapes.CUDA_ITEMSIZE.items()}
_Tensor = torch.Tensor


def shape_class(a: torch.Tensor, b: torch.Tensor, alpha=1) -> AddClass | BroadcastClass:
    # Runs on every call: plain comparisons first, the general path (which checks everything) only when needed.
    dtype = a.dtype
    if dtype is not b.dtype or a.shape != b.shape or alpha != 1:
        return _general_class(a, b, alpha)
    vec = _WIDEST.get(dtype)  # one lookup is the dtype check (both devices take the same dtypes)
    if vec is None:
        _check_operand_dtype("a", a)
    # Non-contiguous inputs are copied, and the copies are fresh 16-byte aligned allocations.
    contiguous = a.is_contiguous() and b.is_contiguous()
    if contiguous and (type(a) is not _Tensor or type(b) is not _Tensor or a.is_meta
                       or (a.data_ptr() | b.data_ptr()) & 15):
        vec = shapes.pair_vector_width(a, b)  # the uncommon cases: offset views, fake or meta tensors
    key = (dtype, vec, contiguous)
    cls = _CLASSES.get(key)  # a NamedTuple costs 0.3 us to build, a lookup 0.1 us
    if cls is None:
        cls = _CLASSES[key] = AddClass(dtype, vec, contiguous)
    return cls


# ---- the general path: checks, promotion, broadcasting ---------------------------------------------------------
def _check_operand_dtype(name: str, t: torch.Tensor) -> None:
    if t.dtype not in CUDA_DTYPES:
        raise TypeError(f"jitops.add: argument '{name}' has dtype {str(t.dtype).removeprefix('torch.')}; jitops.add "
                        "computes floating-point tensors only (float32, float16, bfloat16, float64), where torch.add "
                        f"also adds integer, bool and complex ones: convert it first, e.g. {name}.float()")


def _check_alpha(alpha) -> None:
    if type(alpha) in _PYTHON_REALS or isinstance(alpha, numbers.Real) and not isinstance(alpha, torch.Tensor):
        return
    if isinstance(alpha, numbers.Complex):
        raise TypeError(f"jitops.add: argument 'alpha' is the complex number {alpha!r}; jitops.add computes real "
                        "floating-point dtypes only (torch.add rejects it for real tensors too)")
    raise TypeError(f"jitops.add: argument 'alpha' must be a Python number (bool, int or float), got "
                    f"{type(alpha).__name__}" + ("; pass alpha.item()" if isinstance(alpha, torch.Tensor) else ""))


def _broadcast_shape(a: torch.Tensor, b: torch.Tensor) -> torch.Size:
    try:
        out = _broadcast(a.shape, b.shape)
    except TypeError:  # symbolic sizes (tracing with dynamic shapes) are not hashable: torch's own function
        try:
            return torch.broadcast_shapes(a.shape, b.shape)
        except RuntimeError:
            out = None
    if out is None:
        raise ValueError(f"jitops.add: argument 'b' has shape {tuple(b.shape)}, which does not broadcast with 'a' of "
                         f"shape {tuple(a.shape)}: from the last dimension back, sizes must be equal or 1 "
                         "(torch's broadcasting rules)")
    return out


@functools.lru_cache(maxsize=4096)
def _broadcast(a_shape: torch.Size, b_shape: torch.Size) -> torch.Size | None:
    """torch's broadcast of two shapes, or None where they do not broadcast.  (torch.broadcast_shapes takes
    about 40 us a call on the dev box, most of the general path's time before this.)"""
    rank = max(len(a_shape), len(b_shape))
    out = []
    for x, y in zip((1,) * (rank - len(a_shape)) + tuple(a_shape), (1,) * (rank - len(b_shape)) + tuple(b_shape)):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            return None
    return torch.Size(out)


def _read_dtype(t: torch.Tensor, result: torch.dtype) -> torch.dtype:
    return t.dtype if t.dtype is result or (t.dtype, result) in WIDENS_EXACTLY else result


@functools.lru_cache(maxsize=4096)
def _plan(out_shape: tuple[int, ...], a_shape: tuple[int, ...], a_strides: tuple[int, ...],
          b_shape: tuple[int, ...], b_strides: tuple[int, ...], max_dims: int):
    """(sizes, a strides, b strides), outermost first, of the fewest dimensions that walk the contiguous output
    and both inputs, or None when more than max_dims remain.  A dimension an input is broadcast over (missing,
    or of size 1) has stride 0 there; the output's size-1 dimensions are dropped; a dimension merges into the one
    outside it where both inputs step through them as through one (outer stride = inner stride * inner size)."""
    rank = len(out_shape)

    def aligned(shape: tuple[int, ...], strides: tuple[int, ...]) -> list[int]:
        lead = rank - len(shape)
        return [0 if i < lead or shape[i - lead] == 1 else strides[i - lead] for i in range(rank)]

    dims: list[tuple[int, int, int]] = []
    for size, sa, sb in zip(out_shape, aligned(a_shape, a_strides), aligned(b_shape, b_strides)):
        if size == 1:
            continue
        if dims and dims[-1][1] == sa * size and dims[-1][2] == sb * size:
            dims[-1] = (dims[-1][0] * size, sa, sb)
        else:
            dims.append((size, sa, sb))
    if len(dims) > max_dims:
        return None
    sizes, strides_a, strides_b = zip(*(dims or [(1, 0, 0)]))
    return sizes, strides_a, strides_b


def _cuda_plan(a: torch.Tensor, b: torch.Tensor, out_shape, copy: bool):
    a_strides = shapes.contiguous_strides(a.shape) if copy else a.stride()
    b_strides = shapes.contiguous_strides(b.shape) if copy else b.stride()
    return _plan(tuple(out_shape), tuple(a.shape), tuple(a_strides), tuple(b.shape), tuple(b_strides), MAX_DIMS)


def _index_type(plan, numel: int) -> str:
    sizes, strides_a, strides_b = plan
    last_a = sum((size - 1) * stride for size, stride in zip(sizes, strides_a))
    last_b = sum((size - 1) * stride for size, stride in zip(sizes, strides_b))
    return "unsigned" if max(numel, last_a + 1, last_b + 1) < INDEX32_LIMIT else "long long"


def _general_class(a: torch.Tensor, b: torch.Tensor, alpha) -> BroadcastClass:
    _check_alpha(alpha)
    _check_operand_dtype("a", a)
    _check_operand_dtype("b", b)
    out_shape = _broadcast_shape(a, b)
    dtype = a.dtype if a.dtype is b.dtype else torch.result_type(a, b)
    a_dtype, b_dtype = _read_dtype(a, dtype), _read_dtype(b, dtype)
    if a.is_cpu or not (type(a) in (_Tensor, torch.nn.Parameter) and type(b) in (_Tensor, torch.nn.Parameter)):
        # the CPU kernel takes any number of dimensions; fake tensors (tracing) may have symbolic sizes
        key = (dtype, a_dtype, b_dtype)
        cls = _SIZELESS.get(key)  # built once (a NamedTuple costs 0.3 us)
        if cls is None:
            cls = _SIZELESS[key] = BroadcastClass(dtype, a_dtype, b_dtype, 0, "")
        return cls
    copy = False
    plan = _cuda_plan(a, b, out_shape, copy)
    if plan is None:
        copy = True
        plan = _cuda_plan(a, b, out_shape, copy)
        if plan is None:  # rare: both inputs are copied out to the result's shape, one flat dimension
            numel = math.prod(out_shape)
            return BroadcastClass(dtype, a_dtype, b_dtype, 1, _index_type(((numel,), (1,), (1,)), numel),
                                  copy=True, expand=True)
    return BroadcastClass(dtype, a_dtype, b_dtype, len(plan[0]), _index_type(plan, math.prod(out_shape)), copy)


def _operands(a: torch.Tensor, b: torch.Tensor, cls: BroadcastClass) -> tuple[torch.Tensor, torch.Tensor]:
    """The inputs as the kernel reads them: a wider 0-d input converted to the result dtype (as torch rounds it
    first), and contiguous copies where the class says so."""
    if a.dtype is not cls.a_dtype:
        a = a.to(cls.a_dtype)
    if b.dtype is not cls.b_dtype:
        b = b.to(cls.b_dtype)
    if cls.expand:
        out_shape = _broadcast(a.shape, b.shape)
        a, b = a.expand(out_shape).contiguous(), b.expand(out_shape).contiguous()
    elif cls.copy:
        a, b = a.contiguous(), b.contiguous()
    return a, b


# ---- Python numbers in a tensor's place ------------------------------------------------------------------------
def coerce(a, b, alpha):
    """A Python number for a or b becomes a 0-d tensor of the result dtype on the other's device, which is how
    torch.add rounds it on the CPU; two numbers make a a 0-d CPU tensor first, as torch.add(2.0, 3.0).  On CUDA,
    beside a 16-bit tensor, torch keeps the number in fp32 (its kernels read scalars in their compute type): the
    number then goes in as alpha, scaling a 0-d one, which the kernel computes in fp32 (`x + 0.1` in bf16 differed
    from torch's in the last place of 3 elements in 15 when 0.1 was rounded to bf16 first).  Called before anything
    else on a call whose a or b is not a plain tensor, never on the common call."""
    a_tensor, b_tensor = isinstance(a, torch.Tensor), isinstance(b, torch.Tensor)
    if a_tensor and b_tensor:
        return a, b, alpha
    if not a_tensor and not b_tensor:
        _check_number("a", a)
        a, a_tensor = torch.tensor(a), True
    if not b_tensor:
        if _scalar_in_fp32(a):
            _check_number("b", b)
            _check_alpha(alpha)
            return a, torch.ones((), dtype=a.dtype, device=a.device), alpha * b
        return a, _number_as_tensor("b", b, a), alpha
    if _scalar_in_fp32(b) and not isinstance(alpha, torch.Tensor) and alpha == 1:
        _check_number("a", a)
        return b, torch.ones((), dtype=b.dtype, device=b.device), a  # a + b == b + a, bit for bit
    return _number_as_tensor("a", a, b), b, alpha


def _scalar_in_fp32(t: torch.Tensor) -> bool:
    return t.device.type == "cuda" and t.dtype in (torch.float16, torch.bfloat16)


def _check_number(name: str, value) -> None:
    if isinstance(value, numbers.Real):
        return
    if isinstance(value, numbers.Complex):
        raise TypeError(f"jitops.add: argument '{name}' is the complex number {value!r}; jitops.add computes real "
                        "floating-point dtypes only (float32, float16, bfloat16, float64)")
    raise TypeError(f"jitops.add: argument '{name}' must be a torch.Tensor or a Python number, got "
                    f"{type(value).__name__}")


def _number_as_tensor(name: str, value, other: torch.Tensor) -> torch.Tensor:
    """torch.result_type(other, value) for the tensors jitops.add takes, in plain Python (torch.compile cannot
    trace torch.result_type): a number takes a floating tensor's dtype; a float beside an integer tensor takes
    the default dtype (that tensor is then rejected by name in the shape class)."""
    _check_number(name, value)
    floating = other.is_floating_point()
    dtype = other.dtype if floating or not isinstance(value, float) else torch.get_default_dtype()
    return torch.full((), value, dtype=dtype, device=other.device)


# ---- CUDA -------------------------------------------------------------------------------------------------------
ADD_CUDA = CudaKernel("add_forward", Source.file("add.cu"), "jitops::add_forward<{T}, {VEC}>", "ptr ptr ptr i64")
ADD_BROADCAST_CUDA = CudaKernel("add_broadcast", Source.file("add_broadcast.cu"),
                                "jitops::add_broadcast<{TA}, {TB}, {T}, {NDIM}, {I}>",
                                "ptr ptr ptr i64 f64" + " i64" * (3 * MAX_DIMS))


def cuda_kernels(cls: AddClass | BroadcastClass, target: Target):
    if cls.contiguous is None:
        return {"broadcast": ADD_BROADCAST_CUDA.bind(
            shapes.dtype_name(cls.dtype), TA=shapes.CUDA_TYPES[cls.a_dtype], TB=shapes.CUDA_TYPES[cls.b_dtype],
            T=shapes.CUDA_TYPES[cls.dtype], NDIM=cls.dims, I=cls.index)}
    return {"forward": ADD_CUDA.bind(shapes.dtype_name(cls.dtype), T=shapes.CUDA_TYPES[cls.dtype], VEC=cls.vec)}


def _grid(n: int, device: int) -> int:
    grid = (n + BLOCK - 1) // BLOCK or 1
    return grid if grid <= UNCAPPED_GRID else elementwise_grid(n, BLOCK, device)


def run_cuda(k, a: torch.Tensor, b: torch.Tensor, alpha=1) -> torch.Tensor:
    cls = k.shape_class
    if not cls.contiguous:
        if cls.contiguous is None:
            return _run_broadcast_cuda(k, a, b, alpha)
        a, b = a.contiguous(), b.contiguous()
    out = torch.empty_like(a)
    n = a.numel()
    if n:
        grid = (n // cls.vec + BLOCK - 1) // BLOCK or 1
        if grid > UNCAPPED_GRID:
            grid = elementwise_grid(n // cls.vec or 1, BLOCK, a.get_device())
        k.forward.launch(grid, BLOCK, a, b, out, n)
    return out


def _run_broadcast_cuda(k, a: torch.Tensor, b: torch.Tensor, alpha) -> torch.Tensor:
    cls = k.shape_class
    a, b = _operands(a, b, cls)
    out_shape = _broadcast(a.shape, b.shape)
    out = torch.empty(out_shape, dtype=cls.dtype, device=a.device)
    n = out.numel()
    if n:
        sizes, strides_a, strides_b = _cuda_plan(a, b, out_shape, False)
        unused = (0,) * (MAX_DIMS - len(sizes))
        k.broadcast.launch(_grid(n, a.get_device()), BLOCK, a, b, out, n, float(alpha), *sizes, *unused,
                           *strides_a, *unused, *strides_b, *unused)
    return out


# ---- CPU --------------------------------------------------------------------------------------------------------
ADD_CPU = CppLibrary("add_cpu", Source.file("cpu/add.cpp"), functions={
    "add_forward": (("ptr", "ptr", "ptr", "i64"), "void"),
    "add_strided": (("ptr", "ptr", "ptr", "i64", "f64", "i32", "ptr"), "void")})


def cpu_kernels(cls: AddClass | BroadcastClass, target: Target):
    compute = CPU_COMPUTE[cls.dtype]
    return {"forward": ADD_CPU.bind(shapes.dtype_name(compute), SCALAR_T=shapes.CPU_TYPES[compute])}


def run_cpu(k, a: torch.Tensor, b: torch.Tensor, alpha=1) -> torch.Tensor:
    cls = k.shape_class
    if cls.contiguous is None or cls.dtype in _CPU_CONVERTS:
        return _run_general_cpu(k, a, b, alpha, cls)
    a, b = a.contiguous(), b.contiguous()
    out = torch.empty_like(a)
    k.forward.add_forward(a, b, out, out.numel())
    return out


_CPU_CONVERTS = {dtype for dtype, compute in CPU_COMPUTE.items() if dtype is not compute}


def _run_general_cpu(k, a: torch.Tensor, b: torch.Tensor, alpha, cls) -> torch.Tensor:
    compute = CPU_COMPUTE[cls.dtype]
    if cls.contiguous is not None:  # one shape, one dtype, alpha == 1, in fp16 or bf16
        a, b = a.contiguous().to(compute), b.contiguous().to(compute)
        out = torch.empty_like(a)
        k.forward.add_forward(a, b, out, out.numel())
        return out.to(cls.dtype)
    # Each input to the result dtype (rounding a wider 0-d one, as torch does), then to the kernel's.
    a, b = _operands(a, b, cls)
    if a.dtype is not compute:
        a = a.to(compute)
    if b.dtype is not compute:
        b = b.to(compute)
    out_shape = _broadcast(a.shape, b.shape)
    out = torch.empty(out_shape, dtype=compute)
    if out.numel():
        sizes, strides_a, strides_b = _plan(tuple(out_shape), tuple(a.shape), a.stride(), tuple(b.shape), b.stride(),
                                            len(out_shape) + 1)
        # A ctypes array, not a tensor: 0.8 against 3.0 us a call on the dev box.
        layout = (ctypes.c_int64 * (3 * len(sizes)))(*sizes, *strides_a, *strides_b)
        k.forward.add_strided(a, b, out, out.numel(), float(alpha), len(sizes), layout)
    return out if compute is cls.dtype else out.to(cls.dtype)


def fake(a: torch.Tensor, b: torch.Tensor, alpha=1) -> torch.Tensor:
    if a.shape == b.shape and a.dtype == b.dtype:
        return torch.empty_like(a, memory_format=torch.contiguous_format)
    return a.new_empty(_broadcast_shape(a, b), dtype=torch.result_type(a, b))


def torch_add(k, a: torch.Tensor, b: torch.Tensor, alpha=1) -> torch.Tensor:
    """torch's own add, contiguous like ours: what a call runs while its kernel compiles in the background."""
    return torch.add(a, b, alpha=alpha).contiguous()


# ---- autograd ---------------------------------------------------------------------------------------------------
def setup_context(ctx, inputs, output) -> None:
    # Only when it is not 1: the first attribute stored on a fresh ctx allocates its __dict__, 0.3-0.6 us of a
    # 12 us call with a gradient on the dev box (tests of the common call measured it).
    if inputs[2] != 1:
        ctx.alpha = inputs[2]


def backward(ctx, grad: torch.Tensor):
    """a's gradient is grad, b's is grad * alpha (scaled first, summed after, in that order as in torch).  The
    autograd engine sums each to its input's shape and casts it to its input's dtype (validate_outputs: torch's
    own AddBackward0 relies on the same), so the forward saves no shapes or dtypes (storing them cost 0.5 us a
    call on the dev box)."""
    alpha = getattr(ctx, "alpha", 1)
    return grad, (grad if alpha == 1 or not ctx.needs_input_grad[1] else grad * alpha)


add = op(
    "jitops::add(Tensor a, Tensor b, Scalar alpha=1) -> Tensor",
    shape_class=shape_class,
    cuda=Impl(cuda_kernels, run_cuda),
    cpu=Impl(cpu_kernels, run_cpu),
    fake=fake,
    setup_context=setup_context,
    backward=backward,
    keyword_only=("alpha",),
    coerce=coerce,
    doc=__doc__,
    fallback=torch_add,
)


# Common shape classes, for `python -m jitops` and `cache_tools prewarm --all-builtin` (manifest items).
PREWARM = [{"op": "add", "dtypes": ["fp32", "fp16", "bf16"], "shapes": [[[4096, 4096], [4096, 4096]]], "kwargs": {}}]
