"""A/B of the layer_norm backward's few-rows path (a diagnostic, not a benchmark).

    python benchmarks/probe_layer_norm_few_rows.py

At 64 rows, for every hidden size and dtype of the benchmark set: jitops.layer_norm_backward with dweight/dbias
summed column-wise by layer_norm_param_grads (FEW_ROWS = 64, params 3) against the per-block partial sums plus
their reduction (FEW_ROWS = 1, the path before it), and torch's native_layer_norm_backward, each timed as CUDA
graph replays on rotating inputs like bench_layer_norm.py, the three interleaved over several rounds (medians).
"""
from __future__ import annotations

import importlib
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jitops  # noqa: E402
from bench_layer_norm import DTYPES, inputs  # noqa: E402
from harness import rotate, time_cuda_graph  # noqa: E402

ln = importlib.import_module("jitops.ops.layer_norm")
ROWS, ROUNDS = 64, 5


def main() -> None:
    print(f"{'n':>6s} {'dtype':5s} {'columns us':>10s} {'partials us':>11s} {'torch us':>9s} {'cols/torch':>10s} "
          f"{'parts/torch':>11s}")
    for name in ("fp32", "fp16", "bf16"):
        dtype = DTYPES[name]
        for n in (128, 1024, 4097, 8192, 16384):
            size = torch.empty((), dtype=dtype).element_size()
            sets = rotate(lambda: inputs(ROWS, n, dtype), 3 * ROWS * n * size)

            def ours(few: int):
                def call():
                    x, w, b, dy, stats, _, _ = sets()
                    return jitops.layer_norm_backward(dy, x, stats, w, [n], True, True, True)
                ln.FEW_ROWS = few
                call()  # loads the class's kernels outside the graph
                return call

            def theirs():
                x, w, b, dy, _, mean, rstd = sets()
                return torch.ops.aten.native_layer_norm_backward(dy, x, [n], mean, rstd, w, b, [True, True, True])

            times: dict[str, list[float]] = {"columns": [], "partials": [], "torch": []}
            for _ in range(ROUNDS):
                times["columns"].append(time_cuda_graph(ours(64)) * 1e3)
                times["partials"].append(time_cuda_graph(ours(1)) * 1e3)
                times["torch"].append(time_cuda_graph(theirs) * 1e3)
            ln.FEW_ROWS = 64
            c, p, t = (statistics.median(times[k]) for k in ("columns", "partials", "torch"))
            print(f"{n:6d} {name:5s} {c:10.2f} {p:11.2f} {t:9.2f} {t / c:10.2f} {t / p:11.2f}", flush=True)


if __name__ == "__main__":
    main()
