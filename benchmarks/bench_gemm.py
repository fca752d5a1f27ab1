"""jitops.gemm against torch.matmul (cuBLAS), side by side in one run on one GPU.

    python benchmarks/bench_gemm.py            # the six shapes x {bf16, fp16}; fused bias+gelu; compile seconds
    python benchmarks/bench_gemm.py --tune     # also time candidate configurations x swizzles x raster orders (bf16)
    python benchmarks/bench_gemm.py --tune-only
    python benchmarks/bench_gemm.py --cold-compile DIR   # compile the main configurations into an empty cache DIR
    python benchmarks/bench_gemm.py --survey   # beyond the goal's six: squares and LLM layer shapes (bf16)
    python benchmarks/bench_gemm.py --sweep-survey | --sweep-decode | --sweep-skinny
                                               # candidate configurations on the survey, decode or skinny shapes
    python benchmarks/bench_gemm.py --light    # the light sm_90a kernel against CUTLASS's and cuBLAS
    python benchmarks/bench_gemm.py --fp32     # float32 gemm and linear (cuBLAS route), TF32 on and off
    python benchmarks/bench_gemm.py --training # the GEMMs of GPT-2's, ViT-B/16's and Llama's steps (bench_models)

Shapes are M x N x K; a (M, K) and b (K, N) are row-major, as in x @ w.  The goal (issue 4): geometric mean
over the six shapes >= 1.05x torch.matmul for each dtype, no shape below 0.9x; fused bias+gelu >= 1.2x
torch.matmul followed by the bias and gelu.  Compile seconds come from the cache entries' meta.json (the machine
that built them) and, with --cold-compile, from compiling on this machine.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jitops

from jitops.ops import gemm as G
from jitops.ops import gemm_plan as P
from jitops.ops import gemm_run as R
from jitops.specs import Target

SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (16384, 2048, 4096), (4000, 4000, 4000), (128, 8192, 8192),
          (8192, 8192, 1024)]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
BASELINE = "torch.matmul (cuBLAS); F.gelu(torch.matmul + bias) for the fused rows"
FUSED_SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 8192, 1024), (16384, 2048, 4096)]

# Candidate configurations timed with --tune (bf16, row-major a and b): every large shape against the "large"
# candidates, 128x8192x8192 against the "skinny" ones, each over SWIZZLES x RASTERS (run-time arguments).
def _coop(tile, cluster, streamk=False):
    return P.Sm90Config(tile, cluster, pingpong=False, streamk=streamk)


def _pong(tile, cluster):
    return P.Sm90Config(tile, cluster, pingpong=True, streamk=False)


TUNE = {
    "large": [_coop((128, 256, 64), (2, 1)), _coop((128, 256, 64), (1, 2)), _coop((128, 256, 64), (1, 1)),
              _coop((128, 256, 64), (2, 2)), _coop((256, 128, 64), (2, 1)), _coop((256, 128, 64), (1, 2)),
              _coop((256, 128, 64), (1, 1)), _coop((128, 128, 64), (2, 1)), _pong((128, 128, 64), (2, 1)),
              _pong((128, 128, 64), (1, 2)), _pong((128, 128, 64), (1, 1)), _pong((64, 256, 64), (1, 1)),
              _coop((128, 256, 64), (1, 1), streamk=True)],
    "skinny": [_coop((128, 64, 64), (1, 2)), _coop((128, 64, 64), (1, 4)), _coop((128, 64, 64), (1, 1)),
               _coop((128, 64, 128), (1, 2)), _coop((128, 128, 64), (1, 2), streamk=True)],
}
# --sweep-survey: candidates on the survey shapes, each stream-K build under several decompositions
# ((decomposition, splits): (0, 1) CUTLASS's heuristic, (1, 1) data-parallel, (2, s) split-K, (3, 1) stream-K).
SURVEY_CANDIDATES = [
    (_coop((128, 256, 64), (2, 1)), [(0, 1)]),
    (_coop((128, 128, 64), (2, 1)), [(0, 1)]),
    (_pong((128, 128, 64), (2, 1)), [(0, 1)]),
    (_coop((128, 64, 64), (1, 2)), [(0, 1)]),
    (_pong((64, 128, 64), (1, 1)), [(0, 1)]),
    (_pong((64, 256, 64), (1, 1)), [(0, 1)]),
    (_coop((128, 128, 64), (1, 1), streamk=True), [(0, 1), (1, 1), (3, 1), (2, 2), (2, 4)]),
    (_coop((128, 64, 64), (1, 1), streamk=True), [(0, 1), (1, 1), (3, 1), (2, 2), (2, 4), (2, 8)]),
    (_coop((128, 256, 64), (1, 1), streamk=True), [(0, 1), (3, 1)]),
]
# --sweep-decode: the decode bucket's 64-row ping-pong tile at three widths and two depths of K (a decode step
# keeps one tile an SM busy, so the tile count and each tile's K loop set the speed).
DECODE_SHAPES = [(m, n, k) for m in (1, 32, 64) for n, k in ((4096, 4096), (14336, 4096), (4096, 14336), (8192, 8192))]
DECODE_CANDIDATES = [(_pong((64, width, depth), (1, 1)), [(0, 1)]) for width, depth in
                     ((128, 64), (64, 64), (32, 64), (128, 128), (64, 128))]
# --sweep-skinny: the skinny bucket's candidates (129-256 rows against a wide b).
SKINNY_SHAPES = [(128, n, k) for n, k in ((4096, 4096), (14336, 4096), (4096, 14336), (8192, 8192))] + \
    [(256, 4096, 4096)]
SKINNY_CANDIDATES = [(_coop((128, 64, 64), (1, 2)), [(0, 1)]), (_coop((128, 64, 64), (1, 1)), [(0, 1)]),
                     (_coop((128, 64, 128), (1, 2)), [(0, 1)]),
                     (_coop((128, 64, 64), (1, 1), streamk=True), [(1, 1), (2, 2)])]
TUNE_SHAPES = {"large": [s for s in SHAPES if s[0] > 256], "skinny": [s for s in SHAPES if s[0] <= 256]}
SWIZZLES = (1, 2, 4, 8)
ROUNDS = 5  # ours and torch.matmul timed in 5 alternating rounds (harness.Bench): the clock drifts between them
# 128x8192x8192 (52 us) read 81 us with per-call events through jitops.gemm, 52 through its run function and 49
# in a graph (torch.matmul 51 / 48; lent H100, 2026-11-22; docs/architecture.md, "What the probes found").
GRAPH_BELOW_MS = 0.1
RASTERS = (1, 2)  # along M, along N (CUTLASS's heuristic, 0, is one of these)
# --survey: shapes a user meets that the goal's six do not cover: squares from 256 to 6144, and the linear
# layers of a 7B-class model (hidden 4096, MLP 14336) from one token (decode) to 2048 (prefill).
SURVEY_SHAPES = ([(s, s, s) for s in (256, 512, 1024, 2048, 3072, 6144)]
                 + [(m, n, k) for m in (1, 8, 32, 128, 512, 2048)
                    for n, k in ((4096, 4096), (14336, 4096), (4096, 14336))]
                 + [(1024, 1024, 16384), (16384, 128, 4096)])
SWEEPS = {"survey": (SURVEY_SHAPES, SURVEY_CANDIDATES), "decode": (DECODE_SHAPES, DECODE_CANDIDATES),
          "skinny": (SKINNY_SHAPES, SKINNY_CANDIDATES)}


def shape_args(m: int, n: int, k: int, dtype: torch.dtype, device: str = "cuda", bias: bool = False):
    if device == "meta":
        make = lambda *s: torch.empty(s, dtype=dtype, device="meta")
    else:
        make = lambda *s: torch.randn(s, device=device, dtype=dtype)
    return make(m, k), make(k, n), (make(n) if bias else None)


def requests(target: Target, tune: bool = False, survey: bool = False) -> dict:
    """Every kernel this benchmark loads on `target` (for tools/prebuild_gemm.py): the default (light) sm_90a
    kernels and CUTLASS's, which --light times them against."""
    found = {}
    op = G.gemm.op
    for kernel in ("light", "cutlass"):
        with jitops.config.scope(gemm_sm90_kernel=kernel):
            for dtype in DTYPES.values():
                for m, n, k in SHAPES:
                    a, b, _ = shape_args(m, n, k, dtype, "meta")
                    for r in op.requests_for((a, b, None, None, None), target).values():
                        found[str(r.params)] = r
                for m, n, k in FUSED_SHAPES:
                    a, b, bias = shape_args(m, n, k, dtype, "meta", bias=True)
                    for r in op.requests_for((a, b, bias, "gelu", None), target).values():
                        found[str(r.params)] = r
    if tune:
        for bucket, configs in TUNE.items():
            m, n, k = TUNE_SHAPES[bucket][0]
            a, b, _ = shape_args(m, n, k, torch.bfloat16, "meta")
            cls = G.shape_class(a, b, None, None, None)
            for config in configs:
                r = G.sm90_request(cls, config)
                found[str(r.params)] = r
    if survey:
        a, b, _ = shape_args(1024, 1024, 1024, torch.bfloat16, "meta")
        cls = G.shape_class(a, b, None, None, None)
        for config, _ in SURVEY_CANDIDATES:
            r = G.sm90_request(cls, config)
            found[str(r.params)] = r
    return found


