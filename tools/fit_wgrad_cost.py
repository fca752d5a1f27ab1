"""Prints conv2d's fitted wgrad cost constants (WGRAD_TILE_US and the constants after it) and scores its plans.

    python tools/fit_wgrad_cost.py                       # the sweeps behind the constants now (tools/data/)
    python tools/fit_wgrad_cost.py A.json [B.json ...]   # other sweeps (benchmarks/out/conv2d-*.json)
    python tools/fit_wgrad_cost.py --score-split-us 2.25,4.5   # conv2d's plans at each WGRAD_SPLIT_US, scored
    python tools/fit_wgrad_cost.py --light               # the light kernel's (LIGHT_WGRAD_TILE_US and after)

Reads the rows of `bench_conv2d.py --operators wgrad --tiles ... --wgrad-splits ...` (and plain runs): every
timing of the weight-gradient kernel at a known tile and split count on a ResNet-50 layer or the reference
layer, except the stem (it goes through im2col); a cluster tile shares its tile's constants.  The model is
linear in its constants (the light kernel's has no us_per_gb term: it fitted at about zero, and it has no
clusters; it has a term for the reduction's serial depth, conv2d_plan.reduce_depth, in us_per_slice_depth):

    waves * (steps * step_us[tile] + wave_us[tile])              waves = ceil(work tiles / 132)
    + work tiles * steps * rows loaded * 64 * 2 B * us_per_gb    the operand tiles loaded from L2
    + [slices > 1] * (split_us + slices * M * N * 4 B * us_per_mb)   the reduction and its fp32 slices
    + (bytes of dy and x) * dram_us_per_gb                       the same for every plan of a layer: fitted so
                                                                 that the others are not biased by it

so a least-squares fit of the relative error is one weighted linear solve.  Prints the constants (in the form
conv2d.py writes them), the median and 90th-percentile errors, and the plans conv2d makes with its current
constants scored on the timings (a fit is judged by its plans, not its residual).
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

from jitops.ops import conv2d_costs as costs  # noqa: E402 - the constants being fitted
from jitops.ops import conv2d_plan as conv  # noqa: E402 - the cost models
from bench_conv2d import BATCH, REFERENCE  # noqa: E402

# The sweeps the constants in jitops/ops/conv2d_costs.py were fitted to (lent H100, 2026-11-22: the four wgrad tile
# sweeps, 1322 timings), in the order they ran: a layer's cuDNN time is taken from the first file that has it.
DATA = Path(__file__).resolve().parent / "data"
WGRAD_SWEEPS = [DATA / f"conv2d-wgrad-tiles-{name}.json" for name in ("plain", "wide-clusters", "taps-l2", "taps")]
# The light kernel's (lent H200, 2026-11-29, at 52cffe3: `bench_conv2d.py --quick --no-eager --operators wgrad
# --tiles 128x64,64x128,128x128,128x256,64x64,64x256 --wgrad-splits 1,2,3,4,7,16,33,66`).
LIGHT_WGRAD_SWEEPS = [DATA / "conv2d-wgrad-light-tiles.json"]

# Tiles with constants of their own; a cluster tile (e.g. 128x64c1x2) shares its tile's.
FIT_TILES = ("64x64", "64x192", "64x128", "128x64", "128x128", "128x256", "64x256")


def base(tile: str) -> str:
    tile_m, tile_n = conv.TILES[tile][:2]
    return f"{tile_m}x{tile_n}"


def layer(name: str) -> tuple[int, int, int, int]:
    """(C, K, filter width R = S, k-tiles of N*P*Q) for "ref" or "L<i>"."""
    c, k, size, kernel, stride, padding = REFERENCE if name == "ref" else conv.RESNET50[int(name[1:])]
    out = conv.output_size(size, kernel, stride, padding, 1)
    return c, k, kernel, math.ceil(BATCH * out * out / conv.TILE_K)


def layer_gemm(name: str) -> tuple[int, int, tuple[int, int], int, float]:
    """wgrad's GEMM (K output channels, C channels, the filter's (R, S), k-tiles) and its operands' bytes (dy
    and x) for "ref" or "L<i>"."""
    c, k, kernel, k_tiles = layer(name)
    _, _, size, kernel, stride, padding = REFERENCE if name == "ref" else conv.RESNET50[int(name[1:])]
    out = conv.output_size(size, kernel, stride, padding, 1)
    return k, c, (kernel, kernel), k_tiles, 2.0 * BATCH * (out * out * k + size * size * c)


def timings(paths, planned_only: bool, light: bool = False):
    """(layer, tile, slices, microseconds) of every usable row (planned_only: the tiles the plans choose from,
    conv2d.wgrad_candidates, for that layer; light: the light kernel's, which runs no cluster tiles)."""
    rows = []
    for path in paths:
        for row in json.loads(Path(path).read_text())["rows"]:
            extra = row.get("extra", {})
            if extra.get("operator") != "wgrad" or extra.get("layer") in (None, "L0"):
                continue
            tile, _, slices = extra["tile"].partition("/")
            c, _, kernel, _ = layer(extra["layer"])
            if tile in conv.TILES and base(tile) in FIT_TILES and \
                    (tile in conv.wgrad_candidates(c, (kernel, kernel), light) or not planned_only):
                rows.append((extra["layer"], tile, int(slices), row["ours_ms"] * 1e3))
    return rows


def features(tile: str, slices: int, k: int, c: int, filter_rs: tuple[int, int], k_tiles: int,
             operand_bytes: float, light: bool = False) -> dict[str, float]:
    t = conv.TILES[tile]
    m, n = k, c * filter_rs[0] * filter_rs[1]
    work = conv.wgrad_work_tiles(tile, k, c, filter_rs, slices)
    steps = math.ceil(k_tiles / slices)
    waves = math.ceil(work / conv.HOPPER_SMS)
    rows_loaded = t.m / t.cluster_n + t.n / t.cluster_m
    out = {f"step {base(tile)}": waves * steps, f"wave {base(tile)}": waves, "dram_us_per_gb": operand_bytes / 1e9}
    if not light:
        out["us_per_gb"] = work * steps * rows_loaded * conv.TILE_K * 2 / 1e9
    if slices > 1:
        out["split_us"] = 1.0
        out["us_per_mb"] = slices * m * n * 4 / 1e6
        if light:
            out["us_per_slice_depth"] = conv.reduce_depth(slices, k, c, filter_rs)
    return out


def relative_least_squares(design: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, list[float]]:
    """Constants minimising the relative error (each equation divided by its measurement); columns that no
    timing uses stay 0.  Returns them and the sorted relative errors."""
    used = design.any(axis=0)
    solution = np.zeros(design.shape[1])
    solution[used] = np.linalg.lstsq(design[:, used] / target[:, None], np.ones(len(target)), rcond=None)[0]
    return solution, sorted(abs(p - t) / t for p, t in zip(design @ solution, target))


def score_plans(paths, split_us: float, light: bool = False) -> tuple[float, int]:
    """ResNet-50's wgrad weighted by occurrence, cuDNN time / ours, with the plans conv2d makes (its constants,
    WGRAD_SPLIT_US = split_us) scored on the measured timings: for a plan whose split count was not timed,
    the nearest timed count of the same tile.  Returns the ratio (NaN where a planned tile was never timed on
    its layer: those are printed) and how many plans were not timed exactly."""
    from bench_conv2d import OCCURRENCES
    measured: dict[tuple[str, str, int], float] = {}
    cudnn: dict[str, float] = {}
    for path in paths:
        for row in json.loads(Path(path).read_text())["rows"]:
            extra = row.get("extra", {})
            if extra.get("operator") == "wgrad" and extra.get("layer", "").startswith("L"):
                tile, _, slices = extra["tile"].partition("/")
                key = (extra["layer"], tile, int(slices))
                measured[key] = min(measured.get(key, math.inf), row["ours_ms"] * 1e3)
                cudnn.setdefault(extra["layer"], row["baseline_ms"] * 1e3)
    import jitops
    name = "LIGHT_WGRAD_SPLIT_US" if light else "WGRAD_SPLIT_US"
    saved = getattr(costs, name)
    setattr(costs, name, split_us)
    ours = theirs = 0.0
    inexact = 0
    try:
        with jitops.config.scope(conv2d_sm90_kernel="light" if light else "cutlass"):
            for index, weight in enumerate(OCCURRENCES):
                c, k, size, kernel, stride, padding = conv.RESNET50[index]
                out = conv.output_size(size, kernel, stride, padding, 1)
                k_tiles = math.ceil(BATCH * out * out / conv.TILE_K)
                if conv._uses_im2col(c, kernel, kernel):
                    tile, slices, _ = conv.plan_wgrad(k, conv.round_up(c * kernel * kernel), (1, 1), k_tiles)
                else:
                    tile, slices, _ = conv.plan_wgrad(k, conv.round_up(c), (kernel, kernel), k_tiles)
                timed = [(abs(math.log(s / slices)), us) for (layer, t, s), us in measured.items()
                         if layer == f"L{index}" and t == tile]
                if not timed:
                    print(f"  L{index}: the plan's tile {tile} was not timed on this layer")
                    ours = math.nan
                    continue
                distance, us = min(timed)
                inexact += distance > 0
                ours += weight * us
                theirs += weight * cudnn[f"L{index}"]
    finally:
        setattr(costs, name, saved)
    return theirs / ours, inexact


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="*", help="sweep records (default: tools/data/conv2d-wgrad-tiles-*.json)")
    parser.add_argument("--score-split-us", default="",
                        help="comma-separated values of WGRAD_SPLIT_US: score conv2d's plans (its constants) with "
                             "each on the measured timings, instead of fitting")
    parser.add_argument("--all-kernels", action="store_true",
                        help="also the timings of tiles the plans do not choose from for that layer")
    parser.add_argument("--light", action="store_true",
                        help="the light kernel's constants (LIGHT_WGRAD_*; default data: tools/data/"
                             "conv2d-wgrad-light-tiles.json)")
    args = parser.parse_args()
    light = args.light
    args.json = args.json or (LIGHT_WGRAD_SWEEPS if light else WGRAD_SWEEPS)
    prefix = "LIGHT_" if light else ""
    split_us = costs.LIGHT_WGRAD_SPLIT_US if light else costs.WGRAD_SPLIT_US
    if args.score_split_us:
        for value in (float(v) for v in args.score_split_us.split(",")):
            ratio, inexact = score_plans(args.json, value, light)
            print(f"{prefix}WGRAD_SPLIT_US = {value}: ResNet-50 wgrad weighted, cuDNN time / ours {ratio:.3f} "
                  f"({inexact} plans scored at the nearest timed split count)")
        return 0
    rows = timings(args.json, not args.all_kernels, light)
    tiles = tuple(t for t in FIT_TILES if not light or t in costs.LIGHT_WGRAD_TILE_US)
    names = [f"{kind} {t}" for t in tiles for kind in ("step", "wave")] + \
        ["us_per_gb", "split_us", "us_per_mb", "us_per_slice_depth", "dram_us_per_gb"]
    design = np.zeros((len(rows), len(names)))
    target = np.array([us for *_, us in rows])
    for i, (layer, tile, slices, _) in enumerate(rows):
        for name, value in features(tile, slices, *layer_gemm(layer), light).items():
            design[i, names.index(name)] = value
    solution, errors = relative_least_squares(design, target)
    constants = dict(zip(names, solution))
    print(f"{len(rows)} timings; median error {statistics.median(errors):.1%}, "
          f"90th percentile {errors[int(0.9 * len(errors))]:.1%}")
    print(f"{prefix}WGRAD_TILE_US = {{" + ", ".join(
        f'"{t}": ({constants["step " + t]:.3f}, {constants["wave " + t]:.2f})' for t in tiles) + "}")
    if not light:
        print(f"WGRAD_US_PER_GB_LOADED = {constants['us_per_gb']:.1f}")
    print(f"{prefix}WGRAD_SPLIT_US = {constants['split_us']:.2f}\n"
          f"{prefix}WGRAD_US_PER_MB_SLICES = {constants['us_per_mb']:.3f}\n" +
          (f"LIGHT_WGRAD_US_PER_SLICE_DEPTH = {constants['us_per_slice_depth']:.3f}\n" if light else "") +
          f"(plan-independent: {constants['dram_us_per_gb']:.1f} us per GB of dy and x)")

    # A fit is judged by the plans it makes: conv2d's plans with its constants now (paste the printed ones in
    # first), scored on these timings.
    ratio, inexact = score_plans(args.json, split_us, light)
    print(f"conv2d's plans with its current constants: ResNet-50 wgrad weighted, cuDNN time / ours {ratio:.3f} "
          f"({inexact} plans scored at the nearest timed split count)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
