"""`python -m jitops`: run every built-in op against torch on this machine's devices and print the counters.

On a GPU-less machine this is the CPU path (C++ through load_inline, ATen for the CUTLASS ops); with a GPU
the CUDA kernels run too.  Prewarming is `python -m cache_tools prewarm --all-builtin` (what `make run` does
first); a prewarmed cache makes this run without compiling.

    python -m jitops
    python -m jitops --device cpu
"""
from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

import jitops


def _checks(device: str, dtype: torch.dtype) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(device, dtype)

    x, y = randn(1000, 257), randn(1000, 257)
    weight, bias = randn(257), randn(257)
    checks = {
        "add": (jitops.add(x, y), x + y),
        "gelu tanh": (jitops.gelu(x, "tanh"), F.gelu(x, approximate="tanh")),
        "gelu": (jitops.gelu(x), F.gelu(x)),
        "layer_norm": (jitops.layer_norm(x, (257,), weight, bias), F.layer_norm(x, (257,), weight, bias)),
    }
    if device == "cpu" or dtype in (torch.float16, torch.bfloat16):
        image, filters = randn(2, 64, 14, 14), randn(64, 64, 3, 3)
        checks["conv2d"] = (jitops.conv2d(image, filters, padding=1), F.conv2d(image, filters, padding=1))
        a_list = [randn(m, 64) for m in (32, 100, 7)]
        b_list = [randn(64, 48) for _ in range(3)]
        got = torch.cat([o.flatten() for o in jitops.grouped_gemm(a_list, b_list)])
        want = torch.cat([(a @ b).flatten() for a, b in zip(a_list, b_list)])
        checks["grouped_gemm"] = (got, want)
    if hasattr(jitops, "gemm") and (device == "cpu" or dtype in (torch.float16, torch.bfloat16)):
        a, b = randn(300, 200), randn(200, 100)
        checks["gemm"] = (jitops.gemm(a, b), a @ b)
    return checks


def run_ops(device: str, dtypes: list[torch.dtype]) -> int:
    failures = 0
    for dtype in dtypes:
        for name, (got, want) in _checks(device, dtype).items():
            error = ((got.double() - want.double()).norm() / max(want.double().norm(), 1e-30)).item()
            ok = error < 2e-2
            failures += not ok
            print(f"  {device:4s} {str(dtype).removeprefix('torch.'):8s} {name:12s} relative error {error:.1e}"
                  f"{'' if ok else '  <-- too large'}")
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jitops", description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda", "all"], default="all")
    args = parser.parse_args(argv)
    print(f"jitops {jitops.__version__}, torch {torch.__version__}, cache {jitops.config.cache_dir}")
    failures = 0
    if args.device in ("cpu", "all"):
        failures += run_ops("cpu", [torch.float32, torch.float64])
    if args.device in ("cuda", "all"):
        if torch.cuda.is_available():
            failures += run_ops("cuda", [torch.float32, torch.float16, torch.bfloat16])
        else:
            print("  no GPU here: the CUDA kernels can be prewarmed (cache_tools) but not run")
    print(f"stats: {jitops.stats.as_dict()}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