def compile_seconds(target: Target, reqs) -> dict:
    """label -> compile seconds recorded in the cache entry (on the machine that built it)."""
    out = {}
    for r in reqs:
        key, _ = jitops.runtime.key_for(r, target)
        entry = jitops.runtime.find_entry(key, any_toolchain=True)
        if entry is not None:
            out[_describe(r)] = entry.meta.get("compile_seconds")
    return out


def _describe(r) -> str:
    p = {**dict(r.params), **dict(r.defines)}
    if r.kernel == "gemm_sm90_light":
        return (f"sm90 light {'fp16' if p['LIGHT_T'] == '1' else 'bf16'}{'->fp32' if p['LIGHT_OUT'] == '1' else ''} "
                f"A{'K' if p['LIGHT_A_KMAJOR'] == '1' else 'M'} B{'K' if p['LIGHT_B_KMAJOR'] == '1' else 'N'} "
                f"128x{p['LIGHT_TILE_N']}x64 {'pingpong' if p['LIGHT_PINGPONG'] == '1' else 'coop'}"
                f"{' fused' if p['LIGHT_FUSED'] == '1' else ''}")
    if r.kernel.startswith("gemm_sm90"):
        types = f"{p['GEMM_T'].split('::')[-1]}->{p['GEMM_OUT'].split('::')[-1]}"
        return (f"sm90{'' if r.backend == 'nvrtc' else ' (nvcc)'} {types} "
                f"A{'K' if p['GEMM_A_KMAJOR'] == '1' else 'M'} B{'K' if p['GEMM_B_KMAJOR'] == '1' else 'N'} "
                f"{p['GEMM_TILE_M']}x{p['GEMM_TILE_N']}x{p['GEMM_TILE_K']} "
                f"c{p['GEMM_CLUSTER_M']}x{p['GEMM_CLUSTER_N']} "
                f"{'pingpong' if p['GEMM_PINGPONG'] == '1' else 'coop'}{' streamK' if p['GEMM_STREAMK'] == '1' else ''}"
                f"{' fused' if p['GEMM_FUSED'] == '1' else ''}")
    return f"sm80 {r.entry}"


