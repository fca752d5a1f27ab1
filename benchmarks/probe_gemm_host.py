"""Where jitops.gemm's host time goes on the sm_90 path: the whole op, the run function (the NVRTC kernel through
jitops/cutlass_host.py), and for comparison the nvcc-built reference library (CUTLASS's host code): its call
through the ctypes wrapper, the same call with its arguments already converted, and its workspace query (which
builds CUTLASS's arguments but encodes no TMA descriptor and launches nothing).

    python benchmarks/probe_gemm_host.py [--compare-library PATH]     # on the GPU

--compare-library: another build of the same configuration (its kernel.so, e.g. one whose host code keeps the
Params of recent calls), whose library call is timed in the same rounds.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jitops  # noqa: E402
from harness import host_us  # noqa: E402
from jitops.launch import current_stream, sm_count  # noqa: E402
from jitops.specs import Target  # noqa: E402

G = importlib.import_module("jitops.ops.gemm")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--compare-library", type=Path)
    args = parser.parse_args()
    m, n, k = 128, 4096, 128
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    target = Target("cuda", torch.cuda.get_device_capability(0))
    cls = G.shape_class(a, b, None, None, None)
    config = G.SM90_CONFIGS[cls.bucket]
    kernel = jitops.runtime.get_kernel(G.sm90_request(cls, config), target, 0)
    lib = jitops.runtime.get_kernel(G.sm90_reference_request(cls, config), target, 0)
    run, workspace = lib.jitops_gemm_run, lib.jitops_gemm_workspace
    raw_run, raw_workspace = run._fn, workspace._fn
    sms, stream = sm_count(0), current_stream(0)
    swizzle = G._swizzle(config, m, n)
    pointers = (a.data_ptr(), b.data_ptr(), out.data_ptr(), None)
    paths = {
        "torch.matmul": lambda: torch.matmul(a, b),
        "jitops.gemm": lambda: jitops.gemm(a, b),
        "run_sm90 (NVRTC kernel, Python host side)": lambda: G.run_sm90(kernel, cls, config, a, b, out, None, m, n,
                                                                         k, k, n, 0),
        "library call (ctypes wrapper)": lambda: run(a, b, out, None, m, n, k, k, n, n, 0, swizzle, 0, 0, 1, sms,
                                                     None, stream),
        "library call (converted arguments)": lambda: raw_run(*pointers, m, n, k, k, n, n, 0, swizzle, 0, 0, 1, sms,
                                                              None, stream),
        "workspace query (CUTLASS arguments only)": lambda: raw_workspace(m, n, k, swizzle, 0, 0, 1, sms),
        "torch.empty (the output)": lambda: torch.empty(m, n, device="cuda", dtype=torch.bfloat16),
        **({} if args.compare_library is None else {
            f"{args.compare_library.name} (converted arguments)": compare(args.compare_library, pointers, m, n, k,
                                                                          swizzle, sms, stream)}),
        "shape class": lambda: G.shape_class(a, b, None, None, None),
    }
    times = host_us(*paths.values(), calls=5000, rounds=5, warmup=200)
    print(f"bucket {cls.bucket}, {config}")
    for name, us in zip(paths, times):
        print(f"  {name:44s} {us:6.2f} us")


def compare(path: Path, pointers, m, n, k, swizzle, sms, stream):
    from jitops.launch import HostLibrary
    signatures = [(name, kinds, ret) for name, (kinds, ret) in G.SM90_GEMM_REFERENCE.functions.items()]
    raw_run = HostLibrary(str(path), signatures).jitops_gemm_run._fn
    return lambda: raw_run(*pointers, m, n, k, k, n, n, 0, swizzle, 0, 0, 1, sms, None, stream)


if __name__ == "__main__":
    main()
