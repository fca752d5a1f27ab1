"""rms_norm forward, and forward + backward, against torch's F.rms_norm and transformers' LlamaRMSNorm, in one run.

    python benchmarks/bench_rms_norm.py

jitops.rms_norm is layer_norm's kernels with the mean taken as 0 (kernels/layer_norm.cu, RMS).  What is compared,
bf16 and fp32, Llama's hidden sizes (1024, 4096) and the layer_norm headline (16384, 8192):
  forward            jitops.rms_norm(x, [n], w, 1e-6)  vs  F.rms_norm(x, [n], w, 1e-6)  and  LlamaRMSNorm's forward
                     (x in float32, x * rsqrt(mean(x^2) + eps), back to x's dtype, times the weight)
  forward + backward torch.autograd.grad of each with respect to x and the weight (the autograd engine both sides)
Bytes counted: forward reads x and w and writes y; forward + backward adds reading dy and x again and writing dx
and dweight.  Every call is timed as CUDA-graph replays, device time: with events, the (4096, 4096) forward +
backward timed jitops' Python path (111 us a backward call around 42 us of kernels, H200); host cost per call is
bench_models.py --host-ops's.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Bench, copy_bandwidth, rotate  # noqa: E402

import jitops  # noqa: E402

SHAPES = [(4096, 1024), (4096, 4096), (16384, 8192)]
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
EPS = 1e-6
BASELINE = "torch (F.rms_norm; transformers' LlamaRMSNorm forward as torch ops)"


def llama_rms_norm(x, weight, eps=EPS):
    """transformers' LlamaRMSNorm.forward, written out (the patched Llama's RMSNorms ran this)."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def compare(bench: Bench, rows: int, n: int, name: str) -> None:
    dtype = DTYPES[name]
    size = torch.empty((), dtype=dtype).element_size()

    def make():
        x = torch.randn(rows, n, device="cuda", dtype=dtype, requires_grad=True)
        w = (1 + 0.1 * torch.randn(n, device="cuda", dtype=dtype)).requires_grad_()
        return x, w, torch.randn(rows, n, device="cuda", dtype=dtype)

    x, w, dy = make()
    want = F.rms_norm(x.detach().double(), [n], w.detach().double(), EPS)
    error = ((jitops.rms_norm(x, [n], w, EPS).double() - want).norm() / want.norm()).item()
    if not error < 2e-2:
        raise SystemExit(f"rms_norm ({rows}, {n}) {name}: relative error {error:.1e}")
    sets = rotate(make, 3 * rows * n * size)
    functions = {"jitops": lambda x, w: jitops.rms_norm(x, [n], w, EPS),
                 "F.rms_norm": lambda x, w: F.rms_norm(x, [n], w, EPS),
                 "LlamaRMSNorm": llama_rms_norm}

    def forward(fn):
        def call():
            x, w, _ = sets()
            with torch.no_grad():
                return fn(x, w)
        return call

    def both(fn):
        def call():
            x, w, dy = sets()
            return torch.autograd.grad(fn(x, w), (x, w), dy)
        return call

    for baseline in ("F.rms_norm", "LlamaRMSNorm"):
        bench.compare(op="rms_norm fwd", shape=(rows, n), dtype=name, ours=forward(functions["jitops"]),
                      baseline=forward(functions[baseline]), baseline_name=baseline,
                      bytes_moved=(2 * rows * n + n) * size, timing="graph")
        bench.compare(op="rms_norm fwd+bwd", shape=(rows, n), dtype=name, ours=both(functions["jitops"]),
                      baseline=both(functions[baseline]), baseline_name=baseline,
                      bytes_moved=(5 * rows * n + 2 * n) * size, timing="graph")
    sets = None
    torch.cuda.empty_cache()


def main() -> None:
    torch.manual_seed(0)
    bench = Bench("rms_norm", baseline=BASELINE, roofline=copy_bandwidth(), min_ms=40, reps=30)
    for name in DTYPES:
        for rows, n in SHAPES:
            compare(bench, rows, n, name)
    bench.summarize(slower_than_baseline=[f"{r.op} {r.shape} {r.dtype} vs {r.baseline} x{r.speedup:.2f}"
                                          for r in bench.rows if r.speedup < 1.0])
    bench.finish()


if __name__ == "__main__":
    main()