def cold_compile(directory: Path, target: Target) -> None:
    """Compile one sm_90a configuration (through NVRTC, and through nvcc with CUTLASS's host code) and one
    sm_80-family configuration into an empty cache, timing each (the runtime's own compile paths)."""
    a, b, _ = shape_args(4096, 4096, 4096, torch.bfloat16, "meta")
    cls = G.shape_class(a, b, None, None, None)
    sm90 = G.sm90_request(cls, P.SM90_CONFIGS["large"])
    chosen = {_describe(sm90): sm90,
              "same through nvcc, with CUTLASS's host code": G.sm90_reference_request(cls, P.SM90_CONFIGS["large"]),
              "sm80 large (NVRTC)": G.sm80_request(cls._replace(family="sm80"), P.SM80_CONFIGS["large"])}
    results = {}
    with jitops.config.scope(cache_dir=directory, cache_path=()):
        for what, r in chosen.items():
            started = time.perf_counter()
            jitops.runtime.prewarm(r, target)
            results[what] = round(time.perf_counter() - started, 1)
    print(json.dumps({"cold_compile_seconds": results, "cpus": os.cpu_count()}))


def tflops(m, n, k, ms):
    return 2 * m * n * k / (ms * 1e-3) / 1e12


def check_close(got, want, what):
    err = ((got.double() - want.double()).norm() / want.double().norm()).item()
    if not err < 1e-2:
        raise SystemExit(f"bench_gemm: {what} differs from torch by {err:.2e}")


def bench_shape(bench, m: int, n: int, k: int, name: str, dtype: torch.dtype) -> float:
    a, b, _ = shape_args(m, n, k, dtype)
    check_close(jitops.gemm(a, b), a @ b, f"gemm {m}x{n}x{k} {name}")
    cls = G.shape_class(a, b, None, None, None)
    # GPU time: a call under GRAPH_BELOW_MS is timed in CUDA graphs (both sides), where per-call events would
    # also time our host path (about 30 us a call) whenever it outlasts the kernel.
    row = bench.compare(op="gemm", shape=f"{m}x{n}x{k}", dtype=name, ours=lambda: jitops.gemm(a, b),
                        baseline=lambda: torch.matmul(a, b), baseline_name="torch.matmul", flops=2 * m * n * k,
                        timing="auto", graph_below_ms=GRAPH_BELOW_MS, config=str(P.SM90_CONFIGS.get(cls.bucket)))
    return row.speedup


