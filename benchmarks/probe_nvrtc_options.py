"""Where NVRTC spends a CUTLASS 3 kernel's compile, and which options or source changes shorten it: one
jitops.gemm sm_90a kernel compiled several ways, each in its own process (in parallel, one core each), with
NVRTC's own phase times (-time): C++ front end, NVVM optimizer, PTX to SASS.

    python benchmarks/probe_nvrtc_options.py [--jobs N] [--variants a,b,...]      # no GPU needed

Variants:
  shipped      kernels/gemm/sm90_gemm_kernel.cu as jitops builds it (Hopper-only includes, C++17)
  umbrella     the same with CUTLASS's umbrella headers (every architecture's collectives and kernels) first
  cxx20        -std=c++20
  split        -split-compile=0 (NVVM and ptxas on as many threads as there are cores)
  pingpong     the 64x64 ping-pong configuration (decode_narrow) as shipped
  pch          in one process: the pingpong kernel with -pch (automatic precompiled header), then the shipped
               one with -pch: the second compile's time shows what the PCH of the shared includes saves
"""
from __future__ import annotations

import argparse
import concurrent.futures
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent)]

UMBRELLA = ('#include "cutlass/gemm/collective/collective_builder.hpp"\n'
            '#include "cutlass/gemm/kernel/gemm_universal.hpp"\n')
VARIANTS = ("shipped", "umbrella", "cxx20", "split", "pingpong", "pch")


def request(bucket: str):
    import torch

    G = importlib.import_module("jitops.ops.gemm")
    a = torch.empty(4096, 4096, dtype=torch.bfloat16, device="meta")
    cls = G.shape_class(a, a, None, None, None)._replace(bucket=bucket)
    return G.sm90_request(cls, G.SM90_CONFIGS[bucket])


def compile_once(binding, backend, req, extra: list[str], prefix: str = "") -> dict:
    from jitops.backends import toolkit  # noqa: F401 - header set

    options = backend.options(req, "sm_90a") + extra
    with tempfile.NamedTemporaryFile(suffix=".csv", delete=False) as fh:
        times_file = fh.name
    options.append(f"-time={times_file}")
    program = binding.createProgram(prefix + req.source.read(), req.source.name, [], [])
    binding.addNameExpression(program, req.entry)
    started = time.perf_counter()
    try:
        binding.compileProgram(program, options)
    except binding.NVRTCError:
        raise SystemExit(binding.getProgramLog(program)[-3000:]) from None
    seconds = time.perf_counter() - started
    cubin = binding.getCUBIN(program)
    binding.destroyProgram(program)
    phases = {}
    for line in Path(times_file).read_text().splitlines()[1:]:
        parts = [p.strip() for p in line.split(",")]
        phases[parts[1]] = round(float(parts[2]) / 1e3, 2)
    os.unlink(times_file)
    return {"seconds": round(seconds, 2), "phases": phases, "cubin_bytes": len(cubin)}


def run_variant(variant: str) -> dict:
    from jitops.backends import toolkit
    from jitops.backends.nvrtc import NvrtcBackend

    binding = toolkit.nvrtc()
    backend = NvrtcBackend()
    large, pingpong = request("large"), request("decode_narrow")
    if variant == "shipped":
        return compile_once(binding, backend, large, [])
    if variant == "umbrella":
        return compile_once(binding, backend, large, [], prefix=UMBRELLA)
    if variant == "cxx20":
        return compile_once(binding, backend, large, ["-std=c++20"])
    if variant == "split":
        return compile_once(binding, backend, large, ["-split-compile=0"])
    if variant == "pingpong":
        return compile_once(binding, backend, pingpong, [])
    if variant == "pch":
        first = compile_once(binding, backend, pingpong, ["-pch"])
        second = compile_once(binding, backend, large, ["-pch"])
        return {**second, "first (pingpong, creates the PCH)": first}
    raise SystemExit(f"unknown variant {variant!r}; use {', '.join(VARIANTS)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    args = parser.parse_args()
    variants = args.variants.split(",")

    def child(variant):
        out = subprocess.run([sys.executable, __file__, "--child", variant], capture_output=True, text=True)
        if out.returncode:
            return variant, {"error": (out.stdout + out.stderr)[-2000:]}
        return variant, json.loads(out.stdout.strip().splitlines()[-1])

    from jitops.backends import toolkit

    print(f"NVRTC {toolkit.nvrtc_identity()}, CUTLASS {toolkit.cutlass_version()}, {os.cpu_count()} cores, "
          f"{args.jobs} at once", flush=True)
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        results = dict(pool.map(child, variants))
    print("\n| variant | seconds | front end | NVVM | PTX to SASS | cubin KB |\n| --- | --- | --- | --- | --- | --- |")
    for variant, r in results.items():
        if "error" in r:
            print(f"| {variant} | failed: {r['error'][-300:]!r} |")
            continue
        p = r["phases"]
        print(f"| {variant} | {r['seconds']:.1f} | {p.get('CUDA C++ Frontend', 0):.1f} | "
              f"{p.get('NVVM Optimizer', 0):.1f} | {p.get('PTX Translation', p.get('Ptxas', 0)):.1f} | "
              f"{r['cubin_bytes'] // 1024} |")
        if "first (pingpong, creates the PCH)" in r:
            print(f"| (pch: the first compile, pingpong) | {r['first (pingpong, creates the PCH)']['seconds']:.1f} "
                  "| | | | |")
    out_dir = os.environ.get("JITOPS_BENCH_OUT")
    if out_dir:
        Path(out_dir, "nvrtc_options.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        print(json.dumps(run_variant(sys.argv[2])))
    else:
        main()
