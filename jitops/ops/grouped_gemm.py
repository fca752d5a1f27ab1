"""jitops.grouped_gemm: many matrix products in one grouped-GEMM launch, with gradients.

    outs = jitops.grouped_gemm([A_0, A_1, ...], [B_0, B_1, ...])     # list form: outs[i] = A_i @ B_i
    y = jitops.grouped_gemm(x, w, offsets=offsets)                   # ragged form (mixture of experts)
    y = jitops.grouped_gemm(x, w, sizes=sizes)                       #   x (sum M_g, K), w (G, K, N) -> (sum M_g, N)

List form: A_i (M_i, K_i) and B_i (K_i, N_i), any sizes per group; the result is a list of (M_i, N_i).
Ragged form, like torch._grouped_mm: `offsets` holds the G cumulative end offsets of the groups along the
ragged dimension (int32 or int64; offsets[-1] must equal its extent T), or `sizes` the G group sizes.  Three
cases, told apart by the operands' dimensions; each one's gradients are the other two, so gradients of any
order flow:
    a (T, K)    @ b (G, K, N) -> (T, N)       ragged M: rows offsets[g-1]:offsets[g] of a use expert g
    a (M, T)    @ b (T, N)    -> (G, M, N)    ragged K: the weight gradient, a reduction over each group
    a (G, M, K) @ b (K, T)    -> (M, T)       ragged N (returned as a transposed view)
Empty groups work: they give zero rows (ragged M/N) or a zero matrix (ragged K).

CUDA, Hopper (sm_90a), bf16 and fp16, fp32 accumulation: the light GEMM kernel's grouped forms
(jitops/light_grouped.py: NVRTC, under a second to compile, one kernel per form and layout), or with
JITOPS_GROUPED_GEMM_SM90_KERNEL=cutlass a CUTLASS 3 ptr-array grouped GEMM (kernels/grouped_gemm/grouped_gemm.cu,
nvcc, about 40 s a kernel); the light kernels ran level with it or faster on bench_grouped_gemm's cases
(docs/benchmarks.md).  Other GPUs run the ATen loop below.  The layout of each operand (row- or column-major) comes
from its strides and picks the compiled kernel, so the backward runs on transposed views (dA = dC·Bᵀ,
dB = Aᵀ·dC) with no transposed copies.

The ragged form finds each group's rows on the GPU from the device offsets: no device-to-host copy.  Offsets
on the GPU are therefore not read on the host: a bad offsets tensor gives wrong numbers (never an out-of-bounds
access); pass check_offsets=True to validate them at the cost of one sync.  Offsets on the CPU, and `sizes`
given as a list, are always validated.

Operands whose leading dimensions or contiguous extents are not multiples of 8 elements (16 bytes, which TMA
needs) or whose layout the kernel cannot read are copied to a layout it can; when no copy helps (K or N not a
multiple of 8) the call falls back to an ATen loop over the groups, which for the ragged form reads the offsets
on the host (one sync).  Benchmarks: docs/benchmarks.md; the tile configurations: grouped_gemm_plan.py.

CPU (fp32, fp64, bf16, fp16): ATen matmuls in a loop over the groups, for CI and gradcheck.

The first call with inputs that need a gradient starts compiling the backward kernels in background threads
while the forward kernel compiles, so the first backward waits for at most the slowest of them.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from .. import light_grouped, shapes
from ..config import config
from ..launch import host_to_device
from ..op import Impl, op, public
from ..specs import CudaLibrary, Source, Target
from .grouped_gemm_plan import (ALIGN_BYTES, ATEN, COL, NOTHING, ROW, GemmKernelClass, ListClass, RaggedClass, _as_is,
                                _config, _decide, is_light)
from .grouped_gemm_run import (OFFSET_DTYPES, _check_offsets_dtype, _group_bounds, _ragged_out, run_list_cpu,
                               run_list_cuda, run_ragged_cpu, run_ragged_cuda)


CUDA_DTYPES = (torch.bfloat16, torch.float16)
CPU_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
ELEMENTS = {torch.bfloat16: "cutlass::bfloat16_t", torch.float16: "cutlass::half_t"}


# ---- kernels -----------------------------------------------------------------------------------------------------
GROUPED_GEMM = CudaLibrary(
    "grouped_gemm", Source.file("grouped_gemm/grouped_gemm.cu"),
    functions={
        "jg_workspace_bytes": (("i32", "i32"), "i64"),
        "jg_run_ragged": (("i32", "i32", "ptr", "i64", "i32", "i32", "i32", "ptr", "i64", "i64", "ptr", "i64",
                           "i64", "ptr", "i64", "i64", "ptr", "i64", "i32", "i32", "i32", "i32", "ptr"), "i32"),
        "jg_run_list": (("i32", "ptr", "ptr", "ptr", "i64", "i32", "i32", "i32", "ptr"), "i32"),
        "jg_error_string": (("i32",), "ptr"),
    },
    arch_specific=True)


def _kernels(cls: Any, target: Target) -> dict:
    """The grouped GEMM for a class on Hopper (sm_90a): the light kernel of its form, or CUTLASS's (one kernel
    for every form); none on the CPU, on other GPUs (the ATen loop runs there) or when there is nothing to
    launch."""
    kernel = cls.kernel
    if kernel.config in (ATEN, NOTHING) or target.device_type == "cpu" or target.capability[0] != 9:
        return {}
    if is_light(kernel.config):
        form = "list" if isinstance(cls, ListClass) else "K" if cls.mode == "K" else "M"
        return {"light": light_grouped.request(kernel, form)}
    return {"gemm": GROUPED_GEMM.bind(shapes.dtype_name(kernel.dtype), JG_ELEMENT=ELEMENTS[kernel.dtype],
                                      JG_A_ROW=int(kernel.a_row), JG_B_ROW=int(kernel.b_row),
                                      JG_CONFIG=kernel.config)}


# ---- ragged form: jitops::grouped_gemm_ragged ----------------------------------------------------------------
def _ragged_dims(a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor,
                 name: str = "offsets") -> tuple[str, int, int, int, int, int]:
    """(mode, G, T, M, N, K) with the argument checks; errors name the argument (`name`: 'offsets', or 'sizes'
    when the caller gave group sizes)."""
    if a.dim() == 2 and b.dim() == 3:
        mode, groups = "M", b.shape[0]
        (total, k), (_, k_b, n), m = a.shape, b.shape, 0
        if k_b != k:
            raise ValueError(f"jitops.grouped_gemm: argument 'b' has shape {tuple(b.shape)}: its K (dim 1) is "
                             f"{k_b} but 'a' {tuple(a.shape)} has K = {k}; they must match")
    elif a.dim() == 2 and b.dim() == 2:
        mode, groups = "K", offsets.shape[0] if offsets.dim() == 1 else -1
        (m, total), (t_b, n), k = a.shape, b.shape, 0
        if t_b != total:
            raise ValueError(f"jitops.grouped_gemm: argument 'b' has shape {tuple(b.shape)} but 'a' has "
                             f"{tuple(a.shape)}: the ragged dimension (a's dim 1, b's dim 0) must match")
    elif a.dim() == 3 and b.dim() == 2:
        mode, groups = "N", a.shape[0]
        (_, m, k), (k_b, total), n = a.shape, b.shape, 0
        if k_b != k:
            raise ValueError(f"jitops.grouped_gemm: argument 'b' has shape {tuple(b.shape)}: its K (dim 0) is "
                             f"{k_b} but 'a' {tuple(a.shape)} has K = {k}; they must match")
    else:
        raise ValueError(f"jitops.grouped_gemm: arguments 'a' {tuple(a.shape)} and 'b' {tuple(b.shape)}: the "
                         "ragged form takes a 2-D a with a 3-D b (ragged M), 2-D with 2-D (ragged K) or 3-D with "
                         "2-D (ragged N); for a list of matrices pass Python lists")
    if offsets.dim() != 1 or offsets.shape[0] != groups:
        what = "group size" if name == "sizes" else "cumulative end offset"
        raise ValueError(f"jitops.grouped_gemm: argument '{name}' has shape {tuple(offsets.shape)}; expected "
                         f"({groups},): one {what} per group")
    return mode, groups, total, m, n, k


# Shape classes of plain tensors, by the facts they depend on (shapes, strides, dtype, device kind, 16-byte
# alignment of the data): computing one walks every operand's strides (~10 us for the ragged form, ~5 us a group
# for the list form); looking it up costs ~1 us plus ~0.5 us a group.
_CLASSES: dict[tuple, Any] = {}
_CLASSES_MAX = 4096
_Tensor = torch.Tensor


def _remember(key: tuple, cls: Any) -> Any:
    if len(_CLASSES) >= _CLASSES_MAX:
        _CLASSES.clear()
    _CLASSES[key] = cls
    return cls


def ragged_shape_class(a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor) -> RaggedClass:
    if type(a) is _Tensor and type(b) is _Tensor and type(offsets) is _Tensor:  # not fake: sizes are ints
        key = (a.dtype, a.is_cpu, a.shape, a.stride(), b.dtype, b.shape, b.stride(), offsets.shape,
               (a.data_ptr() | b.data_ptr()) & 15, config.grouped_gemm_config, config.grouped_gemm_sm90_kernel)
        cls = _CLASSES.get(key)
        return cls if cls is not None else _remember(key, _ragged_shape_class(a, b, offsets))
    return _ragged_shape_class(a, b, offsets)


def _ragged_shape_class(a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor) -> RaggedClass:
    if a.dtype != b.dtype:
        shapes.check_same_dtype("grouped_gemm", ("a", a), ("b", b))
    allowed = CPU_DTYPES if a.is_cpu else CUDA_DTYPES
    if a.dtype not in allowed:
        shapes.check_dtype("grouped_gemm", "a", a, allowed)
    mode, groups, total, m, n, k = _ragged_dims(a, b, offsets)
    if a.is_cpu:
        return RaggedClass(mode, GemmKernelClass(a.dtype, True, True, ATEN), None, None)
    empty = {"M": (total, n, k), "K": (total, m, n), "N": (total, m, k)}[mode]
    if groups == 0 or 0 in empty:  # the result is empty or all zeros
        return RaggedClass(mode, GemmKernelClass(a.dtype, True, True, NOTHING), None, None)
    elements = ALIGN_BYTES // a.element_size()
    if mode == "N":  # D (M, T) = (bᵀ (T, K) @ aᵀ (G, K, M))ᵀ: ragged M on the transposes
        a, b = b.mT, a.mT
        m, n = 0, m
    if mode in ("M", "N"):  # a (T, K) ragged rows, b (G, K, N)
        layout_a, copy_a = _decide([_as_is(a, total, k, elements)], {ROW: k % elements == 0}, ROW)
        layout_b, copy_b = _decide([_as_is(b, k, n, elements, grouped=True)],
                                   {ROW: n % elements == 0, COL: k % elements == 0})
    else:  # a (M, T) ragged columns, b (T, N) ragged rows
        layout_a, copy_a = _decide([_as_is(a, m, total, elements)], {COL: m % elements == 0}, COL)
        layout_b, copy_b = _decide([_as_is(b, total, n, elements)], {ROW: n % elements == 0}, ROW)
    if layout_a is None or layout_b is None or n % elements:
        return RaggedClass(mode, GemmKernelClass(a.dtype, True, True, ATEN), None, None)
    kernel = GemmKernelClass(a.dtype, layout_a == ROW, layout_b == ROW, _config(n))
    return RaggedClass(mode, kernel, layout_a if copy_a[0] else None, layout_b if copy_b[0] else None)


def ragged_fake(a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    _check_offsets_dtype(offsets)
    return _ragged_out(a, b, offsets, ragged_shape_class(a, b, offsets).mode)


def ragged_setup_context(ctx, inputs, output) -> None:
    a, b, offsets = inputs
    ctx.save_for_backward(a, b, offsets)


def ragged_backward(ctx, grad: torch.Tensor):
    """d(a @ b) per group: da = grad·bᵀ, db = aᵀ·grad, each another ragged case on transposed views."""
    a, b, offsets = ctx.saved_tensors
    need_a, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    da = grouped_gemm_ragged(grad, b.mT, offsets) if need_a else None
    db = grouped_gemm_ragged(a.mT, grad, offsets) if need_b else None
    return da, db, None


def ragged_companions(a, b, offsets, *, needs):
    """ragged_backward's calls: each gradient is another ragged case on transposed views."""
    mode = _ragged_dims(a, b, offsets)[0]
    rows, cols = {"M": (a.shape[0], b.shape[2]), "K": (a.shape[0], b.shape[1]), "N": (b.shape[1], a.shape[1])}[mode]
    if mode == "K":
        out = shapes.placeholder(a, (offsets.shape[0], rows, cols))
    elif mode == "M":
        out = shapes.placeholder(a, (rows, cols))
    else:  # returned as a transposed view
        out = shapes.placeholder(a, (a.shape[1], b.shape[1]), stride=(1, a.shape[1]))
    calls = []
    if needs[0]:
        calls.append((grouped_gemm_ragged, (out, b.mT, offsets)))
    if needs[1]:
        calls.append((grouped_gemm_ragged, (a.mT, out, offsets)))
    return calls