def bench_fused(bench, m: int, n: int, k: int, name: str, dtype: torch.dtype) -> float:
    a, b, bias = shape_args(m, n, k, dtype, bias=True)
    check_close(jitops.gemm(a, b, bias=bias, activation="gelu"), F.gelu(a @ b + bias), f"fused {m}x{n}x{k} {name}")
    row = bench.compare(op="gemm+bias+gelu", shape=f"{m}x{n}x{k}", dtype=name,
                        ours=lambda: jitops.gemm(a, b, bias=bias, activation="gelu"),
                        baseline=lambda: F.gelu(torch.matmul(a, b) + bias), baseline_name="matmul+bias+gelu",
                        flops=2 * m * n * k)
    return row.speedup


def light(bench) -> None:
    """The light sm_90a kernel (jitops.gemm's default) against CUTLASS's kernel (JITOPS_GEMM_SM90_KERNEL=cutlass)
    and against torch.matmul, on x @ w.t() (w (N, K), both operands K-major) and x @ w (w (K, N), b MN-major),
    the six shapes in both dtypes; on the training steps' weight gradients (g.t() @ x, both operands MN-major,
    bf16); and against CUTLASS's fused bias + gelu on the fused rows' shapes.  The light kernel is loaded and
    launched directly, so one process times both kernels of the same class."""
    with jitops.config.scope(gemm_sm90_kernel="cutlass"):  # jitops.gemm: the baseline
        _light_against_cutlass(bench)


def _light_rows(bench, target: Target, a: torch.Tensor, lda: int, b: torch.Tensor, ldb: int, layout: str,
                dtype_name: str, bias: torch.Tensor | None = None) -> None:
    """One shape and layout: the light kernel against jitops.gemm (CUTLASS's, in light's scope) and torch.matmul;
    with `bias`, bias + gelu in the epilogue against CUTLASS's fused kernel alone."""
    from jitops import light_gemm
    from jitops.launch import current_stream, sm_count

    (m, k), n = a.shape, b.shape[1]
    activation = None if bias is None else "gelu"
    cls = G.shape_class(a, b, bias, activation, None)
    kernel = jitops.runtime.get_kernel(light_gemm.request(cls), target, 0)
    out = torch.empty(m, n, device="cuda", dtype=a.dtype)
    sms = sm_count(0)

    def call():
        light_gemm.run(kernel, a, b, out, bias, m, n, k, lda, ldb, 0 if bias is None else 2, sms, current_stream(0))
        return out

    def cutlass():
        return jitops.gemm(a, b, bias=bias, activation=activation)

    check_close(call(), torch.matmul(a, b) if bias is None else cutlass(), f"light {m}x{n}x{k} {layout} {dtype_name}")
    op, shape, flops = "gemm" if bias is None else "gemm+bias+gelu", f"{m}x{n}x{k} {layout}".rstrip(), 2 * m * n * k
    tile = f"{light_gemm.tile_m_for(cls.bucket)}x{light_gemm.tile_n_for(cls.bucket)}x64"
    bench.compare(op=f"{op} light vs CUTLASS", shape=shape, dtype=dtype_name, ours=call, baseline=cutlass,
                  baseline_name="jitops.gemm (CUTLASS)", flops=flops, timing="auto", graph_below_ms=GRAPH_BELOW_MS,
                  tile=tile)
    if bias is None:
        bench.compare(op="gemm light vs torch", shape=shape, dtype=dtype_name, ours=call,
                      baseline=lambda: torch.matmul(a, b), baseline_name="torch.matmul", flops=flops,
                      timing="auto", graph_below_ms=GRAPH_BELOW_MS, tile=tile)


def _light_against_cutlass(bench) -> None:
    target = Target("cuda", torch.cuda.get_device_capability(0))
    for name, dtype in DTYPES.items():
        for (m, n, k), layout in itertools.product(SHAPES, ("x @ w.t()", "x @ w")):
            x = torch.randn(m, k, device="cuda", dtype=dtype)
            if layout == "x @ w":
                b, ldb = torch.randn(k, n, device="cuda", dtype=dtype), n
            else:
                b, ldb = torch.randn(n, k, device="cuda", dtype=dtype).t(), k
            _light_rows(bench, target, x, k, b, ldb, layout, name)
        if name == "bf16":  # the training steps' weight gradients, dW = g.t() @ x (the small bucket's among them)
            for m, n, k in sorted({(m, n, k) for _, m, n, k, a_kmajor, _, _ in training_gemms() if not a_kmajor}):
                g = torch.randn(k, m, device="cuda", dtype=dtype).t()
                x = torch.randn(k, n, device="cuda", dtype=dtype)
                _light_rows(bench, target, g, m, x, n, "g.t() @ x", name)
        for m, n, k in FUSED_SHAPES:  # bias + gelu in the epilogue, x @ w.t() (the shape alone names the row)
            x = torch.randn(m, k, device="cuda", dtype=dtype)
            b = torch.randn(n, k, device="cuda", dtype=dtype).t()
            _light_rows(bench, target, x, k, b, k, "", name, bias=torch.randn(n, device="cuda", dtype=dtype))


