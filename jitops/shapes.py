"""Shape-class helpers and input checks.  Pure: no GPU, and safe on fake and meta tensors.

A shape class is the handful of input facts that change the compiled code.  Everything else stays a runtime
argument, so one compiled kernel serves every size in its class.
"""
from __future__ import annotations

import math
from typing import Iterable, NamedTuple, Sequence

import torch

DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64",
    torch.int32: "i32", torch.int64: "i64", torch.int8: "i8", torch.uint8: "u8", torch.bool: "bool",
}
DTYPES_BY_NAME: dict[str, torch.dtype] = {v: k for k, v in DTYPE_NAMES.items()}
DTYPES_BY_NAME.update({"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                       "float64": torch.float64, "half": torch.float16, "float": torch.float32,
                       "double": torch.float64})

# C++ spellings inside kernels/ (cuda_fp16.h, cuda_bf16.h).
CUDA_TYPES: dict[torch.dtype, str] = {
    torch.float32: "float", torch.float16: "__half", torch.bfloat16: "__nv_bfloat16", torch.float64: "double",
}
CPU_TYPES: dict[torch.dtype, str] = {torch.float32: "float", torch.float64: "double"}
# The dtype the C++ CPU kernels (add, gelu, layer_norm) compute each dtype in: fp16 and bf16 go through
# the fp32 kernel on fp32 copies with one rounding at the end, which is how torch's CPU kernels compute them
# (arithmetic in float), at no kernel build of their own.
CPU_COMPUTE: dict[torch.dtype, torch.dtype] = {torch.float32: torch.float32, torch.float64: torch.float64,
                                               torch.float16: torch.float32, torch.bfloat16: torch.float32}
# Bytes per element of the dtypes CUDA kernels take; a lookup doubles as the dtype check on hot paths.
CUDA_ITEMSIZE: dict[torch.dtype, int] = {dtype: dtype.itemsize for dtype in CUDA_TYPES}


def dtype_name(dtype: torch.dtype) -> str:
    return DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def parse_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES_BY_NAME[name.strip().lower().removeprefix("torch.")]
    except KeyError:
        raise ValueError(f"jitops: unknown dtype {name!r}; use one of fp32, fp16, bf16, fp64") from None


def _address(t: torch.Tensor) -> int:
    """The start address, or for fake tensors (no address) the storage offset in bytes: their storage is
    taken as allocator-aligned (torch's caching allocator returns 512-byte aligned blocks).  Meta tensors
    report address 0 plus nothing for the offset, so they use the offset too.  Exact types, not isinstance:
    a fake tensor made from a Parameter passes isinstance(t, Parameter) (torch.compile's parameters do), and
    reading its data pointer raises."""
    if (type(t) is torch.Tensor or type(t) is torch.nn.Parameter) and not t.is_meta:
        return t.data_ptr()
    return t.storage_offset() * t.element_size()


def byte_alignment(t: torch.Tensor, cap: int = 16) -> int:
    """Largest power of two <= cap that divides the tensor's start address."""
    address = _address(t)
    alignment = cap
    while alignment > 1 and address % alignment:
        alignment //= 2
    return alignment


def pair_vector_width(a: torch.Tensor, b: torch.Tensor, max_bytes: int = 16) -> int:
    """vector_width((a, b)) for the common two-operand case, in a third of the time (it runs every call)."""
    itemsize = a.element_size()
    if type(a) is torch.Tensor and type(b) is torch.Tensor and not a.is_meta and not b.is_meta:
        address = a.data_ptr() | b.data_ptr()  # the common case without two calls of _address
    else:
        address = _address(a) | _address(b)
    width = max_bytes // itemsize
    while width > 1 and address % (width * itemsize):
        width >>= 1
    return width


def vector_width(tensors: Iterable[torch.Tensor], row: int | None = None, max_bytes: int = 16) -> int:
    """Elements per vector access that every tensor's start (and the row length, if given) allows."""
    tensors = tuple(tensors)
    itemsize = tensors[0].element_size()
    address = 0
    for t in tensors:
        address |= _address(t)
    width = max_bytes // itemsize
    while width > 1 and (address % (width * itemsize) or (row is not None and row % width)):
        width //= 2
    return width


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def needs_int64(*tensors: torch.Tensor) -> bool:
    """Whether offsets into these tensors can pass 2**31 - 1 elements (then index math must be 64-bit)."""
    return any(t.numel() >= 2**31 - 1 for t in tensors)


# ---- input checks: each error names the op and the argument and says what is accepted -------------------------
def check_tensor(op: str, name: str, value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"jitops.{op}: argument '{name}' must be a torch.Tensor, got {type(value).__name__}")
    return value


