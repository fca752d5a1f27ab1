"""`python -m jitops`: run every public op against torch on this machine's devices and print the counters.

On a GPU-less machine this is the CPU path (C++ through the host compiler, ATen for the CUTLASS ops); with a GPU
the CUDA kernels run too.  `--manifest` prints, without running anything, the prewarm manifest of exactly
these calls (what `make run` prewarms first), so that a run after that prewarm compiles nothing:

    python -m jitops
    python -m jitops --device cpu
    python -m jitops --manifest --arch sm_80,sm_90a,cpu > m.json && python -m cache_tools prewarm --manifest m.json
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable, NamedTuple

import torch
import torch.nn.functional as F

import jitops

CPU_DTYPES = [torch.float32, torch.float64]
CUDA_DTYPES = [torch.float32, torch.float16, torch.bfloat16]


class Check(NamedTuple):
    label: str
    op: str                          # the public op: jitops.<op>
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    reference: Callable[..., Any]    # the same arguments -> torch's result


def checks(device: str, dtype: torch.dtype, tensor: Callable[..., torch.Tensor]) -> list[Check]:
    """The calls, with `tensor(*shape)` making each input (random values, or meta / fake tensors for
    --manifest)."""
    x, y = tensor(1000, 257), tensor(1000, 257)
    weight, bias = tensor(257), tensor(257)
    found = [
        Check("add", "add", (x, y), {}, lambda a, b: a + b),
        Check("gelu tanh", "gelu", (x, "tanh"), {}, lambda t, approximate: F.gelu(t, approximate=approximate)),
        Check("gelu", "gelu", (x,), {}, F.gelu),
        Check("layer_norm", "layer_norm", (x, (257,), weight, bias), {}, F.layer_norm),
        Check("rms_norm", "rms_norm", (x, (257,), weight), {}, F.rms_norm),
    ]
    if device == "cpu" or dtype in (torch.float16, torch.bfloat16):
        image, filters = tensor(2, 64, 14, 14), tensor(64, 64, 3, 3)
        found.append(Check("conv2d", "conv2d", (image, filters), {"padding": 1}, F.conv2d))
        a_list = [tensor(m, 64) for m in (32, 100, 7)]
        b_list = [tensor(64, 48) for _ in range(3)]
        found.append(Check("grouped_gemm", "grouped_gemm", (a_list, b_list), {},
                           lambda As, Bs: [a @ b for a, b in zip(As, Bs)]))
        a, b = tensor(300, 200), tensor(200, 100)
        found.append(Check("gemm", "gemm", (a, b), {}, torch.matmul))
    if device == "cpu":
        # On the GPU linear runs gemm's kernels with the weight transposed (4 more NVRTC builds for make run's
        # prewarm); tests/test_linear_gpu.py checks those.
        features, features_bias = tensor(100, 257), tensor(100)
        found.append(Check("linear", "linear", (x, features, features_bias), {}, F.linear))
    return found


def _flat(value: Any) -> torch.Tensor:
    return torch.cat([v.flatten() for v in value]) if isinstance(value, (list, tuple)) else value


def run_ops(device: str, dtypes: list[torch.dtype]) -> int:
    failures = 0
    generator = torch.Generator().manual_seed(0)
    for dtype in dtypes:
        def tensor(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=generator).to(device, dtype)

        for check in checks(device, dtype, tensor):
            got = _flat(getattr(jitops, check.op)(*check.args, **check.kwargs))
            want = _flat(check.reference(*check.args, **check.kwargs))
            error = ((got.double() - want.double()).norm() / max(want.double().norm(), 1e-30)).item()
            ok = error < 2e-2
            failures += not ok
            print(f"  {device:4s} {str(dtype).removeprefix('torch.'):8s} {check.label:12s} relative error {error:.1e}"
                  f"{'' if ok else '  <-- too large'}")
    return failures


def manifest(archs: list[str]) -> dict[str, Any]:
    """The prewarm manifest of run_ops() on these archs ('cpu' and GPU archs such as sm_90a): one item per
    call, without a gradient ("grad": false), as meta (GPU) or fake CPU tensors: nothing runs or allocates."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    items: list[dict[str, Any]] = []
    targets = [("cpu", CPU_DTYPES, ["cpu"])] if "cpu" in archs else []
    gpu = [a for a in archs if a != "cpu"]
    if gpu:
        targets.append(("cuda", CUDA_DTYPES, gpu))
    for device, dtypes, item_archs in targets:
        mode = FakeTensorMode()
        for dtype in dtypes:
            def tensor(*shape: int) -> torch.Tensor:
                if device == "cuda":
                    return torch.empty(shape, dtype=dtype, device="meta")
                with mode:
                    return torch.empty(shape, dtype=dtype, device="cpu")

            for check in checks(device, dtype, tensor):
                item = jitops.find_public(check.op).manifest_item(*check.args, grad=False, **check.kwargs)
                item["archs"] = item_archs
                if item not in items:
                    items.append(item)
    return {"_about": "what `python -m jitops` runs (python -m jitops --manifest)", "ops": items}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jitops", description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda", "all"], default="all")
    parser.add_argument("--manifest", action="store_true",
                        help="print the prewarm manifest of these calls for --arch, and run nothing")
    parser.add_argument("--arch", default="sm_80,sm_90a,cpu",
                        help="with --manifest: comma-separated archs (default sm_80,sm_90a,cpu)")
    args = parser.parse_args(argv)
    if args.manifest:
        json.dump(manifest([a.strip() for a in args.arch.split(",") if a.strip()]), sys.stdout, indent=1)
        print()
        return 0
    print(f"jitops {jitops.__version__}, torch {torch.__version__}, cache {jitops.config.cache_dir}")
    failures = 0
    if args.device in ("cpu", "all"):
        failures += run_ops("cpu", CPU_DTYPES)
    if args.device in ("cuda", "all"):
        if torch.cuda.is_available():
            failures += run_ops("cuda", CUDA_DTYPES)
        else:
            print("  no GPU here: the CUDA kernels can be prewarmed (cache_tools) but not run")
    print(f"stats: {jitops.stats.as_dict()}")
    if jitops.stats.compiles:
        print(f"compiled {jitops.stats.compiles} kernels in {jitops.stats.compile_seconds:.1f} s: they were not in "
              f"the cache (`python -m jitops --manifest` lists what to prewarm)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