def float32(bench) -> list[float]:
    """float32 gemm and linear on CUDA (issue 19: at least x0.95 torch.matmul under TF32): jitops routes them to
    cuBLAS (jitops.gemm's cuda_route), so what is timed is the route's cost around the same cuBLAS call, TF32 on
    (torch.set_float32_matmul_precision("high")) and off ("highest"), the six shapes."""
    ratios = []
    before = torch.get_float32_matmul_precision()
    try:
        for precision, label in (("high", "tf32"), ("highest", "fp32")):
            torch.set_float32_matmul_precision(precision)
            for m, n, k in SHAPES:
                a, b, _ = shape_args(m, n, k, torch.float32)
                check_close(jitops.gemm(a, b), a @ b, f"gemm {m}x{n}x{k} {label}")
                row = bench.compare(op="gemm float32", shape=f"{m}x{n}x{k}", dtype=label,
                                    ours=lambda a=a, b=b: jitops.gemm(a, b),
                                    baseline=lambda a=a, b=b: torch.matmul(a, b), baseline_name="torch.matmul",
                                    flops=2 * m * n * k, timing="auto", graph_below_ms=GRAPH_BELOW_MS)
                ratios.append(row.speedup)
                w = b.t().contiguous()  # nn.Linear's (N, K) weight
                bench.compare(op="linear float32", shape=f"{m}x{n}x{k}", dtype=label,
                              ours=lambda a=a, w=w: jitops.linear(a, w), baseline=lambda a=a, w=w: F.linear(a, w),
                              baseline_name="F.linear", flops=2 * m * n * k, timing="auto",
                              graph_below_ms=GRAPH_BELOW_MS)
    finally:
        torch.set_float32_matmul_precision(before)
    return ratios


def survey(bench) -> None:
    """jitops.gemm against torch.matmul beyond the goal's shapes (bf16), every call timed on the device (CUDA
    graphs where short), so the table compares kernels; the host's cost per call is the overhead table's."""
    ratios = []
    for m, n, k in SURVEY_SHAPES:
        a, b, _ = shape_args(m, n, k, torch.bfloat16)
        ratios.append(_kernel_row(bench, "gemm survey", f"{m}x{n}x{k}", a, b, None, lambda: torch.matmul(a, b),
                                  "torch.matmul", timing="auto", graph_below_ms=GRAPH_BELOW_MS))
    bench.summarize(survey_geomean=round(math.exp(sum(map(math.log, ratios)) / len(ratios)), 3),
                    survey_min=round(min(ratios), 3))


def _kernel_row(bench, op: str, shape: str, a, b, bias, baseline, baseline_name: str, **timing) -> float:
    """One shape of the survey or the training GEMMs: jitops.gemm(a, b, bias=bias) checked against `baseline`,
    both timed (`timing`: bench.compare's), the row tagged with the bucket; its speed."""
    m, k = a.shape
    n = b.shape[1]
    check_close(jitops.gemm(a, b, bias=bias), baseline(), f"{op} {shape}")
    cls = G.shape_class(a, b, bias, None, None)
    row = bench.compare(op=op, shape=shape, dtype="bf16", ours=lambda: jitops.gemm(a, b, bias=bias),
                        baseline=baseline, baseline_name=baseline_name, flops=2 * m * n * k, bucket=cls.bucket,
                        config=str(P.SM90_CONFIGS.get(cls.bucket)), a_kmajor=a.stride(1) == 1,
                        b_kmajor=b.stride(0) == 1, **timing)
    print(f"  {op:34s} {shape} bucket {cls.bucket}: x{row.speedup:.2f}", flush=True)
    return row.speedup


# A training step's GEMMs (bench_models.py's configs): each Linear (N, K) of a layer gives its forward x . w^T
# (both operands K-major, with the bias where the model has one), its input gradient g . w (w read as the N-major
# (N, K) operand) and its weight gradient g^T . x (both operands M/N-major), as jitops.linear runs them.
# (model, tokens, bias, [(layer, N, K)]); Llama's q, k, v and o projections are four alike 1024 x 1024 Linears.
TRAINING_MODELS = [
    ("gpt2", 4096, True, [("qkv", 3072, 1024), ("proj", 1024, 1024), ("fc1", 4096, 1024), ("fc2", 1024, 4096)]),
    ("vit", 6304, True, [("qkv", 2304, 768), ("proj", 768, 768), ("fc1", 3072, 768), ("fc2", 768, 3072)]),
    ("llama", 4096, False, [("q", 1024, 1024), ("gate", 2816, 1024), ("down", 1024, 2816)]),
]


