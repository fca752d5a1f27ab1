"""Why jitops.gemm 128x8192x8192 read 67 us in one benchmark run (events, alternating rounds) and 52.8 us in the
run before (events, one pair): the same call timed several ways in one process, against torch.matmul.

    python benchmarks/probe_gemm_timing.py
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jitops
from harness import Bench, host_us, time_cuda, time_cuda_graph
from jitops.specs import Target

G = importlib.import_module("jitops.ops.gemm")


def main() -> None:
    m, n, k = 128, 8192, 8192
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    cls = G.shape_class(a, b, None, None, None)
    config = G.SM90_CONFIGS[cls.bucket]
    lib = jitops.runtime.get_kernel(G.sm90_request(cls, config), Target("cuda", (9, 0)), 0)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    paths = {"jitops.gemm": lambda: jitops.gemm(a, b), "run_sm90 (preallocated out)":
             lambda: G.run_sm90(lib, cls, config, a, b, out, None, m, n, k, k, n, 0),
             "torch.matmul": lambda: torch.matmul(a, b)}
    for name, fn in paths.items():
        fn()
        print(f"{name:30s} events 200 ms: {time_cuda(fn) * 1e3:6.1f} us   events 40 ms: "
              f"{time_cuda(fn, min_ms=40.0) * 1e3:6.1f} us   graph: {time_cuda_graph(fn) * 1e3:6.1f} us", flush=True)
    print("host us per call:", dict(zip(paths, (round(t, 1) for t in host_us(*paths.values(), calls=500)))))
    for rounds in (1, 5):
        bench = Bench(f"probe-rounds{rounds}", rounds=rounds)
        bench.compare(op="gemm", shape=f"{m}x{n}x{k}", dtype="bf16", ours=paths["jitops.gemm"],
                      baseline=paths["torch.matmul"], baseline_name="torch.matmul", flops=2 * m * n * k)


if __name__ == "__main__":
    main()
