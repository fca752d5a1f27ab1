"""Regenerate tests/cutlass_host/sm90_gemm_fixtures.json: CUTLASS's own host code for jitops.gemm's sm_90a
kernels, run on the CPU (sm90_gemm_params.cu, built by nvcc for the host only, cuTensorMapEncodeTiled replaced
by a recorder), over a set of configurations and problems.  tests/test_cutlass_host.py checks that
jitops/cutlass_host.py computes the same Params bytes, descriptor arguments and grids without CUTLASS's host
code.  Needs nvcc; takes about 40 s a configuration on 2 cores.  Rerun after a CUTLASS upgrade.

    PYTHONPATH=$PWD python tests/cutlass_host/make_fixtures.py [--jobs 2]
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

from jitops.backends import nvcc as nvcc_backend, toolkit  # noqa: E402
from jitops.ops import gemm as G  # noqa: E402
from jitops.ops import gemm_plan as P  # noqa: E402

A, B, D, BIAS = 0x7F0000100000, 0x7F0000200000, 0x7F0000300000, 0x7F0000400000


def cls_of(dtype, out, a_kmajor, b_kmajor, fused, bucket):
    return P.GemmClass(dtype, out, a_kmajor, b_kmajor, 8, bucket, fused, "auto")


BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
# (class, configuration): every bucket's configuration once, every operand layout on two of them, the fused
# epilogue, fp16 and an fp32 output.
CASES = [(cls_of(BF16, BF16, True, True, False, bucket), config) for bucket, config in P.SM90_CONFIGS.items()]
CASES += [(cls_of(BF16, BF16, ak, bk, False, bucket), P.SM90_CONFIGS[bucket])
          for bucket in ("large", "decode") for ak, bk in ((True, False), (False, True), (False, False))]
CASES += [(cls_of(BF16, BF16, True, False, True, "large"), P.SM90_CONFIGS["large"]),
          (cls_of(FP16, FP16, False, True, True, "decode_narrow"), P.SM90_CONFIGS["decode_narrow"]),
          (cls_of(FP16, FP32, True, True, False, "medium"), P.SM90_CONFIGS["medium"]),
          (cls_of(BF16, FP32, False, False, True, "small"), P.SM90_CONFIGS["small"])]

# m, n, k, activation, swizzle, raster, sm_count, bias: leading dimensions follow the layouts (padded).
PROBLEMS = [(4096, 4096, 4096, 0, 8, 0, 132, False), (1000, 1000, 1008, 0, 1, 0, 132, False),
            (128, 8192, 8192, 0, 1, 0, 132, False), (16, 14336, 4096, 0, 1, 0, 132, False),
            (8, 8, 8, 0, 1, 0, 132, False), (8192, 1024, 4096, 0, 4, 1, 132, False),
            (2048, 16384, 1024, 0, 2, 2, 114, False), (4000, 4000, 4000, 0, 8, 0, 132, False),
            (24, 520, 64, 0, 8, 2, 132, False)]
FUSED_PROBLEMS = [(1000, 1000, 1008, 2, 1, 0, 132, True), (4096, 4096, 4096, 1, 8, 0, 132, True),
                  (16, 14336, 4096, 0, 1, 0, 132, True)]


def problem_args(cls, problem):
    m, n, k, activation, swizzle, raster, sms, bias = problem
    lda = (k if cls.a_kmajor else m) + 8
    ldb = (k if cls.b_kmajor else n) + 16
    return [m, n, k, lda, ldb, n, activation, swizzle, raster, sms, A, B, D, BIAS if bias else 0]


def build_and_run(case) -> dict:
    cls, config = case
    request = G.sm90_reference_request(cls, config)
    nvcc = toolkit.nvcc_path()
    includes = [ROOT / "kernels" / "gemm", ROOT / "kernels", *toolkit.cutlass_include_dirs()]
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "params"
        cmd = [str(nvcc), "-std=c++17", "-O1", "-DNDEBUG", "-DCUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL=1",
               nvcc_backend.gencode("sm_90a"), "--expt-relaxed-constexpr", *[f"-I{d}" for d in includes],
               *[f"-D{k}={v}" for k, v in request.defines], "-o", str(exe), str(HERE / "sm90_gemm_params.cu")]
        built = subprocess.run(cmd, capture_output=True, text=True)
        if built.returncode:
            raise RuntimeError(f"nvcc failed for {cls}:\n{built.stdout}{built.stderr}")
        problems = PROBLEMS + (FUSED_PROBLEMS if cls.fused else [])
        argv = [str(v) for p in problems for v in problem_args(cls, p)]
        out = json.loads(subprocess.run([str(exe), *argv], check=True, capture_output=True, text=True).stdout)
    out["class"] = [str(cls.dtype).removeprefix("torch."), str(cls.out_dtype).removeprefix("torch."),
                    cls.a_kmajor, cls.b_kmajor, cls.fused, cls.bucket]
    out["defines"] = dict(request.defines)
    print(f"built {cls.bucket} {out['class']}", file=sys.stderr, flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=HERE / "sm90_gemm_fixtures.json")
    args = parser.parse_args()
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(build_and_run, CASES))
    meta = {"cutlass": toolkit.cutlass_version(), "nvcc": toolkit.nvcc_identity()}
    args.out.write_text(json.dumps({"generated_with": meta, "cases": results}, indent=None) + "\n")
    print(f"wrote {args.out} ({len(results)} configurations)", file=sys.stderr)


if __name__ == "__main__":
    main()