def training_gemms():
    for model, tokens, bias, layers in TRAINING_MODELS:
        for layer, n, k in layers:
            yield f"{model} {layer} forward", tokens, n, k, True, True, bias
            yield f"{model} {layer} input grad", tokens, k, n, True, False, False
            yield f"{model} {layer} weight grad", n, k, tokens, False, False, False


def training(bench) -> None:
    """jitops.gemm against torch.addmm / torch.mm on the GEMMs of GPT-2, ViT-B/16 and Llama training steps (bf16),
    the operands in the layouts the step has them, kernel time from CUDA graphs (the host's cost per call is the
    overhead table's and bench_models.py's)."""
    ratios = []
    for name, m, n, k, a_kmajor, b_kmajor, bias in training_gemms():
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) if a_kmajor else \
            torch.randn(k, m, device="cuda", dtype=torch.bfloat16).t()
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t() if b_kmajor else \
            torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        c = torch.randn(n, device="cuda", dtype=torch.bfloat16) if bias else None
        baseline = (lambda: torch.addmm(c, a, b)) if bias else (lambda: torch.mm(a, b))
        ratios.append(_kernel_row(bench, f"gemm {name}", f"{m}x{n}x{k}", a, b, c, baseline,
                                  "torch.addmm" if bias else "torch.mm", timing="graph"))
    bench.summarize(training_time_ratio=round(sum(r.baseline_ms for r in bench.rows) /
                                              sum(r.ours_ms for r in bench.rows), 3),
                    training_min=round(min(ratios), 3))


def sweep(target: Target, name: str) -> list[dict]:
    """Every candidate of SWEEPS[name] on each of its shapes (bf16, row-major a and b), device time (graphs where
    short), torch.matmul timed before and after each shape's candidates."""
    shapes, candidates = SWEEPS[name]
    from harness import save_record, time_cuda, time_cuda_graph

    def device_ms(fn):
        estimate = time_cuda(fn, warmup=2, reps=5, min_ms=2.0)
        return time_cuda_graph(fn, reps=10) if estimate < GRAPH_BELOW_MS else time_cuda(fn, reps=10, min_ms=30.0)

    rows = []
    for m, n, k in shapes:
        a, b, _ = shape_args(m, n, k, torch.bfloat16)
        want = a @ b
        cls = G.shape_class(a, b, None, None, None)
        torch_ms = [device_ms(lambda: torch.matmul(a, b))]
        points = []
        for config, schedules in candidates:
            loaded = load_candidate(target, cls, config, m, n)
            if loaded is None:
                continue
            lib, out = loaded
            for decomposition, splits in schedules:
                def call(config=config, lib=lib, out=out, decomposition=decomposition, splits=splits):
                    R.run_sm90(lib, cls, config, a, b, out, None, m, n, k, k, n, 0, decomposition=decomposition,
                               splits=splits)
                try:
                    out.zero_()
                    call()
                    check_close(out, want, f"{m}x{n}x{k} {config}")
                    points.append((config, decomposition, splits, device_ms(call)))
                except (RuntimeError, SystemExit) as exc:
                    print(f"  sweep {m}x{n}x{k} {config.tile} {decomposition}/{splits}: {exc}", flush=True)
        torch_ms.append(device_ms(lambda: torch.matmul(a, b)))
        base = statistics.median(torch_ms)
        for config, decomposition, splits, ms in sorted(points, key=lambda p: p[-1]):
            rows.append({"shape": f"{m}x{n}x{k}", "bucket": cls.bucket, "config": config_name(config),
                         "decomposition": decomposition, "splits": splits, "us": round(ms * 1e3, 2),
                         "torch_us": round(base * 1e3, 2), "ratio": round(base / ms, 3)})
        best = [r for r in rows if r["shape"] == f"{m}x{n}x{k}"][:3]
        print(f"  sweep {m}x{n}x{k} ({cls.bucket}) torch {base * 1e3:.1f} us; best: " + "; ".join(
            f"{r['config']} d{r['decomposition']}/{r['splits']} {r['us']} us x{r['ratio']}" for r in best), flush=True)
    save_record("gemm", baseline=BASELINE, rows=rows, summary={"torch_timings": "two per shape, median"},
                variant=f"sweep-{name}")
    return rows


