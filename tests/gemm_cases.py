"""The jitops.gemm calls the GPU tests make, as data: the tests run them, and tools/prebuild_gemm.py builds
their kernels (forward and backward) on a machine without a GPU, so the lent GPU compiles nothing."""
from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from bench_gemm import FUSED_SHAPES, SHAPES  # noqa: E402  (the benchmark's shapes, for the bit-for-bit test)

BF16, FP16 = torch.bfloat16, torch.float16


@dataclass(frozen=True)
class Case:
    m: int
    k: int
    n: int
    dtype: torch.dtype = BF16
    a_t: bool = False           # a is the transposed view of a (K, M) matrix: column-major
    b_t: bool = False           # b is the transposed view of an (N, K) matrix: column-major
    bias: bool = False
    activation: str | None = None
    out_dtype: torch.dtype | None = None
    offset: int = 0             # a starts this many elements into its buffer (misaligned address)
    family: str = "auto"
    grad: bool = True

    @property
    def id(self) -> str:
        parts = [f"{self.m}x{self.k}x{self.n}", str(self.dtype).removeprefix("torch.")]
        parts.append(("T" if self.a_t else "N") + ("T" if self.b_t else "N"))
        if self.bias:
            parts.append("bias")
        if self.activation:
            parts.append(self.activation)
        if self.out_dtype is not None:
            parts.append("out_" + str(self.out_dtype).removeprefix("torch."))
        if self.offset:
            parts.append(f"offset{self.offset}")
        if self.family != "auto":
            parts.append(self.family)
        return "-".join(parts)

    def args(self, device: str | torch.device, seed: int = 0) -> tuple:
        """(a, b, bias, activation, out_dtype) on `device` ("meta" for shape classes only)."""
        generator = torch.Generator().manual_seed(seed)

        def randn(*shape: int) -> torch.Tensor:
            if str(device) == "meta":
                return torch.empty(shape, dtype=self.dtype, device="meta")
            if self.activation == "relu":  # small integers (and a bias of halves, below): every preactivation is
                # exact and at least 0.5 from zero, where relu's gradient jumps; with normal data a sum within
                # rounding of zero took the other side in fp16 and its row's input gradient was off by up to 1.1
                return torch.randint(-2, 3, shape, generator=generator).to(device, self.dtype)
            return torch.randn(shape, generator=generator).to(device, self.dtype)

        if self.offset:
            base = randn(self.m * self.k + self.offset)
            a = base[self.offset:].view(self.k, self.m).t() if self.a_t else base[self.offset:].view(self.m, self.k)
        else:
            a = randn(self.k, self.m).t() if self.a_t else randn(self.m, self.k)
        b = randn(self.n, self.k).t() if self.b_t else randn(self.k, self.n)
        bias = randn(self.n) if self.bias else None
        if bias is not None and self.activation == "relu":
            bias = bias + 0.5
        return a, b, bias, self.activation, self.out_dtype


LAYOUTS = list(itertools.product([False, True], repeat=2))

# Every transpose combination, both dtypes (small size bucket).
TRANSPOSES = [Case(256, 320, 384, dtype, a_t, b_t) for dtype in (BF16, FP16) for a_t, b_t in LAYOUTS]
# Awkward M; the backward of each runs the other layouts of TRANSPOSES.
AWKWARD_M = [Case(m, 256, 512) for m in (1, 7, 1000, 4097)]
# Every size bucket: large_short_k (K <= 1024), large, medium and small (the wave model), skinny (few rows, wide
# b) and decode (up to 64 rows, wide b: ping-pong tiles 64x128, or 64x64 when b has under 99 columns of 128),
# with a fused epilogue and a transposed b.
LARGE = [Case(4096, 512, 4096, BF16), Case(4096, 512, 4096, FP16, grad=False), Case(4096, 1536, 4096, grad=False),
         Case(512, 1024, 4096), Case(128, 512, 4096), Case(64, 512, 4096), Case(7, 1024, 4096, FP16, b_t=True),
         Case(33, 512, 4096, bias=True, activation="gelu"), Case(16, 256, 16384), Case(5, 384, 13000, FP16)]
