"""layer_norm forward and backward: jitops against torch's own CUDA kernels, timed in the same run.

    python benchmarks/bench_layer_norm.py              # the benchmark set and the headline shape
    python benchmarks/bench_layer_norm.py --quick      # the headline shape only
    python benchmarks/bench_layer_norm.py --sweep      # tuning variants at a few shapes (no JSON table)

The set: rows {1, 64, 4096, 65536} x hidden {128, 1024, 4097, 8192, 16384} x {fp32, fp16, bf16}, forward and
backward, plus the headline (16384, 8192) bf16 first.  Goals on the lent H100: at (16384, 8192) bf16 the forward
at least 1.4 times torch.nn.functional.layer_norm and the backward at least 1.8 times torch's; nowhere slower.

What is compared:
  forward   jitops.layer_norm(x, [n], w, b)  vs  F.layer_norm(x, [n], w, b)            (both also save mean/rstd)
  backward  jitops.layer_norm_backward(dy, x, stats, w, [n], True, True, True)  vs
            torch.ops.aten.native_layer_norm_backward(dy, x, [n], mean, rstd, w, b, [True, True, True])
            (dx, dweight and dbias; the raw ops, without the autograd engine on either side)
Bytes counted (the least any implementation must move, the same for both): forward reads x, w, b and writes y;
backward reads dy, x, w and writes dx, dweight, dbias.  Calls under 50 us are timed as CUDA-graph replays on
both sides (device time; the host's per-call cost is the last table); inputs smaller than 3x L2 rotate.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Bench, copy_bandwidth, host_us, rotate  # noqa: E402

import jitops  # noqa: E402

from jitops.ops import layer_norm as ln
from jitops.ops import layer_norm_plan as ln_plan  # noqa: E402
ROWS = [1, 64, 4096, 65536]
HIDDEN = [128, 1024, 4097, 8192, 16384]
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
HEADLINE = (16384, 8192, "bf16")
BASELINE = "torch (F.layer_norm, aten.native_layer_norm_backward)"


def inputs(rows: int, n: int, dtype: torch.dtype):
    x = torch.randn(rows, n, device="cuda", dtype=dtype)
    w = torch.randn(n, device="cuda", dtype=dtype)
    b = torch.randn(n, device="cuda", dtype=dtype)
    dy = torch.randn(rows, n, device="cuda", dtype=dtype)
    _, stats = jitops.layer_norm_forward(x, [n], w, b, 1e-5)
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, [n], w, b, 1e-5)
    return x, w, b, dy, stats, mean, rstd


def check(rows: int, n: int, dtype: torch.dtype) -> None:
    """Ours against torch's kernel on one fresh input (relative error of every output)."""
    x, w, b, dy, stats, mean, rstd = inputs(min(rows, 512), n, dtype)
    ours = [jitops.layer_norm(x, [n], w, b), *jitops.layer_norm_backward(dy, x, stats, w, [n], True, True, True)]
    theirs = [F.layer_norm(x.double(), [n], w.double(), b.double()),
              *torch.ops.aten.native_layer_norm_backward(dy.double(), x.double(), [n], mean.double(), rstd.double(),
                                                         w.double(), b.double(), [True, True, True])]
    for name, o, t in zip(("y", "dx", "dweight", "dbias"), ours, theirs):
        error = ((o.double() - t).norm() / t.norm().clamp_min(1e-30)).item()
        if not error < 2e-2:
            raise SystemExit(f"layer_norm {name} ({rows}, {n}) {dtype}: relative error {error:.1e}")


def compare(bench: Bench, rows: int, n: int, name: str, timing: str = "auto") -> None:
    dtype = DTYPES[name]
    size = torch.empty((), dtype=dtype).element_size()
    fwd_bytes = (2 * rows * n + 2 * n) * size
    bwd_bytes = (3 * rows * n + 3 * n) * size
    check(rows, n, dtype)
    sets = rotate(lambda: inputs(rows, n, dtype), 3 * rows * n * size)
    shape = (rows, n)

    def ours_fwd():
        x, w, b, *_ = sets()
        return jitops.layer_norm(x, [n], w, b)

    def torch_fwd():
        x, w, b, *_ = sets()
        return F.layer_norm(x, [n], w, b)

    def ours_bwd():
        x, w, b, dy, stats, _, _ = sets()
        return jitops.layer_norm_backward(dy, x, stats, w, [n], True, True, True)

    def torch_bwd():
        x, w, b, dy, _, mean, rstd = sets()
        return torch.ops.aten.native_layer_norm_backward(dy, x, [n], mean, rstd, w, b, [True, True, True])

    fc = ln.shape_class(sets()[0], [n], sets()[1], sets()[2], 1e-5)
    bench.compare(op="layer_norm fwd", shape=shape, dtype=name, ours=ours_fwd, baseline=torch_fwd,
                  baseline_name="torch", bytes_moved=fwd_bytes, timing=timing,
                  bucket=f"vec{fc.vec} tpr{fc.tpr} iters{fc.iters}")
    x = sets()[0]
    bc = ln.backward_shape_class(x, x, sets()[4], sets()[1], [n], True, True, True)
    bench.compare(op="layer_norm bwd", shape=shape, dtype=name, ours=ours_bwd, baseline=torch_bwd,
                  baseline_name="torch", bytes_moved=bwd_bytes, timing=timing,
                  bucket=f"vec{bc.vec} tpr{bc.tpr} iters{bc.iters} params{bc.params}")
    sets = None  # frees the rotating inputs before the next shape
    torch.cuda.empty_cache()


