"""jitops.conv2d's fitted cost constants: the tables its plans (jitops/ops/conv2d_plan.py) price tiles and splits
with.  Each is printed by its fitter from the sweeps kept in tools/data/ (tools/fit_conv_gemm_cost.py,
tools/fit_wgrad_cost.py); tests/test_benchmark_results.py checks that the fitters still reproduce them.
"""
from __future__ import annotations

# fprop/dgrad: microseconds per 64-deep k-step of one work tile and per wave of work tiles, per tile (a cluster
# tile has its own: its CTAs share the loads of the operand they have in common), fitted by least squares
# (relative error) by tools/fit_conv_gemm_cost.py to every ResNet-50 layer and the reference layer at each
# tile, one slice (H100, tools/data/conv2d-fprop-dgrad-tiles.json; dgrad on its unit-stride
# layers): median error 8.5% (fprop), 7.9% (dgrad).  It replaced relative tile efficiencies set
# by hand, whose plans measured 0.852x of cuDNN's fprop in that run against 0.894x for this model's (the best
# tile per layer: 0.899x).  The 128x128-per-two-SMs cluster (128x64c1x2, the activation tile multicast) is what
# the 7x7 layers lacked: L18 and L20 28.5 -> 21.2 us.
GEMM_TILE_US = {
    "fprop": {"128x64": (0.357, 1.26), "128x128": (0.394, 2.65), "128x256": (0.672, 4.45),
              "128x64c1x2": (0.266, 1.40), "128x64c2x1": (0.355, 1.26)},
    "dgrad": {"128x64": (0.364, 0.84), "128x128": (0.403, 2.15), "128x256": (0.658, 3.59),
              "128x64c1x2": (0.270, 0.99), "128x64c2x1": (0.358, 0.87)}}

# wgrad: microseconds per 64-deep k-step of one work tile and per wave of work tiles (pipeline fill, epilogue;
# a cluster tile costs as its tile, less the operand bytes it multicasts; work tiles counted as the kernel's
# scheduler does, wgrad_work_tiles), fitted by least squares (relative error) by tools/fit_wgrad_cost.py
# to 1322 timings of ResNet-50's wgrad layers at batch 32 and the 3x3 reference layer, every candidate tile at
# 1 to 131 slices (H100, tools/data/conv2d-wgrad-tiles-*.json): median error 6.8%, 90th
# percentile 19%.
# The fit also has a term for the bytes of dy and x (170 us per GB from DRAM), the same for every plan of a
# layer and so left out here.  Why the small tiles win on most layers: a wave of 128x64 costs 0.9 us against
# 128x256's 3.3, and more work tiles fill the 132 SMs with fewer fp32 slices.
WGRAD_TILE_US = {"64x64": (0.139, 1.46), "64x192": (0.258, 7.42), "64x128": (0.145, 3.34), "128x64": (0.144, 0.93),
                 "128x128": (0.244, 1.68), "128x256": (0.491, 3.28), "64x256": (0.252, 6.42)}
WGRAD_US_PER_GB_LOADED = 36.3    # operand tiles loaded from L2 into the SMs (about 28 TB/s across them)

# Two or more slices: the reduction kernel and the split path.  The fit says 2.3 us; with it the plans split
# the 14x14 and 28x28 3x3 layers (128x128 in 3 slices), 6-8 us slower than one slice, because a second kernel
# in the stream and the fp32 slices cost more there than the model's terms.  4.5 us is where the plans of the
# measured layers are best (`fit_wgrad_cost.py --score-split-us` on the same timings: ResNet-50's weighted wgrad
# against cuDNN 0.941 at 2.3-3 us, 0.973 at 4.5, 0.966 at 5.5-7), the one constant set by the plans rather
# than by the fit.
WGRAD_SPLIT_US = 4.5
WGRAD_US_PER_MB_SLICES = 0.447   # the fp32 slices written by the kernel and read by the reduction

# The light kernel's wgrad (the default, jitops/light_conv.py) has constants of its own, fitted the same way by
# `tools/fit_wgrad_cost.py --light` to 1083 timings of its one-tap tiles at 1 to 66 slices on ResNet-50's wgrad
# layers and the reference layer (H200, tools/data/conv2d-wgrad-light-tiles.json): median error 3.7%.  CUTLASS's
# constants planned it badly where its tiles differ from CUTLASS's: its 128 x 64 k-step costs 0.71 of a 128 x 128
# one against CUTLASS's 0.59, so L12 and L14 took 128 x 64 in one slice (24.0 us) where 128 x 128 in three runs
# 19.9; and the 1x2 cluster tiles' multicast discount was fiction, since the light wgrad runs every tile as one CTA
# (light_cluster).  Its fit has no L2-loads term (it came out at -0.5 us per GB: the k-step constants carry it).
LIGHT_WGRAD_TILE_US = {"64x64": (0.166, 0.92), "64x128": (0.221, 1.41), "128x64": (0.209, 1.09),
                       "128x128": (0.293, 1.93), "128x256": (0.577, 3.02), "64x256": (0.320, 2.33)}
LIGHT_WGRAD_SPLIT_US = 4.13
LIGHT_WGRAD_US_PER_MB_SLICES = 0.361
# The reduction's serial depth (conv2d_plan.reduce_depth): each of its threads sums one output's slices, so where dw
# has too few elements to give every SM a block, the slices add latency that no bandwidth term sees.  Without it the
# fit planned L5 (128 x 256 outputs) at 128 x 128 in 66 slices: 31.5 us, against 27.4 for 128 x 64 in 33.
LIGHT_WGRAD_US_PER_SLICE_DEPTH = 0.047