# The wave buckets' 192-row and 192-column tiles, each with a partial last tile row or column (6250 = 32.6 tiles of
# 192, 760 = 3.96), both dtypes, every layout, the fused epilogue and an fp32 output; their backwards run the other
# buckets' tiles.  tests/test_gemm.py checks that each bucket is reached.
WAVE = [Case(6250, 768, 760, BF16, bias=True, activation="gelu"), Case(6250, 384, 760, FP16, a_t=True, b_t=True),
        Case(6250, 512, 760, BF16, out_dtype=torch.float32, grad=False),
        Case(3072, 2048, 760, BF16, a_t=True), Case(3072, 1024, 760, FP16, b_t=True, bias=True, activation="gelu"),
        Case(3000, 1024, 1000, FP16, b_t=True, bias=True, activation="relu"), Case(3000, 2048, 1000, BF16, a_t=True)]
# Bias and activations in the epilogue, and an fp32 output.
EPILOGUES = [Case(1000, 256, 384, dtype, bias=bias, activation=act)
             for dtype in (BF16, FP16) for bias in (False, True) for act in (None, "relu", "gelu")
             if bias or act] + \
    [Case(1000, 256, 384, BF16, out_dtype=torch.float32),
     Case(1000, 256, 384, BF16, bias=True, activation="relu", out_dtype=torch.float32)]
# K or N not a multiple of 8, and a misaligned start address: the alignment classes 4, 2 and 1.
UNALIGNED = [Case(64, 132, 100), Case(64, 130, 96, FP16), Case(100, 129, 77), Case(100, 129, 77, a_t=True, b_t=True),
             Case(33, 256, 64, offset=1), Case(100, 129, 77, bias=True, activation="gelu")]
# The CUTLASS 2 (sm_80 family) kernels, run on the GPU at hand whatever its arch.
SM80 = [replace(c, family="sm80") for c in TRANSPOSES] + \
    [Case(4096, 512, 4096, family="sm80", grad=False),
     Case(1000, 256, 384, bias=True, activation="gelu", family="sm80"),
     Case(1000, 256, 384, bias=True, activation="relu", out_dtype=torch.float32, family="sm80")]

ALL = TRANSPOSES + AWKWARD_M + LARGE + WAVE + EPILOGUES + UNALIGNED + SM80

# The bit-for-bit test's cases, ((M, N, K), dtype, fused): benchmarks/bench_gemm.py's shapes in both dtypes, and
# its fused shapes in bf16 with bias and GELU in the epilogue.  Its nvcc-built references take 1-2 minutes each to
# compile, so prebuild_gemm.py builds them too (bit_for_bit_reference).
BIT_FOR_BIT = [(s, d, False) for s in SHAPES for d in (BF16, FP16)] + [(s, BF16, True) for s in FUSED_SHAPES]


def requests(case: Case, target) -> dict:
    """Every kernel build a call of `case` needs on `target`, its backward's included (label -> BuildRequest).
    Mirrors jitops.gemm's forward (the gelu split when a gradient is needed) and backward."""
    import jitops

    found: dict = {}

    def add(op_name: str, args: tuple) -> None:
        for request in jitops.find(op_name).requests_for(args, target).values():
            found[request.label() + " " + str(request.params)] = request

    with jitops.config.scope(gemm_family=case.family):
        a, b, bias, activation, out_dtype = case.args("meta")
        out = out_dtype or case.dtype
        m, n = case.m, case.n
        grad_out = torch.empty((m, n), dtype=out, device="meta")
        if case.grad and activation == "gelu":
            add("gemm", (a, b, bias, None, out_dtype))
            z = torch.empty((m, n), dtype=out, device="meta")
            add("gelu", (z, "none"))
            add("gelu_backward", (grad_out, z, "none"))
        else:
            add("gemm", (a, b, bias, activation, out_dtype))
        if case.grad:
            g = torch.empty((m, n), dtype=case.dtype, device="meta")
            add("gemm", (g, b.t(), None, None, None))
            add("gemm", (a.t(), g, None, None, None))
    return found


def bit_for_bit_reference(shape: tuple[int, int, int], dtype: torch.dtype, fused: bool):
    """The nvcc-built library the bit-for-bit test loads for one of BIT_FOR_BIT's cases.  Its shape class from
    meta tensors: the same class as the test's fresh CUDA tensors (16-byte aligned, row-major)."""
    from jitops.ops import gemm as G
    from jitops.ops import gemm_plan as P

    m, n, k = shape
    a, b = torch.empty((m, k), dtype=dtype, device="meta"), torch.empty((k, n), dtype=dtype, device="meta")
    bias = torch.empty((n,), dtype=dtype, device="meta") if fused else None
    cls = G.shape_class(a, b, bias, "gelu" if fused else None, None)
    return G.sm90_reference_request(cls, P.SM90_CONFIGS[cls.bucket])