def overhead(bench, target: Target, calls: int = 2000) -> None:
    """Host cost of one call (128 x 4096 x 128: the skinny bucket's data-parallel kernel, whose GPU time is far
    smaller): enqueue rate over many calls, for jitops.gemm, its sm_90 run function alone, and torch.matmul."""
    m, n, k = 128, 4096, 128
    a, b, _ = shape_args(m, n, k, torch.bfloat16)
    cls = G.shape_class(a, b, None, None, None)
    paths = {"torch.matmul": lambda: torch.matmul(a, b), "jitops.gemm": lambda: jitops.gemm(a, b)}
    if G.uses_sm90(cls, target):
        config = P.SM90_CONFIGS[cls.bucket]
        kernel = jitops.runtime.get_kernel(G.sm90_request(cls, config), target, 0)
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        paths["run_sm90 (NVRTC kernel, Python host side)"] = lambda: R.run_sm90(
            kernel, cls, config, a, b, out, None, m, n, k, k, n, 0)
    from harness import host_us

    times = host_us(*paths.values(), calls=calls, rounds=3, warmup=50)
    results = {name: round(us, 1) for name, us in zip(paths, times)}
    print("  host microseconds per call:", results, flush=True)
    bench.summarize(host_us_per_call_128x4096x128=results)


def swizzle_ab(bench, target: Target, m: int = 16384, n: int = 2048, k: int = 4096) -> None:
    """The large configuration on a problem of few tile columns with swizzle 8 against the swizzle 1 that
    _swizzle picks there, in alternating rounds (the --tune sweep, one sample each, read 693-701 against 672)."""
    a, b, _ = shape_args(m, n, k, torch.bfloat16)
    cls = G.shape_class(a, b, None, None, None)
    config = P.SM90_CONFIGS[cls.bucket]
    lib = jitops.runtime.get_kernel(G.sm90_request(cls, config), target, 0)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    runs = {s: (lambda s=s: R.run_sm90(lib, cls, config, a, b, out, None, m, n, k, k, n, 0, s)) for s in (8, 1)}
    runs[8]()
    check_close(out, a @ b, f"swizzle 8 {m}x{n}x{k}")
    bench.compare(op="gemm swizzle 8 vs 1", shape=f"{m}x{n}x{k}", dtype="bf16", ours=runs[8], baseline=runs[1],
                  baseline_name="swizzle 1", flops=2 * m * n * k, config=str(config))


def tune(bench, target: Target, time_cuda) -> list[dict]:
    """Candidate configurations x swizzles x raster orders, bf16, each against torch.matmul timed just before it
    (the clock drifts over a sweep of minutes; the ratio is what is compared).  Rows go to the summary."""
    rows = []
    for bucket, configs in TUNE.items():
        for m, n, k in TUNE_SHAPES[bucket]:
            a, b, _ = shape_args(m, n, k, torch.bfloat16)
            want = a @ b
            for config in configs:
                rows += tune_one(target, time_cuda, config, a, b, want)
    bench.summarize(tune=rows)
    return rows


def print_best(rows: list[dict], per_shape: int = 5) -> None:
    """The fastest configurations of each shape, by ratio to torch.matmul."""
    for shape in dict.fromkeys(row["shape"] for row in rows):
        ranked = sorted((r for r in rows if r["shape"] == shape), key=lambda r: -r["ratio"])
        for row in ranked[:per_shape]:
            print(f"  best {shape}: {row['config']} swizzle {row['swizzle']} raster {row['raster']}: "
                  f"{row['tflops']} TFLOP/s, x{row['ratio']} torch.matmul", flush=True)


def config_name(config) -> str:
    """A candidate's name in the tune and sweep records, e.g. "128x256x64 c2x1 coop"."""
    return (f"{config.tile[0]}x{config.tile[1]}x{config.tile[2]} c{config.cluster[0]}x{config.cluster[1]} "
            f"{'pingpong' if config.pingpong else 'coop'}{' streamK' if config.streamk else ''}")


def load_candidate(target: Target, cls, config, m: int, n: int):
    """(library, output buffer) of a candidate configuration, or None when it is not built (JITOPS_OFFLINE) or
    does not build: reported, not fatal to the sweep."""
    try:
        lib = jitops.runtime.get_kernel(G.sm90_request(cls, config), target, 0)
    except Exception as exc:  # noqa: BLE001 - one candidate must not stop the others
        print(f"  {config_name(config)}: unavailable: {str(exc)[:300]}", flush=True)
        return None
    return lib, torch.empty(m, n, device="cuda", dtype=torch.bfloat16)


