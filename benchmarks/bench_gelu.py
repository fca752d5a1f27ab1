"""gelu forward and backward: jitops against torch's own CUDA kernels and the device copy bandwidth, measured in
the same run.

    python benchmarks/bench_gelu.py            # the benchmark set
    python benchmarks/bench_gelu.py --sweep    # tuning variants (loads a thread, grid cap, fast tanh) at 2^28 elements

Goal on the lent H100: forward and backward at least 90% of the copy bandwidth (read + write) of this run.
forward: jitops.gelu(x, a) vs F.gelu(x, approximate=a), 2 bytes moved per element and byte of dtype (read x,
write y); backward: jitops.gelu_backward(dy, x, a) vs torch.ops.aten.gelu_backward, 3 (read dy and x, write dx).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Bench, copy_bandwidth, rotate  # noqa: E402

import jitops  # noqa: E402

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
SIZES = [1 << 16, 1 << 20, 1 << 24, 1 << 28]


def check(dtype: torch.dtype, approximate: str) -> None:
    x = torch.randn(1 << 20, device="cuda", dtype=dtype) * 3
    dy = torch.randn_like(x)
    ref = F.gelu(x.double(), approximate=approximate)
    ref_b = torch.ops.aten.gelu_backward(dy.double(), x.double(), approximate=approximate)
    for name, ours, theirs in (("forward", jitops.gelu(x, approximate), ref),
                               ("backward", jitops.gelu_backward(dy, x, approximate), ref_b)):
        error = ((ours.double() - theirs).norm() / theirs.norm()).item()
        if not error < 1e-2:
            raise SystemExit(f"gelu {name} {dtype} {approximate}: relative error {error:.1e}")


def compare(bench: Bench, numel: int, name: str, approximate: str, label: str = "") -> None:
    dtype = DTYPES[name]
    size = torch.empty((), dtype=dtype).element_size()
    check(dtype, approximate)
    sets = rotate(lambda: (torch.randn(numel, device="cuda", dtype=dtype),
                           torch.randn(numel, device="cuda", dtype=dtype)), 3 * numel * size)

    def ours_fwd():
        x, _ = sets()
        return jitops.gelu(x, approximate)

    def torch_fwd():
        x, _ = sets()
        return F.gelu(x, approximate=approximate)

    def ours_bwd():
        x, dy = sets()
        return jitops.gelu_backward(dy, x, approximate)

    def torch_bwd():
        x, dy = sets()
        return torch.ops.aten.gelu_backward(dy, x, approximate=approximate)

    bench.compare(op=f"gelu {approximate} fwd{label}", shape=(numel,), dtype=name, ours=ours_fwd,
                  baseline=torch_fwd, baseline_name="torch", bytes_moved=2 * numel * size, timing="auto")
    bench.compare(op=f"gelu {approximate} bwd{label}", shape=(numel,), dtype=name, ours=ours_bwd,
                  baseline=torch_bwd, baseline_name="torch", bytes_moved=3 * numel * size, timing="auto")
    sets = None  # frees the rotating inputs before the next shape
    torch.cuda.empty_cache()


def sweep(bench: Bench) -> None:
    """Tuning variants (config.gelu_tuning over jitops/ops/gelu_plan.py's constants): loads in flight a thread,
    grid cap, fast tanh."""
    names = ("unroll_forward", "unroll_backward", "blocks_per_sm", "fast_tanh")
    for values in ((4, 2, 0, 0), (1, 1, 0, 0), (2, 2, 0, 0), (4, 4, 0, 0), (8, 8, 0, 0), (4, 2, 8, 0), (4, 2, 16, 0),
                   (4, 2, 0, 1)):
        with jitops.config.scope(gelu_tuning=dict(zip(names, values))):
            jitops.find("gelu").clear_memory()  # kernels built in this scope, with its constants
            jitops.find("gelu_backward").clear_memory()
            label = " u{}/{} b{}{}".format(*values[:3], " fast" if values[3] else "")
            for name in ("bf16", "fp32"):
                for approximate in ("none", "tanh"):
                    if name == "fp32" and values[3]:
                        continue
                    compare(bench, 1 << 28, name, approximate, label)
    jitops.find("gelu").clear_memory()
    jitops.find("gelu_backward").clear_memory()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="tuning variants at 2^28 elements")
    args = parser.parse_args()
    torch.manual_seed(0)
    copy = copy_bandwidth()
    bench = Bench("gelu", baseline="torch (F.gelu, aten.gelu_backward)", variant="sweep" if args.sweep else None,
                  roofline=copy, min_ms=40, reps=30)
    if args.sweep:
        sweep(bench)
    else:
        for name in DTYPES:
            for approximate in ("none", "tanh"):
                for numel in SIZES:
                    compare(bench, numel, name, approximate)
    large = [r for r in bench.rows if r.shape == str((1 << 28,))]
    bench.summarize(goal="forward and backward >= 90% of copy at 2^28 elements",
               below_goal=[f"{r.op} {r.dtype} {r.extra['ours_of_copy']:.0%}" for r in large
                           if r.extra.get("ours_of_copy", 1) < 0.9],
               slower_than_torch=[f"{r.op} {r.shape} {r.dtype} x{r.speedup:.2f}" for r in bench.rows
                                  if r.speedup < 1.0])
    bench.finish()


if __name__ == "__main__":
    main()