def host_overhead(bench: Bench) -> None:
    """Per-call wall time on tiny tensors (the host's cost: launch, checks, allocation)."""
    x = torch.randn(1, 128, device="cuda", dtype=torch.bfloat16)
    w, b = torch.randn(128, device="cuda", dtype=torch.bfloat16), torch.randn(128, device="cuda", dtype=torch.bfloat16)
    xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))
    dy = torch.randn_like(x)
    rows = {
        "forward, no grad": (lambda: jitops.layer_norm(x, [128], w, b), lambda: F.layer_norm(x, [128], w, b)),
        "forward recording autograd": (lambda: jitops.layer_norm(xg, [128], wg, bg),
                                       lambda: F.layer_norm(xg, [128], wg, bg)),
        "forward + backward (autograd)": (
            lambda: torch.autograd.grad(jitops.layer_norm(xg, [128], wg, bg), (xg, wg, bg), dy),
            lambda: torch.autograd.grad(F.layer_norm(xg, [128], wg, bg), (xg, wg, bg), dy)),
    }
    results = {}
    print("\n| call on a (1, 128) bf16 tensor | jitops (us) | torch (us) | ratio |\n| --- | --- | --- | --- |")
    for label, (ours, theirs) in rows.items():
        o, t = host_us(ours, theirs, calls=5000 if "backward" in label else 20000)
        results[label] = {"jitops_us": round(o, 2), "torch_us": round(t, 2), "ratio": round(o / t, 2)}
        print(f"| {label} | {o:.2f} | {t:.2f} | {o / t:.2f} |", flush=True)
    bench.summarize(host_overhead=results)


def sweep() -> None:
    """Tuning variants (config.layer_norm_tuning over the constants of jitops/ops/layer_norm_plan.py and
    layer_norm_run.py) at a few shapes; prints ours vs torch."""
    bench = Bench("layer_norm", baseline=BASELINE, variant="sweep", min_ms=30, reps=30)
    shapes = [(16384, 8192, "bf16"), (16384, 8192, "fp32"), (65536, 1024, "bf16"), (4096, 16384, "bf16"),
              (4096, 4097, "bf16")]
    variants = [dict(forward_tile_bytes=t, backward_tile_bytes=u, forward_blocks_per_sm=f)
                for t, u, f in ((128, 64, 16), (64, 64, 16), (128, 32, 16))]
    for values in variants:
        with jitops.config.scope(layer_norm_tuning=values):
            ln_plan.clear_buckets()  # the classes follow the scope's tile sizes
            print(f"--- {values}", flush=True)
            for rows, n, name in shapes:
                compare(bench, rows, n, name, timing="events")
    ln_plan.clear_buckets()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the headline shape only")
    parser.add_argument("--sweep", action="store_true", help="tuning variants instead of the benchmark set")
    parser.add_argument("--no-host", action="store_true", help="skip the host-overhead table")
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.sweep:
        sweep()
        return
    bench = Bench("layer_norm", baseline=BASELINE, variant="quick" if args.quick else None,
                  roofline=copy_bandwidth(), min_ms=40, reps=30)
    rows, n, name = HEADLINE
    compare(bench, rows, n, name, timing="events")
    if not args.quick:
        for name in DTYPES:
            for rows in ROWS:
                for n in HIDDEN:
                    compare(bench, rows, n, name)
    fwd, bwd = bench.rows[0], bench.rows[1]
    bench.summarize(headline=f"({HEADLINE[0]}, {HEADLINE[1]}) {HEADLINE[2]}: forward x{fwd.speedup:.2f} torch "
                        f"({fwd.ours_rate:.2f} vs {fwd.baseline_rate:.2f} TB/s; goal x1.4), backward "
                        f"x{bwd.speedup:.2f} ({bwd.ours_rate:.2f} vs {bwd.baseline_rate:.2f} TB/s; goal x1.8)",
               slower_than_torch=[f"{r.op} {r.shape} {r.dtype} x{r.speedup:.2f}" for r in bench.rows
                                  if r.speedup < 1.0])
    if not args.no_host:
        host_overhead(bench)
    bench.finish()


if __name__ == "__main__":
    main()