def tune_one(target: Target, time_cuda, config, a, b, want) -> list[dict]:
    (m, k), n = a.shape, b.shape[1]
    cls = G.shape_class(a, b, None, None, None)
    loaded = load_candidate(target, cls, config, m, n)
    if loaded is None:
        return []
    lib, out = loaded
    name = config_name(config)
    rows = []
    for swizzle in SWIZZLES:
        for raster in RASTERS:
            def call(swizzle=swizzle, raster=raster):
                R.run_sm90(lib, cls, config, a, b, out, None, m, n, k, k, n, 0, swizzle, raster)
            call()
            check_close(out, want, f"tune {name} {m}x{n}x{k}")
            base_ms = time_cuda(lambda: torch.matmul(a, b), reps=50, min_ms=40.0)
            ms = time_cuda(call, reps=50, min_ms=40.0)
            row = {"shape": f"{m}x{n}x{k}", "config": name, "swizzle": swizzle, "raster": raster,
                   "tflops": round(tflops(m, n, k, ms), 1), "torch_tflops": round(tflops(m, n, k, base_ms), 1),
                   "ratio": round(base_ms / ms, 3)}
            rows.append(row)
            print(f"  tune {row['shape']} {name} swizzle {swizzle} raster {raster}: {row['tflops']:6.1f} TFLOP/s "
                  f"(torch.matmul {row['torch_tflops']:6.1f}) x{row['ratio']}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tune", action="store_true")
    parser.add_argument("--tune-only", action="store_true", help="the --tune sweep alone")
    parser.add_argument("--cold-compile", type=Path)
    parser.add_argument("--survey", action="store_true", help="the survey of other shapes alone")
    parser.add_argument("--sweep-survey", action="store_true", help="every survey candidate on the survey shapes")
    parser.add_argument("--sweep-decode", action="store_true", help="the decode tile widths on decode shapes")
    parser.add_argument("--sweep-skinny", action="store_true", help="the skinny candidates on skinny shapes")
    parser.add_argument("--light", action="store_true",
                        help="the light sm_90a kernel against CUTLASS's and torch.matmul alone")
    parser.add_argument("--training", action="store_true",
                        help="GPT-2's, ViT-B/16's and Llama's training GEMMs against torch.addmm and torch.mm alone")
    parser.add_argument("--fp32", action="store_true",
                        help="float32 gemm and linear (the cuBLAS route) against torch.matmul and F.linear alone")
    args = parser.parse_args()
    if args.cold_compile:
        cold_compile(args.cold_compile, Target.parse("sm_90"))
        return

    from harness import Bench, time_cuda

    variant = "tune" if args.tune_only else "survey" if args.survey else "light" if args.light else \
        "fp32" if args.fp32 else "training" if args.training else None
    bench = Bench("gemm", baseline=BASELINE, variant=variant, rounds=ROUNDS)
    target = Target("cuda", torch.cuda.get_device_capability(0))
    for name in SWEEPS:
        if getattr(args, f"sweep_{name}"):
            sweep(target, name)
            return
    if args.survey:
        survey(bench)
        bench.finish()
        return
    if args.light:
        light(bench)
        bench.finish()
        return
    if args.training:
        training(bench)
        bench.finish()
        return
    if args.fp32:
        ratios = float32(bench)
        bench.summarize(**{"float32 gemm geomean vs torch.matmul": round(
            math.exp(sum(map(math.log, ratios)) / len(ratios)), 3), "float32 gemm min": round(min(ratios), 3)})
        bench.finish()
        return
    if args.tune_only:
        rows = tune(bench, target, time_cuda)
        bench.finish()
        print_best(rows)
        return
    for name, dtype in DTYPES.items():
        ratios = [bench_shape(bench, m, n, k, name, dtype) for m, n, k in SHAPES]
        geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
        bench.summarize(**{f"{name} geomean vs torch.matmul": round(geo, 3),
                      f"{name} min vs torch.matmul": round(min(ratios), 3)})
    fused = [bench_fused(bench, m, n, k, name, dtype) for name, dtype in DTYPES.items() for m, n, k in FUSED_SHAPES]
    bench.summarize(**{"fused bias+gelu geomean vs matmul+bias+gelu": round(
        math.exp(sum(map(math.log, fused)) / len(fused)), 3), "fused min": round(min(fused), 3)})
    overhead(bench, target)
    if target.capability[0] == 9:  # the sm_90 kernels' scheduler
        swizzle_ab(bench, target)
    rows = tune(bench, target, time_cuda) if args.tune else []
    seconds = compile_seconds(target, requests(target).values())
    bench.summarize(compile_seconds_on_build_machine=seconds)
    bench.finish()
    print_best(rows)


if __name__ == "__main__":
    main()