grouped_gemm_ragged = op(
    "jitops::grouped_gemm_ragged(Tensor a, Tensor b, Tensor offsets) -> Tensor",
    shape_class=ragged_shape_class,
    cuda=Impl(_kernels, run_ragged_cuda),
    cpu=Impl(_kernels, run_ragged_cpu),
    fake=ragged_fake,
    setup_context=ragged_setup_context,
    backward=ragged_backward,
    companions=ragged_companions,
    doc="The ragged form of jitops.grouped_gemm with device offsets (see jitops.grouped_gemm).",
    fallback=run_ragged_cpu,  # the ATen loop while the kernels compile
)


# ---- list form: jitops::grouped_gemm_list --------------------------------------------------------------------
def list_shape_class(As: Sequence[torch.Tensor], Bs: Sequence[torch.Tensor]) -> ListClass:
    if len(As) == len(Bs) and all(type(t) is _Tensor for t in As) and all(type(t) is _Tensor for t in Bs):
        address = 0
        facts: list[Any] = [config.grouped_gemm_config, config.grouped_gemm_sm90_kernel]
        for a, b in zip(As, Bs):
            address |= a.data_ptr() | b.data_ptr()
            facts += (a.dtype, a.is_cpu, a.shape, a.stride(), b.dtype, b.is_cpu, b.shape, b.stride())
        key = (address & 15, *facts)
        cls = _CLASSES.get(key)
        return cls if cls is not None else _remember(key, _list_shape_class(As, Bs))
    return _list_shape_class(As, Bs)


