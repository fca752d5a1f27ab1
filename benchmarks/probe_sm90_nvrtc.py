"""jitops.gemm's sm_90a kernel built by NVRTC with its host side in Python (jitops/cutlass_host.py) against the
same kernel built by nvcc with CUTLASS's host code (SM90_GEMM_REFERENCE), in one run on one GPU:

1. bit for bit: every shape of bench_gemm.py (both dtypes, and the fused bias+gelu shapes) through both;
2. kernel time: both builds in alternating rounds (harness.Bench), per shape, and their ratio;
3. host time per call: both paths on a small problem, with torch.matmul and torch.addmm in the same rounds.

    python benchmarks/probe_sm90_nvrtc.py [--quick]      # on the GPU; the reference libraries come prebuilt
                                                          # (benchmarks/prebuild_gemm.py --reference)
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jitops  # noqa: E402
from bench_gemm import FUSED_SHAPES, SHAPES  # noqa: E402
from harness import Bench, host_us  # noqa: E402
from jitops.launch import current_stream, sm_count  # noqa: E402
from jitops.specs import Target  # noqa: E402

G = importlib.import_module("jitops.ops.gemm")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def cases(quick: bool):
    for dtype in DTYPES:
        for shape in SHAPES[:2] if quick else SHAPES:
            yield dtype, shape, False
    for shape in FUSED_SHAPES[:1] if quick else FUSED_SHAPES:
        yield "bf16", shape, True


def requests(target, quick: bool = False) -> dict:
    """Every kernel this probe loads, both builds (benchmarks/prebuild_gemm.py --probe-sm90 builds them)."""
    wanted = {}
    items = [(dtype, shape, fused) for dtype, shape, fused in cases(quick)] + [("bf16", (128, 4096, 128), False)]
    for dtype, (m, n, k), fused in items:
        a = torch.empty(m, k, dtype=DTYPES[dtype], device="meta")
        b = torch.empty(k, n, dtype=DTYPES[dtype], device="meta")
        bias = torch.empty(n, dtype=DTYPES[dtype], device="meta") if fused else None
        cls = G.shape_class(a, b, bias, "gelu" if fused else None, None)
        config = G.SM90_CONFIGS[cls.bucket]
        for request in (G.sm90_request(cls, config), G.sm90_reference_request(cls, config)):
            wanted[(request.kernel, request.params)] = request
    return wanted


def inputs(dtype, shape, fused, seed=0):
    m, n, k = shape
    generator = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", dtype=DTYPES[dtype], generator=generator)
    b = torch.randn(k, n, device="cuda", dtype=DTYPES[dtype], generator=generator)
    bias = torch.randn(n, device="cuda", dtype=DTYPES[dtype], generator=generator) if fused else None
    return a, b, bias


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="two shapes a dtype, one fused")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    target = Target("cuda", torch.cuda.get_device_capability(0))
    out_dir = Path(os.environ.get("JITOPS_BENCH_OUT", "."))
    results = {"device": torch.cuda.get_device_name(0), "bitwise": [], "speed": [], "host_us": {}}
    bench = Bench("sm90 nvrtc vs nvcc", rounds=args.rounds)
    mismatches = 0
    for dtype, shape, fused in cases(args.quick):
        m, n, k = shape
        a, b, bias = inputs(dtype, shape, fused)
        activation = "gelu" if fused else None
        cls = G.shape_class(a, b, bias, activation, None)
        config = G.SM90_CONFIGS[cls.bucket]
        ours = jitops.runtime.get_kernel(G.sm90_request(cls, config), target, 0)
        with jitops.config.scope(offline=True):  # the reference must come prebuilt: never nvcc here
            reference = jitops.runtime.get_kernel(G.sm90_reference_request(cls, config), target, 0)
        out_ours = torch.full((m, n), float("nan"), device="cuda", dtype=cls.out_dtype)
        out_ref = torch.full((m, n), float("nan"), device="cuda", dtype=cls.out_dtype)
        act = G.ACTIVATIONS[activation]

        def run_ours():
            G.run_sm90(ours, cls, config, a, b, out_ours, bias, m, n, k, k, n, act)

        def run_ref():
            G.run_sm90_reference(reference, cls, config, a, b, out_ref, bias, m, n, k, k, n, act)

        run_ours()
        run_ref()
        torch.cuda.synchronize()
        same = torch.equal(out_ours.view(torch.int16), out_ref.view(torch.int16))
        expected = a.float() @ b.float()
        if fused:
            expected = F.gelu(expected + bias.float())
        error = ((out_ours.float() - expected).norm() / expected.norm()).item()
        mismatches += not same
        label = f"{dtype} {m}x{n}x{k}{' bias+gelu' if fused else ''} ({cls.bucket})"
        print(f"{label:44s} bit-for-bit {'yes' if same else 'NO'}  rel. error vs fp32 {error:.2e}", flush=True)
        results["bitwise"].append({"case": label, "identical": same, "rel_error": error})
        row = bench.compare(op="gemm nvrtc/nvcc", shape=shape, dtype=dtype + (" fused" if fused else ""),
                            ours=run_ours, baseline=run_ref, baseline_name="nvcc build",
                            flops=2.0 * m * n * k)
        results["speed"].append({"case": label, "nvrtc_ms": row.ours_ms, "nvcc_ms": row.baseline_ms,
                                 "nvcc_over_nvrtc": row.speedup})

    # Host cost per call: a problem small enough that the GPU keeps up (the skinny bucket).
    m, n, k = 128, 4096, 128
    a, b, _ = inputs("bf16", (m, n, k), False)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    cls = G.shape_class(a, b, None, None, None)
    config = G.SM90_CONFIGS[cls.bucket]
    ours = jitops.runtime.get_kernel(G.sm90_request(cls, config), target, 0)
    with jitops.config.scope(offline=True):
        reference = jitops.runtime.get_kernel(G.sm90_reference_request(cls, config), target, 0)
    host = G.sm90_host(ours, cls, config)
    sms, stream, swizzle = sm_count(0), current_stream(0), G._swizzle(config, m, n)
    pa, pb, po = a.data_ptr(), b.data_ptr(), out.data_ptr()
    raw_ref = reference.jitops_gemm_run._fn
    paths = {
        "torch.matmul": lambda: torch.matmul(a, b),
        "torch.addmm": lambda: torch.addmm(bias, a, b),
        "jitops.gemm (NVRTC kernel, Python host)": lambda: jitops.gemm(a, b),
        "run_sm90 (NVRTC kernel, Python host)": lambda: G.run_sm90(ours, cls, config, a, b, out, None, m, n, k, k,
                                                                   n, 0),
        "Sm90Gemm.run (cached Params, one launch)": lambda: host.run(pa, pb, po, 0, m, n, k, k, n, n, 0, swizzle, 0,
                                                                     sms, stream),
        "run_sm90_reference (nvcc library)": lambda: G.run_sm90_reference(reference, cls, config, a, b, out, None,
                                                                          m, n, k, k, n, 0),
        "library call, converted arguments": lambda: raw_ref(pa, pb, po, None, m, n, k, k, n, n, 0, swizzle, 0, 0, 1,
                                                             sms, None, stream),
    }
    times = host_us(*paths.values(), calls=5000, rounds=5, warmup=200)
    print(f"\nhost time per call, {m}x{n}x{k} bf16 ({cls.bucket}):")
    for name, us in zip(paths, times):
        print(f"  {name:44s} {us:6.2f} us")
        results["host_us"][name] = us
    print(bench.table())
    print(f"\nbit-for-bit: {len(results['bitwise']) - mismatches} of {len(results['bitwise'])} identical")
    (out_dir / "probe_sm90_nvrtc.json").write_text(json.dumps(results, indent=1))
    if mismatches:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
