"""`python -m jitops`: the main job on any machine.

Prewarms the built-in ops' GPU kernels for the given archs (NVRTC needs no GPU), runs every built-in op on the
CPU path (and on the GPU when one is present) against torch, and prints what was compiled and cached.

    python -m jitops                       # archs sm_80 and sm_90a
    python -m jitops --arch sm_90a --no-cpu
"""
from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F

import jitops
from jitops.specs import Target

def prewarm(archs: list[str]) -> None:
    """Compile the built-in ops' common shape classes (jitops.ops.PREWARM) for each arch, one at a time
    (`cache_tools prewarm --all-builtin` does the same in parallel, with a report)."""
    from jitops.ops import PREWARM

    for arch in archs:
        target = Target.parse(arch)
        started, outcomes = time.perf_counter(), {"compiled": 0, "cached": 0}
        for item in PREWARM:
            op = jitops.find(item["op"])
            for dtype in item["dtypes"]:
                for shapes in item["shapes"]:
                    args = op.example_args(dtype, shapes, item.get("kwargs", {}))
                    context = jitops.MissContext(op.name, op.shape_class(*args))  # names the op in `list`
                    for request in op.requests_for(args, target).values():
                        outcomes[jitops.runtime.prewarm(request, target, context)] += 1
        print(f"prewarm {arch}: {outcomes['compiled']} compiled, {outcomes['cached']} already cached "
              f"({time.perf_counter() - started:.1f} s)")


def run_ops(device: str, dtypes: list[torch.dtype]) -> None:
    for dtype in dtypes:
        x = torch.randn(1000, 257, device=device, dtype=dtype)
        y = torch.randn(1000, 257, device=device, dtype=dtype)
        checks = {
            "add": (jitops.add(x, y), x + y),
            "gelu tanh": (jitops.gelu(x, "tanh"), F.gelu(x, approximate="tanh")),
            "gelu none": (jitops.gelu(x), F.gelu(x)),
        }
        for name, (got, want) in checks.items():
            error = ((got.double() - want.double()).norm() / want.double().norm()).item()
            print(f"  {device} {str(dtype).removeprefix('torch.'):8s} {name:10s} relative error {error:.1e}")
            if error > 2e-2:
                raise SystemExit(f"jitops: {name} on {device} {dtype} is off by {error:.1e}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jitops", description=__doc__.splitlines()[0])
    parser.add_argument("--arch", action="append", help="GPU archs to prewarm (default: sm_80, sm_90a)")
    parser.add_argument("--no-cpu", action="store_true", help="skip running the ops on the CPU")
    args = parser.parse_args(argv)
    archs = [a for item in (args.arch or ["sm_80", "sm_90a"]) for a in item.split(",") if a]
    print(f"jitops {jitops.__version__}, torch {torch.__version__}, cache {jitops.config.cache_dir}")
    prewarm(archs)
    if not args.no_cpu:
        run_ops("cpu", [torch.float32, torch.float64])
    if torch.cuda.is_available():
        run_ops("cuda", [torch.float32, torch.float16, torch.bfloat16])
    else:
        print("  no GPU here: the CUDA kernels were compiled (above) but not run")
    print(f"stats: {jitops.stats.as_dict()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