def _list_shape_class(As: Sequence[torch.Tensor], Bs: Sequence[torch.Tensor]) -> ListClass:
    if len(As) != len(Bs):
        raise ValueError(f"jitops.grouped_gemm: arguments 'As' and 'Bs' have {len(As)} and {len(Bs)} "
                         "matrices; they must pair up")
    if not As:
        return ListClass(GemmKernelClass(torch.float32, True, True, ATEN), (), ())
    first = As[0]
    dtype = first.dtype
    allowed = CPU_DTYPES if first.is_cpu else CUDA_DTYPES
    for i, (a, b) in enumerate(zip(As, Bs)):
        if a.dim() != 2 or b.dim() != 2:
            name, t = (f"As[{i}]", a) if a.dim() != 2 else (f"Bs[{i}]", b)
            raise ValueError(f"jitops.grouped_gemm: argument '{name}' has shape {tuple(t.shape)}; the list "
                             "form takes 2-D matrices")
        if a.shape[1] != b.shape[0]:
            raise ValueError(f"jitops.grouped_gemm: argument 'Bs[{i}]' has shape {tuple(b.shape)} but 'As[{i}]' "
                             f"has {tuple(a.shape)}: K (As[{i}].shape[1], Bs[{i}].shape[0]) must match")
        if a.dtype != dtype:
            shapes.check_same_dtype("grouped_gemm", ("As[0]", first), (f"As[{i}]", a))
        if b.dtype != dtype:
            shapes.check_same_dtype("grouped_gemm", ("As[0]", first), (f"Bs[{i}]", b))
    if dtype not in allowed:
        shapes.check_dtype("grouped_gemm", "As[0]", first, allowed)
    if first.is_cpu:
        return ListClass(GemmKernelClass(dtype, True, True, ATEN), (), ())
    elements = ALIGN_BYTES // first.element_size()
    readable_a: list[tuple[str, ...] | None] = []
    readable_b: list[tuple[str, ...] | None] = []
    copyable_a = {ROW: True, COL: True}
    copyable_b = {ROW: True, COL: True}
    live = 0
    widest = 0
    n_ok = True
    for a, b in zip(As, Bs):
        (m, k), n = a.shape, b.shape[1]
        if m == 0 or n == 0 or k == 0:  # not launched
            readable_a.append(None)
            readable_b.append(None)
            continue
        live += 1
        widest = max(widest, n)
        n_ok &= n % elements == 0  # D_i is row-major
        readable_a.append(_as_is(a, m, k, elements))
        readable_b.append(_as_is(b, k, n, elements))
        copyable_a[ROW] &= k % elements == 0
        copyable_a[COL] &= m % elements == 0
        copyable_b[ROW] &= n % elements == 0
        copyable_b[COL] &= k % elements == 0
    if not live:
        return ListClass(GemmKernelClass(dtype, True, True, NOTHING), (), ())
    layout_a, copy_a = _decide(readable_a, copyable_a)
    layout_b, copy_b = _decide(readable_b, copyable_b)
    if layout_a is None or layout_b is None or not n_ok:
        return ListClass(GemmKernelClass(dtype, True, True, ATEN), (), ())
    kernel = GemmKernelClass(dtype, layout_a == ROW, layout_b == ROW, _config(widest))
    return ListClass(kernel, copy_a, copy_b)