def check_dtype(op: str, name: str, t: torch.Tensor, allowed: Sequence[torch.dtype]) -> None:
    if t.dtype not in allowed:
        names = ", ".join(str(d).removeprefix("torch.") for d in allowed)
        raise TypeError(f"jitops.{op}: argument '{name}' has dtype {str(t.dtype).removeprefix('torch.')} on "
                        f"{t.device.type}; supported there: {names}")


def check_same_dtype(op: str, reference: tuple[str, torch.Tensor], *others: tuple[str, torch.Tensor | None]) -> None:
    ref_name, ref = reference
    for name, t in others:
        if t is not None and t.dtype != ref.dtype:
            raise TypeError(f"jitops.{op}: argument '{name}' has dtype {str(t.dtype).removeprefix('torch.')} but "
                            f"'{ref_name}' has {str(ref.dtype).removeprefix('torch.')}; they must match")


def check_shape(op: str, name: str, t: torch.Tensor, expected: Sequence[int], what: str = "") -> None:
    if tuple(t.shape) != tuple(expected):
        extra = f" ({what})" if what else ""
        raise ValueError(f"jitops.{op}: argument '{name}' has shape {tuple(t.shape)}, expected "
                         f"{tuple(expected)}{extra}")


def check_same_shape(op: str, reference: tuple[str, torch.Tensor], *others: tuple[str, torch.Tensor]) -> None:
    ref_name, ref = reference
    for name, t in others:
        if t.shape != ref.shape:
            raise ValueError(f"jitops.{op}: argument '{name}' has shape {tuple(t.shape)} but '{ref_name}' has "
                             f"{tuple(ref.shape)}; they must match (jitops ops do not broadcast)")


# ---- describing a call without running it ----------------------------------------------------------------------
def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(int(size), 1)
    return tuple(reversed(strides))


def placeholder(like: torch.Tensor, shape: Sequence[int], dtype: torch.dtype | None = None,
                stride: Sequence[int] | None = None) -> torch.Tensor:
    """A tensor that holds no memory, for an argument of a call that is described rather than run (an op's
    companions: its backward's gradient, saved statistics).  Meta when `like` is a real tensor, so that
    prefetching a GPU call's backward allocates nothing; otherwise of like's kind: meta, or a fake CPU tensor
    when a manifest is expanded for the CPU, whose shape classes must see a CPU tensor."""
    shape = tuple(int(s) for s in shape)
    stride = tuple(stride) if stride is not None else contiguous_strides(shape)
    dtype = dtype or like.dtype
    if type(like) in (torch.Tensor, torch.nn.Parameter) and not like.is_meta:
        return torch.empty_strided(shape, stride, dtype=dtype, device="meta")
    return like.new_empty_strided(shape, stride, dtype=dtype)


# ---- a strided dgrad's residues --------------------------------------------------------------------------------
class Phase1D(NamedTuple):
    """One residue of a strided dgrad along one dimension: dx's rows start, start + stride, ... (count of them),
    reached by the filter taps `taps` (evenly spaced; none: those rows are zeros), as a unit-stride dgrad with
    padding (lower, upper) and tap spacing `dilation` in dy."""
    start: int
    count: int
    taps: tuple[int, ...]
    lower: int
    upper: int
    dilation: int


def dgrad_residues(size: int, out_size: int, kernel: int, stride: int, padding: int, dilation: int) -> list[Phase1D]:
    """Every residue of one dimension, each row written by exactly one of them (so dx needs no zeroing).

    dx[h] = sum over taps r, outputs o with h = o * stride - padding + r * dilation of dy[o] . w[r].  For
    h = a + stride * i the taps are those with (a + padding - r * dilation) % stride == 0, spaced stride / g apart
    (g = gcd(stride, dilation)), and o = i + e0 - j * (dilation / g) for the j-th of them: a unit-stride dgrad with
    lower padding e0 and dilation dilation / g.  Rows whose taps read only outside dy read TMA's zero fill.
    The light kernel runs them all (light_conv.dgrad_phases); CUTLASS's unit-stride dgrad, the ones with taps,
    clipped to the rows whose taps read inside dy, dx zeroed first (conv2d_plan.dgrad_phases_1d)."""
    phases = []
    sub_dilation = dilation // math.gcd(stride, dilation)
    for a in range(min(stride, size)):
        count = len(range(a, size, stride))
        taps = tuple(r for r in range(kernel) if (a + padding - r * dilation) % stride == 0)
        if not taps:
            phases.append(Phase1D(a, count, (), 0, out_size - count, 1))  # zeros; dy's extent, no tap
            continue
        e0 = (a + padding - taps[0] * dilation) // stride
        span = (len(taps) - 1) * sub_dilation
        phases.append(Phase1D(a, count, taps, e0, out_size - count - e0 + span,
                              sub_dilation if len(taps) > 1 else 1))
    return phases
