"""Prints conv2d's fitted fprop and dgrad cost constants (GEMM_TILE_US) and scores its plans on the same timings.

    python tools/fit_conv_gemm_cost.py            # the sweep behind the constants now (tools/data/)
    python benchmarks/bench_conv2d.py --quick --no-eager --operators fprop,dgrad --tiles 128x64,...   # on a GPU
    python tools/fit_conv_gemm_cost.py benchmarks/out/conv2d-tiles-fprop-dgrad.json                  # a new one

The model, per operator and tile: waves * (k-steps * step_us + wave_us), waves = ceil(work tiles / 132), over
the layer's implicit GEMM (fprop: M = N*P*Q, N = K, k-steps = ceil(C/64)*R*S; dgrad per phase: M = N*H*W/s^2,
N = C, k-steps = ceil(K/64)*ceil(R/s)*ceil(S/s)).  A least-squares fit of the relative error, one weighted
linear solve per operator, on every timing of an unsplit tile (dgrad: its unit-stride layers; a strided
dgrad runs s*s phases).  Prints the constants as conv2d.py writes them, the median error, and ResNet-50's
weighted ratio against cuDNN for the sweep's own plan rows, for conv2d's current plans (its constants), and
for the best tile per layer.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from jitops.ops import conv2d_costs as costs  # noqa: E402,F401 - the constants being fitted (tests read them here)
from jitops.ops import conv2d_plan as conv  # noqa: E402 - the cost models
from bench_conv2d import BATCH, OCCURRENCES, REFERENCE  # noqa: E402
from fit_wgrad_cost import relative_least_squares  # noqa: E402

# The sweep the constants in jitops/ops/conv2d_costs.py were fitted to (lent H100, 2026-11-22: each layer, each tile).
SWEEP = Path(__file__).resolve().parent / "data" / "conv2d-fprop-dgrad-tiles.json"


def layer_gemm(operator: str, name: str) -> tuple[int, int, int, int, bool]:
    """(M, N, k-steps, phases, unit stride) of a layer's fprop or dgrad as conv2d plans it."""
    c, k, size, kernel, stride, padding = REFERENCE if name == "ref" else conv.RESNET50[int(name[1:])]
    out = conv.output_size(size, kernel, stride, padding, 1)
    if operator == "fprop":
        if conv._uses_im2col(c, kernel, kernel):  # a 1x1 conv over the im2col matrix
            return BATCH * out * out, conv.round_up(k), math.ceil(conv.round_up(c * kernel * kernel) / 64), 1, True
        return BATCH * out * out, conv.round_up(k), math.ceil(conv.round_up(c) / 64) * kernel * kernel, 1, True
    phases = stride * stride if kernel > 1 else 1
    return (BATCH * math.ceil(size / stride) ** 2, conv.round_up(c),
            math.ceil(conv.round_up(k) / 64) * math.ceil(kernel / stride) ** 2, phases, stride == 1)


def features(operator: str, name: str, tile: str) -> dict[str, float]:
    m, n, k_steps, phases, _ = layer_gemm(operator, name)
    waves = math.ceil(conv._work_tiles(tile, m, n, 1) / conv.HOPPER_SMS)
    return {f"step {tile}": phases * waves * k_steps, f"wave {tile}": phases * waves}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="?", default=str(SWEEP), help="a sweep record (default: tools/data/)")
    args = parser.parse_args()
    rows = json.loads(Path(args.json).read_text())["rows"]
    for operator in ("fprop", "dgrad"):
        timed: dict[tuple[str, str], float] = {}
        plan_rows: dict[str, float] = {}
        cudnn: dict[str, float] = {}
        for row in rows:
            extra = row.get("extra", {})
            if extra.get("operator") != operator:
                continue
            layer, us = extra["layer"], row["ours_ms"] * 1e3
            cudnn[layer] = row["baseline_ms"] * 1e3
            if row["op"] == f"{operator} gpu":
                plan_rows[layer] = us
            else:
                timed[(layer, extra["tile"].split("/")[0])] = us
        # the stem's dgrad goes through its columns (an fprop plan): not a dgrad timing
        fit = [(layer, tile, us) for (layer, tile), us in timed.items()
               if not (operator == "dgrad" and (layer == "L0" or not layer_gemm(operator, layer)[4]))]
        names = sorted({name for layer, tile, _ in fit for name in features(operator, layer, tile)})
        design = np.array([[features(operator, layer, tile).get(name, 0.0) for name in names]
                           for layer, tile, _ in fit])
        target = np.array([us for *_, us in fit])
        solution, errors = relative_least_squares(design, target)
        constants = dict(zip(names, solution))
        tiles = sorted({tile for _, tile in timed})
        print(f"{operator}: {len(fit)} timings, median error {statistics.median(errors):.1%}")
        print(f'    "{operator}": {{' + ", ".join(
            f'"{t}": ({constants[f"step {t}"]:.3f}, {constants[f"wave {t}"]:.2f})' for t in tiles) + "},")

        # ResNet-50 weighted by occurrence: the sweep's plan rows, conv2d's plans now, the best tile per layer.
        totals = {"the sweep's plan rows": 0.0, "conv2d's plans now": 0.0, "best tile per layer": 0.0}
        reference = 0.0
        for index, weight in enumerate(OCCURRENCES):
            layer = f"L{index}"
            options = {tile: us for (name, tile), us in timed.items() if name == layer}
            reference += weight * cudnn[layer]
            totals["the sweep's plan rows"] += weight * plan_rows[layer]
            if operator == "dgrad" and layer == "L0":  # the stem's dgrad: through its columns, an fprop plan
                totals["conv2d's plans now"] += weight * plan_rows[layer]
                totals["best tile per layer"] += weight * plan_rows[layer]
                continue
            m, n, k_steps, _, _ = layer_gemm(operator, layer)
            tile, _ = conv.plan_gemm(operator, m, n, k_steps)
            totals["conv2d's plans now"] += weight * options.get(tile, math.nan)
            totals["best tile per layer"] += weight * min(options.values())
        print("    ResNet-50 weighted, cuDNN time / ours: " +
              ", ".join(f"{name} {reference / total:.3f}" for name, total in totals.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