def list_fake(As: Sequence[torch.Tensor], Bs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [a.new_empty((a.shape[0], b.shape[1])) for a, b in zip(As, Bs)]


def list_setup_context(ctx, inputs, output) -> None:
    As, Bs = inputs
    ctx.groups = len(As)
    ctx.save_for_backward(*As, *Bs)


def list_backward(ctx, grads: Sequence[torch.Tensor | None]):
    """dA_i = dC_i·B_iᵀ and dB_i = A_iᵀ·dC_i, each set in one grouped launch, only for the list elements that
    need a gradient (and have an incoming one)."""
    saved = ctx.saved_tensors
    As, Bs = saved[:ctx.groups], saved[ctx.groups:]
    need_a, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    if not isinstance(need_a, (list, tuple)):  # an empty list, or an older torch: one flag for the list
        need_a = [bool(need_a)] * ctx.groups
        need_b = [bool(need_b)] * ctx.groups
    dAs: list[torch.Tensor | None] = [None] * ctx.groups
    dBs: list[torch.Tensor | None] = [None] * ctx.groups
    which_a = [i for i in range(ctx.groups) if need_a[i] and grads[i] is not None]
    which_b = [i for i in range(ctx.groups) if need_b[i] and grads[i] is not None]
    if which_a:
        for i, g in zip(which_a, grouped_gemm_list([grads[i] for i in which_a], [Bs[i].mT for i in which_a])):
            dAs[i] = g
    if which_b:
        for i, g in zip(which_b, grouped_gemm_list([As[i].mT for i in which_b], [grads[i] for i in which_b])):
            dBs[i] = g
    return dAs, dBs


def list_companions(As, Bs, *, needs):
    """list_backward's calls: dA_i = dC_i . B_i^T and dB_i = A_i^T . dC_i, each list in one launch."""
    outs = [shapes.placeholder(a, (a.shape[0], b.shape[1])) for a, b in zip(As, Bs)]
    calls = []
    if needs[0]:
        calls.append((grouped_gemm_list, (outs, [b.mT for b in Bs])))
    if needs[1]:
        calls.append((grouped_gemm_list, ([a.mT for a in As], outs)))
    return calls


grouped_gemm_list = op(
    "jitops::grouped_gemm_list(Tensor[] As, Tensor[] Bs) -> Tensor[]",
    shape_class=list_shape_class,
    cuda=Impl(_kernels, run_list_cuda),
    cpu=Impl(_kernels, run_list_cpu),
    fake=list_fake,
    setup_context=list_setup_context,
    backward=list_backward,
    companions=list_companions,
    doc="The list form of jitops.grouped_gemm (see jitops.grouped_gemm).",
    fallback=run_list_cpu,  # the ATen loop while the kernels compile
)


# ---- the public function ---------------------------------------------------------------------------------------
def _offsets_for(a: torch.Tensor, b: torch.Tensor, offsets: Any, sizes: Any, check_offsets: bool) -> torch.Tensor:
    if (offsets is None) == (sizes is None):
        raise TypeError("jitops.grouped_gemm: the ragged form needs exactly one of 'offsets' (cumulative group "
                        "ends) or 'sizes' (group sizes)")
    compiling = torch.compiler.is_compiling()
    name = "offsets" if sizes is None else "sizes"
    value = offsets if sizes is None else sizes
    if not isinstance(value, torch.Tensor):
        if compiling:
            value = torch.tensor(value, dtype=torch.int64)
        else:
            try:
                value = torch.tensor([int(v) for v in value], dtype=torch.int64)
            except (TypeError, ValueError):
                raise TypeError(f"jitops.grouped_gemm: argument '{name}' must be a tensor or a sequence of ints, "
                                f"got {type(value).__name__}") from None
    if value.dtype not in OFFSET_DTYPES:
        raise TypeError(f"jitops.grouped_gemm: argument '{name}' has dtype "
                        f"{str(value.dtype).removeprefix('torch.')}; use int32 or int64")
    if value.dim() != 1:
        raise ValueError(f"jitops.grouped_gemm: argument '{name}' has shape {tuple(value.shape)}; expected 1-D")
    on_host = value.is_cpu
    if sizes is not None:
        if on_host and not compiling and bool((value < 0).any()):
            raise ValueError("jitops.grouped_gemm: argument 'sizes' has a negative group size")
        value = torch.cumsum(value, 0, dtype=torch.int32)
    if not compiling and (on_host or check_offsets) and not isinstance(value, torch._subclasses.FakeTensor):
        mode, _, total, _, _, _ = _ragged_dims(a, b, value, name)
        _group_bounds(value.cpu(), total, name)
    if value.device != a.device:
        if on_host and a.is_cuda and not compiling:
            return host_to_device(value, a.device)  # no wait for the stream
        value = value.to(a.device, non_blocking=True)
    return value


def grouped_gemm(a, b, offsets=None, *, sizes=None, check_offsets: bool = False):
    """Grouped matrix products in one CUTLASS launch; see the module docstring (jitops.ops.grouped_gemm).

    grouped_gemm([A_0, ...], [B_0, ...]) -> [A_0 @ B_0, ...]
    grouped_gemm(x (T, K), w (G, K, N), offsets=... or sizes=...) -> (T, N), rows of group g times w[g]
    """
    if isinstance(a, (list, tuple)):
        if offsets is not None or sizes is not None:
            raise TypeError("jitops.grouped_gemm: the list form takes no 'offsets' or 'sizes'")
        if not isinstance(b, (list, tuple)):
            raise TypeError(f"jitops.grouped_gemm: 'As' is a list, so 'Bs' must be one too, got {type(b).__name__}")
        As, Bs = list(a), list(b)
        if not As and not Bs:
            raise ValueError("jitops.grouped_gemm: arguments 'As' and 'Bs' are empty lists; give at least one pair "
                             "of matrices (their device and dtype say where and how to run)")
        if (As and torch.is_grad_enabled() and not torch.compiler.is_compiling() and As[0].is_cuda
                and any(t.requires_grad for t in (*As, *Bs))):
            grouped_gemm_list.op.prefetch(As, Bs)
        return grouped_gemm_list(As, Bs)
    a = shapes.check_tensor("grouped_gemm", "a", a)
    b = shapes.check_tensor("grouped_gemm", "b", b)
    offsets = _offsets_for(a, b, offsets, sizes, check_offsets)
    return grouped_gemm_ragged(a, b, offsets)


def _form(shapes_, kwargs):
    """Which form a manifest call of jitops.grouped_gemm is: lists of shapes for As and Bs (the list form), or
    a, b and offsets, where `sizes` (group sizes, as jitops.grouped_gemm takes them) stands for offsets."""
    if shapes_ and isinstance(shapes_[0], list) and (not shapes_[0] or isinstance(shapes_[0][0], list)):
        return grouped_gemm_list, shapes_, kwargs
    kwargs = dict(kwargs)
    kwargs.pop("check_offsets", None)
    sizes = kwargs.pop("sizes", None)
    if sizes is not None:
        if not isinstance(sizes, list):
            raise ValueError("jitops.grouped_gemm: argument 'sizes' must be a list of group sizes in a manifest")
        shapes_ = [*shapes_[:2], [len(sizes)]]
    return grouped_gemm_ragged, shapes_, kwargs


def _bind(a, b, offsets=None, *, sizes=None, check_offsets=False):
    """A call of grouped_gemm() above as a call of its list or ragged op (sizes become offsets of that shape)."""
    if isinstance(a, (list, tuple)):
        return grouped_gemm_list, (list(a), list(b))
    if offsets is None and sizes is not None:
        offsets = shapes.placeholder(a, (len(sizes),), dtype=torch.int64)
    return grouped_gemm_ragged, (a, b, offsets)


public("grouped_gemm", grouped_gemm, entries=(grouped_gemm_list, grouped_gemm_ragged), form=_form, bind=_bind)

# Common shape classes, for `cache_tools prewarm --all-builtin` (manifest items).  Each form's forward and both
# gradients use three light kernels: ragged M with B N-major (y = x @ w) and K-major (dx = dy @ w^T), ragged K
# (dw = x^T @ dy); the list form's forward, dA and dB likewise.  Widths of 128 take 128 x 128 tiles, wider ones
# 128 x 256 (grouped_gemm_plan.LIGHT_CONFIGS): a 128-wide N, then a 128-wide K (dx's N), cover both tiles for
# every layout of a training step, in bf16 and fp16 (24 kernels).
PREWARM = [
    {"op": "grouped_gemm", "dtypes": ["bf16", "fp16"], "kwargs": {},
     "shapes": [[[9216, 2048], [64, 2048, 1024], [64]],                               # y = x @ w
                [[9216, 2048], [64, 2048, 128], [64]],
                [[9216, 128], [64, 128, 1024], [64]]]},
    {"op": "grouped_gemm", "dtypes": ["bf16", "fp16"], "kwargs": {},
     "shapes": [[[[2048, 4096]] * 8, [[4096, 4096]] * 8],                            # list forward
                [[[2048, 4096]] * 8, [[4096, 128]] * 8],
                [[[2048, 128]] * 8, [[128, 4096]] * 8]]},
]
