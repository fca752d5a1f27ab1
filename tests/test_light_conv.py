"""jitops.conv2d's light sm_90a kernels (jitops/light_conv.py: the light GEMM kernel with TMA im2col loads).

On the CPU: the kernels compile under NVRTC for sm_90a with wgmma, im2col loads and no spills; the implicit
GEMM's geometry (bounding boxes, output grids) agrees with the op's own output sizes; Params and descriptors are
packed as the kernel reads them (a strided dgrad's phases: through a transcription of the kernel's loops); the
setting routes fprop and unit-stride dgrad to them and leaves the rest to CUTLASS.  On a GPU (marked):
jitops.conv2d with the setting on against torch's conv2d in fp32, forward and dx and dw, over the op's test
geometries and ResNet-50's layer kinds.
"""
from __future__ import annotations

import contextlib
import ctypes
import re
import struct
from types import SimpleNamespace

import pytest
import torch

import jitops
from jitops import light_conv as LC
from jitops import light_gemm as L
from jitops import shapes
from jitops.cutlass_host import SWIZZLE_128B, TMA_FLOAT32, TMA_UINT16, Im2colArgs, TmaArgs
from jitops.ops import conv2d as conv_module
from jitops.ops.conv2d_plan import ConvClass, light_cluster, output_size
from jitops.ops import conv2d_plan as plan
from jitops.specs import Target

from fakes import FakeTmaDriver
from test_light_gemm import compile_with_ptx

SM90A = Target.parse("sm_90a")
BF16, FP16 = torch.bfloat16, torch.float16


def conv_class(kernel=(3, 3), stride=(1, 1), padding=(1, 1), dilation=(1, 1), tile="128x128", splits=1,
               dtype=BF16, cluster=1) -> ConvClass:
    return ConvClass(dtype, kernel, stride, padding, dilation, True, tile, splits, cluster=cluster)


# ---- compiling ----------------------------------------------------------------------------------------------------
BUILDS = [  # (operator, class tile, fp32 out (wgrad: its slices; else the direct wgrad, 16-bit dw), dtype)
    ("fprop", "128x64", False, BF16), ("fprop", "128x128", False, FP16), ("fprop", "128x256", False, BF16),
    ("fprop", "128x128", True, BF16), ("dgrad", "128x64c1x2", False, BF16), ("dgrad", "128x128", False, FP16),
    ("dgrad", "128x256", False, BF16), ("wgrad", "64x64", True, BF16), ("wgrad", "128x128", True, FP16),
    ("wgrad", "128x256", True, BF16), ("wgrad", "128x64", False, FP16), ("wgrad", "128x256", False, BF16),
    ("fprop", "128x64c1x2", False, FP16), ("wgrad", "128x64c1x2", True, BF16), ("wgrad", "64x128", False, FP16),
    ("wgrad", "64x256", True, BF16)]


@pytest.mark.parametrize("name,tile,fp32_out,dtype", BUILDS, ids=[f"{b[0]}-{b[1]}{'-fp32' if b[2] else ''}-"
                                                                  f"{str(b[3])[6:]}" for b in BUILDS])
def test_conv_kernels_compile_with_im2col_loads_and_no_spills(name, tile, fp32_out, dtype):
    # The 1 x 2 builds in clusters of two (a wgrad's only when asked: light_cluster plans none)
    cluster = 2 if "c1x2" in tile else 1
    cls = conv_class(tile=tile, dtype=dtype, cluster=cluster)
    wgrad = name == "wgrad"
    cubin, ptx, log = compile_with_ptx(LC.request(name, cls, fp32_out and not wgrad, direct=wgrad and not fp32_out,
                                                  cluster=cluster))
    tile_n = LC.tile_n_for(cls)
    ab = "bf16" if dtype == BF16 else "f16"
    assert f"wgmma.mma_async.sync.aligned.m64n{tile_n}k16.f32.{ab}.{ab}" in ptx
    transposes = {"fprop": ("0", "0"), "dgrad": ("0", "1"), "wgrad": ("1", "1")}[name]
    assert set(re.findall(r"p, 1, 1, (\d), (\d);", ptx)) == {transposes}
    assert "cp.async.bulk.tensor.4d.shared::cluster.global.im2col" in ptx
    # fprop, dgrad: the filter by tap (rank 3); wgrad: dy as a matrix (rank 2), dw or slices by a rank-4 store
    filter_loads = "cp.async.bulk.tensor.3d.shared::cluster.global" in ptx
    matrix_loads = "cp.async.bulk.tensor.2d.shared::cluster.global" in ptx
    assert (filter_loads, matrix_loads) == ((False, True) if wgrad else (True, False))
    assert ("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group" in ptx) == wgrad
    assert "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" in log, log
    assert "C7510" not in log, log
    # In a cluster, each CTA multicasts its half of A into both
    assert ("multicast::cluster" in ptx) == (cluster == 2) and ("barrier.cluster" in ptx) == (cluster == 2)
    info = L.LightInfo.from_cubin(cubin)
    assert info == L.expected_info(tile_n, not wgrad, name == "fprop", 4 if fp32_out else 2, False, LC.OPERATORS[name],
                                   cluster=cluster, tile_m=LC.tile_m_for(name, cls))
    # a wgrad's 64-row plan: one consumer warpgroup, which keeps the registers it is launched with
    assert (info.tile_m, info.threads) == ((64, 256) if wgrad and tile.startswith("64x") else (128, 384))
    assert ("setmaxnreg" in ptx) == (info.threads == 384)


# ResNet-50's layers at batch 32 (conv2d_plan.RESNET50; H200 against cluster 1): (operator, C, K, input, filter,
# stride, its cluster).  A pair of tiles pays with 18 or more k-steps (x1.10-1.29), not with 8 (fprop L10, dgrad
# L9), nor where N is one 64-wide tile (L1-L4: half of each pair empty), nor for a wgrad (x0.87-1.03).
CLUSTER_LAYERS = [("fprop", 512, 512, 14, 3, 2, 2), ("fprop", 512, 512, 7, 3, 1, 2), ("fprop", 2048, 512, 7, 1, 1, 2),
                  ("dgrad", 512, 512, 7, 3, 1, 2), ("dgrad", 512, 2048, 7, 1, 1, 2), ("fprop", 128, 128, 56, 3, 2, 2),
                  ("fprop", 128, 128, 28, 3, 1, 2), ("dgrad", 128, 128, 28, 3, 1, 2), ("dgrad", 128, 512, 28, 1, 1, 1),
                  ("fprop", 512, 128, 28, 1, 1, 1), ("dgrad", 128, 128, 56, 3, 2, 1), ("fprop", 64, 64, 56, 3, 1, 1),
                  ("dgrad", 64, 256, 56, 1, 1, 1), ("wgrad", 512, 2048, 7, 1, 1, 1), ("wgrad", 128, 512, 28, 1, 1, 1),
                  ("fprop", 256, 256, 56, 3, 1, 1)]


@pytest.mark.parametrize("name, c, k, size, r, stride, cluster", CLUSTER_LAYERS)
def test_the_plan_takes_clusters_where_the_pairs_fit_the_grid(name, c, k, size, r, stride, cluster):
    pad = r // 2
    out = (size + 2 * pad - r) // stride + 1
    x = torch.empty(32, c, size, size, dtype=BF16, device="meta").contiguous(memory_format=torch.channels_last)
    w = torch.empty(k, c, r, r, dtype=BF16, device="meta").contiguous(memory_format=torch.channels_last)
    dy = torch.empty(32, k, out, out, dtype=BF16, device="meta").contiguous(memory_format=torch.channels_last)
    geometry = ((stride, stride), (pad, pad), (1, 1))
    cls = {"fprop": lambda: jitops.find("conv2d").shape_class(x, w, None, *geometry),
           "dgrad": lambda: jitops.find("conv2d_input_grad").shape_class(dy, w, x.shape, *geometry),
           "wgrad": lambda: jitops.find("conv2d_weight_grad").shape_class(dy, x, w.shape, *geometry)}[name]()
    assert LC.cluster_for(name, cls) == cluster, cls
    assert (dict(LC.request(name, cls).params).get("LIGHT_CLUSTER") == "2") == (cluster == 2)


@pytest.mark.parametrize("operator, tile, splits, stride", [("wgrad", "128x64c1x2", 1, (1, 1)),
                                                            ("fprop", "128x128", 1, (1, 1)),
                                                            ("fprop", "128x64", 2, (1, 1)),
                                                            ("dgrad", "128x64c1x2", 1, (2, 2))])
def test_no_cluster_for_wgrad_wide_tiles_split_k_or_strided_dgrad(operator, tile, splits, stride):
    assert light_cluster("fprop", "128x64c1x2", 1, 1568, 512, 72) == 2  # the same GEMM where it pays
    assert light_cluster(operator, tile, splits, 1568, 512, 72, stride) == 1
    assert light_cluster("fprop", "128x64c1x2", 1, 1568, 512, 8) == 1  # few k-steps


def test_cluster_for_takes_the_class_cluster_for_fprop_and_unit_stride_dgrad_only():
    cls = conv_class(tile="128x64c1x2", cluster=2)
    assert [LC.cluster_for(name, cls) for name in ("fprop", "dgrad", "wgrad")] == [2, 2, 1]
    assert LC.cluster_for("dgrad", cls._replace(stride=(2, 2))) == 1


def test_a_strided_dgrad_phase_kernel_stores_rows_and_no_spills():
    cls = conv_class(stride=(2, 2), tile="128x128")
    cubin, ptx, log = compile_with_ptx(LC.request("dgrad", cls))
    assert "st.global.v4" in ptx and "cp.async.bulk.tensor.2d.global.shared::cta" not in ptx  # no TMA store
    assert "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" in log, log
    assert L.LightInfo.from_cubin(cubin) == L.expected_info(128, True, False, 2, False, 2, d_rows=True)


# ---- the implicit GEMM's geometry ---------------------------------------------------------------------------------
def problem(conv, n=2, h=9, w=11, c=64, k=128, r=3, s=3, pad=(1, 1, 1, 1), stride=(1, 1), dil=(1, 1)):
    return LC.ConvProblem(conv, n, h, w, c, k, r, s, *pad, *stride, *dil, 132)


def box_positions(lower: int, upper: int, size: int, stride: int) -> int:
    """How many start positions TMA's im2col traversal visits along one dimension (CUTLASS's formula)."""
    return (size + upper - lower - 1) // stride + 1


@pytest.mark.parametrize("h,r,stride,pad,pad_hi,dil", [(9, 3, 1, 1, 1, 1), (9, 3, 2, 1, 1, 1), (224, 7, 2, 3, 3, 1),
                                                        (13, 3, 1, 2, 2, 2), (8, 3, 2, 1, 0, 2), (14, 1, 2, 0, 0, 1)])
def test_fprop_box_walks_the_output_grid(h, r, stride, pad, pad_hi, dil):
    p = problem(1, h=h, w=h, r=r, s=r, pad=(pad, pad_hi, pad, pad_hi), stride=(stride, stride), dil=(dil, dil))
    g = LC.geometry(p)
    out = (h + pad + pad_hi - dil * (r - 1) - 1) // stride + 1
    assert g["out_h"] == g["out_w"] == out
    if pad == pad_hi:
        assert out == output_size(h, r, stride, pad, dil)
    assert box_positions(g["lower"][1], g["upper"][1], h, stride) == out
    # the last tap of the last output pixel reads within the padded input
    assert g["lower"][1] + (out - 1) * stride + (r - 1) * dil <= h - 1 + pad_hi


@pytest.mark.parametrize("h,r,pad,dil", [(9, 3, 1, 1), (9, 1, 0, 1), (13, 3, 2, 2), (10, 5, 2, 1), (10, 3, 0, 1)])
def test_dgrad_box_walks_dx_and_reads_dy_where_the_forward_wrote(h, r, pad, dil):
    p = problem(2, h=h, w=h, r=r, s=r, pad=(pad, pad, pad, pad), dil=(dil, dil))
    g = LC.geometry(p)
    dy = output_size(h, r, 1, pad, dil)
    assert g["a_dims"] == (p.k, dy, dy, p.n) and (g["out_h"], g["out_w"]) == (h, h)
    assert box_positions(g["lower"][1], g["upper"][1], dy, 1) == h
    # dx(i) reads dy(i + lower + r' * dil) at flipped tap r = R - 1 - r': the forward's p = i + pad - r * dil
    for i in range(h):
        for r_flipped in range(r):
            assert i + g["lower"][1] + r_flipped * dil == i + pad - (r - 1 - r_flipped) * dil


class Recorder:
    def __init__(self) -> None:
        self.calls: list = []

    def __call__(self, buffer, offset, args, address) -> None:
        self.calls.append((offset, args, address))


def test_params_and_descriptors_of_a_strided_fprop():
    p = problem(1, n=2, h=56, w=56, c=64, k=256, r=3, s=3, stride=(2, 2))
    info = L.expected_info(128, True, True, 2, False, 1)
    encode = Recorder()
    params, launch_grid = LC.pack_params(info, p, (0x1000, 0x2000, 0x3000, 0x4000), encode)
    assert len(params) == 512
    bias, m, n, k, activation, group = struct.unpack_from("<Qiiiii", params, 384)
    assert (bias, m, n, k, activation) == (0x4000, 2 * 28 * 28, 256, 9 * 64, 0)
    fields = struct.unpack_from("<11i", params, LC.CONV_FIELDS)
    assert fields == (1, 9, 3, 28, 28 * 28, -1, -1, 2, 2, 1, 1)
    (a_at, a, a_address), (b_at, b, b_address), (d_at, d, d_address) = encode.calls
    assert (a_at, b_at, d_at) == (0, 128, 256) and (a_address, b_address, d_address) == (0x1000, 0x2000, 0x3000)
    assert a == Im2colArgs(TMA_UINT16, (64, 56, 56, 2), (128, 56 * 128, 56 * 56 * 128), (-1, -1), (-1, -1), 64, 128,
                           (1, 2, 2, 1), SWIZZLE_128B)
    assert b == TmaArgs(TMA_UINT16, (64, 9, 256), (128, 9 * 128), (64, 1, 128), SWIZZLE_128B)
    assert d == L.output_tma(m, 256, 256, 64)
    assert launch_grid == (min(132, -(-m // 128) * 2), 1, 1)


@pytest.mark.parametrize("images, k, sms, fit, clusters", [(128, 512, 132, 0, 63), (128, 512, 114, 0, 54),
                                                           (128, 512, 132, 66, 66), (128, 512, 132, 70, 66),
                                                           (128, 512, 132, 60, 60), (32, 512, 132, 66, 52),
                                                           (32, 192, 132, 0, 26), (32, 64, 132, 66, 13)])
def test_a_cluster_plan_loads_half_of_a_and_launches_pairs(images, k, sms, fit, clusters):
    # ResNet-50's 512->K 14x14 3x3 stride 2 (fprop L18 for K = 512): 49 tile rows of 128 pixels a 7x7 output for
    # 128 images, 13 for 32; K / 64 columns of 128 x 64 tiles, in pairs (an odd count's last pair has one past N).
    # As many pairs as the driver says fit at once (`fit`; never more than half the SMs), or where it cannot say
    # by CUTLASS's rule (0: a GPC's 18 SMs in pairs, 126 CTAs on 132 SMs, 108 on 114), never more than there are.
    p = problem(1, n=images, h=14, w=14, c=512, k=k, r=3, s=3, stride=(2, 2))._replace(sm_count=sms)
    info = L.expected_info(64, True, True, 2, False, 1, cluster=2)
    encode = Recorder()
    _, launch_grid = LC.pack_params(info, p, (0x1000, 0x2000, 0x3000, 0x4000), encode, fit)
    (_, a, _), _, _ = encode.calls
    assert a.pixels == 64  # each CTA's half of a 128-pixel tile
    assert launch_grid == (2 * clusters, 1, 1)


@pytest.mark.parametrize("splits, clusters", [(1, 8), (4, 32), (33, 63)])
def test_a_cluster_wgrad_launches_pairs_of_each_split(splits, clusters):
    # A 512->256 1x1 wgrad at 7x7: M = 256 filters (2 tile rows), N = 512 channels (8 columns of 64, 4 pairs): 8
    # pairs a split, and never more clusters than fit (63 on 132 SMs).  dy's box stays 64 x 64 either way.
    p = LC.ConvProblem(3, 32, 7, 7, 512, 256, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 132, splits)
    info = L.expected_info(64, False, False, 4, False, 3, cluster=2)
    encode = Recorder()
    _, launch_grid = LC.pack_params(info, p, (0x1000, 0x2000, 0x3000, 0x4000), encode)
    (_, a, _), _, _ = encode.calls
    assert a.box == (64, 64)
    assert launch_grid == (2 * clusters, 1, 1)


@pytest.mark.parametrize("k, tile_m, splits, grid_x", [(64, 64, 14, 126), (64, 128, 14, 126), (128, 64, 14, 132),
                                                        (192, 64, 2, 54), (192, 128, 2, 36)])
def test_a_64_row_wgrad_counts_its_tiles_by_64_filters(k, tile_m, splits, grid_x):
    # ResNet-50's L2 wgrad (64->64 3x3 at 56x56, batch 32): N = 9 taps x 64 channels, 9 columns of 64.  64 filters
    # are one row of 64-row tiles as of 128-row ones, 128 filters two rows of 64; 192 filters three of 64 (54
    # units in 2 splits) against two of 128 (36).  The grid never exceeds the SMs (132).
    p = LC.ConvProblem(3, 32, 56, 56, 64, k, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 132, splits)
    info = L.expected_info(64, False, False, 4, False, 3, tile_m=tile_m)
    params, launch_grid = LC.pack_params(info, p, (0x1000, 0x2000, 0x3000, 0x4000), Recorder())
    assert launch_grid == (grid_x, 1, 1)
    *_, group_m = struct.unpack_from("<Qiiiii", params, L.FIELDS)
    assert group_m == min(L.GROUP_ROWS, -(-k // tile_m))


@pytest.mark.parametrize("tile, tile_m", [("64x64", 64), ("64x128", 64), ("64x256", 64), ("128x64", 128),
                                          ("128x64c1x2", 128), ("128x256", 128)])
def test_a_wgrad_takes_its_plans_rows_and_fprop_dgrad_take_128(tile, tile_m):
    cls = conv_class(tile=tile)
    assert LC.tile_m_for("wgrad", cls) == tile_m
    assert dict(LC.request("wgrad", cls).params).get("LIGHT_TILE_M", "128") == str(tile_m)
    assert LC.tile_m_for("fprop", cls) == LC.tile_m_for("dgrad", cls) == 128


def test_params_and_descriptors_of_a_dgrad():
    p = problem(2, n=4, h=14, w=14, c=256, k=72, r=3, s=3)
    info = L.expected_info(256, True, False, 2, False, 2)
    encode = Recorder()
    params, _ = LC.pack_params(info, p, (0x1000, 0x2000, 0x3000, 0), encode)
    _, m, n, k, _, _ = struct.unpack_from("<Qiiiii", params, 384)
    assert (m, n, k) == (4 * 14 * 14, 256, 9 * 2 * 64)  # 72 filters: two 64-channel k-blocks a tap
    assert struct.unpack_from("<11i", params, LC.CONV_FIELDS) == (2, 9, 3, 14, 196, -1, -1, 1, 1, 1, 1)
    a, b = encode.calls[0][1], encode.calls[1][1]
    assert a.dims == (72, 14, 14, 4) and a.lower == (-1, -1) and a.upper == (-1, -1)
    assert b == TmaArgs(TMA_UINT16, (256, 72, 9), (9 * 256 * 2, 256 * 2), (64, 64, 1), SWIZZLE_128B)


def test_params_and_descriptors_of_a_split_wgrad():
    # ResNet-50's 3x3 over 72 channels at 14x14, batch 4: 784 pixels = 13 k-blocks in 4 splits of 4 (the last
    # reads past N*P*Q); N = 9 taps x 128 padded channels, stored without the padding.
    p = problem(3, n=4, h=14, w=14, c=72, k=64, r=3, s=3)._replace(splits=4)
    info = L.expected_info(128, False, False, 4, False, 3)
    encode = Recorder()
    params, launch_grid = LC.pack_params(info, p, (0x1000, 0x2000, 0x3000, 0), encode)
    _, m, n, k, _, _ = struct.unpack_from("<Qiiiii", params, 384)
    assert (m, n, k) == (64, 9 * 128, 4 * 64)
    assert struct.unpack_from("<13i", params, LC.CONV_FIELDS) == (2, 9, 3, 14, 196, -1, -1, 1, 1, 1, 1, 4, 4)
    (_, a, _), (_, b, _), (_, d, _) = encode.calls
    assert a == TmaArgs(TMA_UINT16, (64, 784), (128,), (64, 64), SWIZZLE_128B)           # dy, MN-major
    assert b.dims == (72, 14, 14, 4) and b.pixels == 64 and b.channels == 64           # x, 64 pixels a box
    assert d == TmaArgs(TMA_FLOAT32, (72, 9, 64, 4), (72 * 4, 9 * 72 * 4, 64 * 9 * 72 * 4), (32, 1, 64, 1),
                        SWIZZLE_128B)  # [split][K][tap][C]: a 32-column store within one tap, clipped at C
    assert launch_grid == (1 * 9 * 4, 1, 1)  # one tile row, 9 tile columns, 4 splits


# ---- a strided dgrad's phases in one launch -------------------------------------------------------------------
def emulate_phased_dgrad(params: bytes, descriptors: dict, dy: torch.Tensor, krsc: torch.Tensor,
                         dx: torch.Tensor, ctas: int) -> None:
    """What the LIGHT_D_ROWS kernel computes from its packed Params, transcribed (the phase walk; each pixel's
    im2col reads of dy at the phase's taps, zero outside dy; the filter tap each pairs with; the store at the
    phase's strides from dx's address), in float64.  dy [N, P, Q, K] and krsc [K, R, S, C]; dx is the flat NHWC
    memory the stores write, NaN where nothing was written yet (each pixel must be written once); ctas: the
    launch's grid."""
    c_blocks = struct.unpack_from("<i", params, LC.CONV_FIELDS)[0]
    d_sn, d_sh, d_sw = struct.unpack_from("<3i", params, LC.CONV_FIELDS + 52)
    phases = struct.unpack_from("<i", params, LC.PHASES_FIELD)[0]
    n, dy_h, dy_w, k = dy.shape
    s_total, c = krsc.shape[2], krsc.shape[3]
    assert c_blocks == -(-k // 64) and 1 <= phases <= LC.MAX_PHASES
    for i in range(phases):
        at = LC.PHASE_ENTRIES + i * LC.PHASE_BYTES
        m, out_w, out_hw, corner_w, corner_h, taps, filter_s, dil_w, dil_h, last, step_h, step_w, d_offset, idle_m = \
            struct.unpack_from("<14i", params, at + 128)
        assert 0 <= idle_m <= m and (taps == 0 or idle_m == 0)  # only zero phases have the idle warps' pixels
        a = descriptors[at]
        # the descriptor is dy's, and its bounding box walks exactly the phase's pixel grid
        assert a.dims == (k, dy_w, dy_h, n) and (a.lower[0], a.lower[1]) == (corner_w, corner_h)
        assert box_positions(a.lower[0], a.upper[0], dy_w, 1) == out_w
        assert box_positions(a.lower[1], a.upper[1], dy_h, 1) * out_w == out_hw and m % out_hw == 0
        # the producer warpgroup's three idle warps of every CTA on the first idle_m pixels, then the consumers'
        # 128-row tiles from row idle_m (every pixel of a phase with taps)
        idle = [pixel for cta in range(ctas) for warp in range(3) for pixel in range(3 * cta + warp, idle_m, 3 * ctas)]
        tiles = [idle_m + 128 * tile + row for tile in range(-(-(m - idle_m) // 128)) for row in range(128)]
        for pixel in idle + [pixel for pixel in tiles if pixel < m]:
            image, oh, ow = pixel // out_hw, pixel % out_hw // out_w, pixel % out_w
            value = torch.zeros(c, dtype=torch.float64)
            for t in range(taps):
                r, s = divmod(t, filter_s)
                h_in, w_in = corner_h + oh + r * dil_h, corner_w + ow + s * dil_w
                if 0 <= h_in < dy_h and 0 <= w_in < dy_w:
                    tap = last - r * step_h - s * step_w
                    value += dy[image, h_in, w_in] @ krsc[:, tap // s_total, tap % s_total]
            at_dx = d_offset + image * d_sn + oh * d_sh + ow * d_sw
            assert dx[at_dx:at_dx + c].isnan().all(), f"pixel {at_dx // c} written twice"
            dx[at_dx:at_dx + c] = value


STRIDED_DGRADS = [  # (n, h, w, c, k, r, s, stride (h, w), padding (h, w), dilation (h, w))
    (2, 8, 8, 16, 24, 3, 3, (2, 2), (1, 1), (1, 1)),    # ResNet-50's stride-2 3x3: four phases of 1, 2, 2, 4 taps
    (2, 9, 7, 8, 16, 1, 1, (2, 2), (0, 0), (1, 1)),     # the 1x1 downsample: one phase of one tap, three of zeros
    (1, 11, 10, 8, 8, 3, 2, (3, 2), (1, 0), (1, 1)),    # six phases: two launches
    (1, 10, 9, 16, 8, 3, 3, (2, 1), (2, 1), (2, 1)),    # dilation 2 along the strided dimension
    (1, 13, 12, 8, 8, 5, 4, (2, 3), (2, 1), (1, 2)),    # odd sizes, a rectangular filter, taps that miss rows
    (1, 7, 7, 8, 8, 7, 7, (2, 2), (3, 3), (1, 1)),      # the stem's geometry
]


def _zero_split(split: str):
    """idle_zero_pixels' answer (the model's), or none of the zeros the idle warps', or half of each zero phase."""
    def split_phases(p, phases):
        zero = [p.n * rows.count * cols.count if not (rows.taps and cols.taps) else 0 for rows, cols in phases]
        return [0] * len(phases) if split == "none" else [pixels // 2 for pixels in zero]
    return split_phases


@pytest.mark.parametrize("split", ["model", "none", "half"])
@pytest.mark.parametrize("case", STRIDED_DGRADS, ids=lambda c: "-".join(map(str, c[:7])) + f"-s{c[7]}-p{c[8]}-d{c[9]}")
def test_strided_dgrad_phases_packed_for_one_launch_reproduce_torch(case, split, monkeypatch):
    """The phases every launch packs, read as the kernel reads them (emulate_phased_dgrad), give torch's input
    gradient, every pixel of dx written exactly once (zeros included: dx is not cleared first), however the zero
    phases' pixels are split between the idle warps and the consumers' tiles."""
    if split != "model":
        monkeypatch.setattr(LC, "idle_zero_pixels", _zero_split(split))
    n, h, w, c, k, r, s, stride, padding, dilation = case
    p = LC.ConvProblem(2, n, h, w, c, k, r, s, padding[0], padding[0], padding[1], padding[1], *stride, *dilation,
                       132)
    out_h, out_w = (output_size(size, taps, st, pad, dil) for size, taps, st, pad, dil in
                    zip((h, w), (r, s), stride, padding, dilation))
    torch.manual_seed(0)
    dy = torch.randn(n, out_h, out_w, k, dtype=torch.float64)
    krsc = torch.randn(k, r, s, c, dtype=torch.float64)
    info = L.expected_info(128, True, False, 2, False, 2, d_rows=True)
    dx = torch.full((n * h * w * c,), float("nan"), dtype=torch.float64)
    phases = LC.dgrad_phases(p)
    assert len(phases) == stride[0] * stride[1]
    taps = [len(rows.taps) * len(cols.taps) for rows, cols in phases]
    assert taps == sorted(taps, reverse=True)  # the heaviest first: the last wave is of the cheapest tiles
    for first in range(0, len(phases), LC.MAX_PHASES):
        encode = Recorder()
        params, launch_grid = LC.pack_phases(info, p, (0x1000, 0x2000, 0x3000, 0x3000), encode, (h * w * c, w * c, c),
                                             phases[first:first + LC.MAX_PHASES])
        assert len(params) == info.params_size == 512 + LC.MAX_PHASES * LC.PHASE_BYTES
        descriptors = {offset: args for offset, args, _ in encode.calls}
        assert descriptors[info.tma_b] == LC.filter_tma(p, 128)  # the whole filter: no copy of a phase's taps
        assert descriptors[info.tma_d] == L.output_tma(n * h * w, c, c, info.store_cols)  # all of dx, not a phase
        assert {address for offset, _, address in encode.calls if offset != info.tma_b and offset != info.tma_d} \
            == {0x1000}
        assert struct.unpack_from("<Q", params, L.FIELDS)[0] == 0x3000  # dx's address, where the rows go
        emulate_phased_dgrad(bytes(params), descriptors, dy, krsc, dx, launch_grid[0])
        launched = phases[first:first + LC.MAX_PHASES]
        idle = LC.idle_zero_pixels(p, launched)
        units = sum(-(-(n * rows.count * cols.count - i) // 128) for (rows, cols), i in zip(launched, idle))
        assert launch_grid == (132 if any(idle) else min(132, units), 1, 1)
    assert not dx.isnan().any(), "pixels no phase wrote"
    want = torch.nn.grad.conv2d_input((n, c, h, w), krsc.permute(0, 3, 1, 2), dy.permute(0, 3, 1, 2), stride=stride,
                                      padding=padding, dilation=dilation)
    torch.testing.assert_close(dx.view(n, h, w, c).permute(0, 3, 1, 2), want)


@pytest.mark.parametrize("layer, c, k, size, idle", [
    ("L7", 256, 512, 56, (0, 25088, 14494, 0)),    # 38.5 MB of zeros: half of them the consumers' after the tiles
    ("L13", 512, 1024, 28, (0, 6272, 6272, 702)),
    ("L19", 1024, 2048, 14, (0, 1568, 1568, 1568)),  # all the idle warps': they finish within the GEMM tiles
])
def test_the_idle_warps_take_the_zeros_they_store_while_the_tiles_run(layer, c, k, size, idle):
    """ResNet-50's 1x1 stride-2 dgrads (batch 32): one phase of one tap, three of zeros, split between the idle
    warps and the consumers by the rate model; a 3x3 one has no zero phase."""
    p = LC.ConvProblem(2, 32, size, size, c, k, 1, 1, 0, 0, 0, 0, 2, 2, 1, 1, 132)
    assert tuple(LC.idle_zero_pixels(p, LC.dgrad_phases(p))) == idle
    three = p._replace(r=3, s=3, pad_h=1, pad_h_hi=1, pad_w=1, pad_w_hi=1)
    assert LC.idle_zero_pixels(three, LC.dgrad_phases(three)) == [0, 0, 0, 0]


def test_strided_dgrad_phases_cover_every_row_once():
    for size, out_size, kernel, stride, padding, dilation in [(56, 28, 3, 2, 1, 1), (9, 5, 1, 2, 0, 1),
                                                              (11, 4, 3, 3, 1, 1), (10, 5, 3, 2, 2, 2)]:
        phases = shapes.dgrad_residues(size, out_size, kernel, stride, padding, dilation)
        rows = sorted(row for phase in phases for row in range(phase.start, size, stride)[:phase.count])
        assert rows == list(range(size)) and all(phase.count == len(range(phase.start, size, stride))
                                                 for phase in phases)


def test_a_direct_wgrad_stores_into_dw():
    # One slice written in the inputs' type into dw's KRSC memory: 64 columns (one padded tap block) a store.
    p = problem(3, n=4, h=14, w=14, c=72, k=64, r=3, s=3)
    info = L.expected_info(256, False, False, 2, False, 3)
    encode = Recorder()
    params, launch_grid = LC.pack_params(info, p, (0x1000, 0x2000, 0x3000, 0), encode)
    assert struct.unpack_from("<2i", params, LC.CONV_FIELDS + 44) == (1, 13)  # one split of all 13 k-blocks
    assert encode.calls[2][1] == TmaArgs(TMA_UINT16, (72, 9, 64, 1), (72 * 2, 9 * 72 * 2, 64 * 9 * 72 * 2),
                                         (64, 1, 64, 1), SWIZZLE_128B)
    assert launch_grid == (5, 1, 1)  # 9 taps x 128 columns in 256-column tiles


# ---- the route ----------------------------------------------------------------------------------------------------
def test_unsupported_operators_and_plans():
    assert LC.unsupported("fprop", conv_class(stride=(2, 2))) is None
    assert LC.unsupported("fprop", conv_class(), fp32_out=True) is None
    assert LC.unsupported("dgrad", conv_class()) is None
    assert LC.unsupported("wgrad", conv_class(tile="64x64", splits=8)) is None
    assert LC.unsupported("wgrad", conv_class(tile="128x64", splits=1)) is None
    assert "taps" in LC.unsupported("wgrad", conv_class(tile="64x192t3"))
    assert "operator" in LC.unsupported("conv3d", conv_class())
    assert LC.unsupported("dgrad", conv_class(stride=(2, 1))) is None  # its phases, stored by rows
    assert "split" in LC.unsupported("fprop", conv_class(splits=2))
    assert "corners" in LC.unsupported("fprop", conv_class(kernel=(3, 3), dilation=(200, 1)))
    assert "corners" in LC.unsupported("fprop", conv_class(padding=(130, 0)))
    assert LC.unsupported("fprop", conv_class(dtype=torch.float32)) is not None


def test_the_setting_routes_fprop_and_unit_stride_dgrad():
    unit, strided = conv_class(), conv_class(stride=(2, 2))
    with jitops.config.scope(conv2d_sm90_kernel="cutlass"):
        cutlass_fprop = conv_module._request("fprop", unit, SM90A)
    assert "conv2d_sm90.cu" in str(cutlass_fprop["fprop"].source.name)
    assert conv_module._request("fprop", unit, SM90A) == {"fprop": LC.request("fprop", unit)}  # the default
    with jitops.config.scope(conv2d_sm90_kernel="light"):
        assert conv_module._request("fprop", unit, SM90A) == {"fprop": LC.request("fprop", unit)}
        assert conv_module._request("fprop", strided, SM90A) == {"fprop": LC.request("fprop", strided)}
        assert conv_module._request("dgrad", unit, SM90A) == {"dgrad": LC.request("dgrad", unit)}
        split = conv_class(splits=16)
        assert conv_module._request("wgrad", split, SM90A) == {"wgrad": LC.request("wgrad", split)}
        assert conv_module._request("wgrad", unit, SM90A) == {"wgrad": LC.request("wgrad", unit)}  # one fp32 slice
        direct = unit._replace(direct=True)  # aligned channels: dw written by the kernel
        assert conv_module._request("wgrad", direct, SM90A) == {"wgrad_direct": LC.request("wgrad", direct,
                                                                                           direct=True)}
        # a strided dgrad's phases: the kernel that stores dx by rows
        rows = conv_module._request("dgrad", strided, SM90A)["dgrad"]
        assert dict(rows.defines)["LIGHT_D_ROWS"] == "1"
        assert "LIGHT_D_ROWS" not in dict(LC.request("dgrad", unit).defines)
        # wgrad tiles over several taps stay on CUTLASS's kernels (the light setting's plans have none)
        spanning = conv_class(tile="64x192t3")._replace(flat=True)
        assert "conv2d_sm90.cu" in str(conv_module._request("wgrad", spanning, SM90A)["wgrad"].source.name)
        assert conv_module._request("fprop", unit, Target.parse("sm_80")) == {}


def test_the_light_setting_plans_wgrad_tiles_of_one_tap():
    # ResNet-50's 3x3 over 64 channels at 56x56 (batch 32): CUTLASS's plan spans 3 taps a tile
    with jitops.config.scope(conv2d_sm90_kernel="cutlass"):
        assert plan.plan_wgrad(64, 64, (3, 3), 1568)[0] == "64x192t3"
    with jitops.config.scope(conv2d_sm90_kernel="light"):
        tile, splits, _ = plan.plan_wgrad(64, 64, (3, 3), 1568)
    assert plan.TILES[tile].taps == 1 and LC.unsupported("wgrad", conv_class(tile=tile, splits=splits)) is None


def test_the_light_setting_plans_wgrad_with_its_own_costs():
    # ResNet-50's L12 and L14 (256 filters over 256 channels, 3x3, 98 k-steps): CUTLASS's constants plan 128 x 64 in
    # one slice, which the light kernel ran in 24.0 us; the light kernel's own plan 128 x 128 in three ran 19.9
    # (H200, tools/data/conv2d-wgrad-light-tiles.json)
    with jitops.config.scope(conv2d_sm90_kernel="cutlass"):
        assert plan.plan_wgrad(256, 256, (3, 3), 98) == ("128x64", 1, True)
    with jitops.config.scope(conv2d_sm90_kernel="light"):
        assert plan.plan_wgrad(256, 256, (3, 3), 98) == ("128x128", 3, True)
        # no cluster tiles: the light wgrad runs every tile as one CTA, so a 1x2 cluster's multicast discount
        # would price a kernel that does not run
        for k, c, k_tiles in ((2048, 512, 25), (1024, 256, 98), (512, 1024, 98)):
            tile, splits, _ = plan.plan_wgrad(k, c, (1, 1), k_tiles)
            assert plan.TILES[tile].cluster_m * plan.TILES[tile].cluster_n == 1, (k, c, tile)
        # L5 (128 x 256 outputs, 1568 k-steps): the reduction's serial depth keeps it from 66 slices of 128 x 128
        # (31.5 us; 128 x 64 in 33: 27.4)
        assert plan.plan_wgrad(128, 256, (1, 1), 1568) == ("128x64", 33, True)
    assert plan.reduce_depth(66, 128, 256, (1, 1)) == 66 and plan.reduce_depth(4, 1024, 256, (1, 1)) < 1
    assert not any(plan.TILES[t].cluster_m * plan.TILES[t].cluster_n > 1
                   for t in plan.wgrad_candidates(512, (1, 1), light=True))
    assert "128x64c1x2" in plan.wgrad_candidates(512, (1, 1))


def test_bad_setting_names_the_variable(monkeypatch):
    monkeypatch.setenv("JITOPS_CONV2D_SM90_KERNEL", "fast")
    with pytest.raises(jitops.errors.ConfigError, match="JITOPS_CONV2D_SM90_KERNEL"):
        jitops.config.conv2d_sm90_kernel


# ---- the host object with a stand-in driver -----------------------------------------------------------------------
class FakeDriver(FakeTmaDriver):
    def __init__(self, address_field):
        super().__init__(address_field, Recorder())

    def _find_address_field(self, args):
        return self.address_field

    params_size = 512

    def launch(self, function, grid, block, smem, stream, params_address):
        params = ctypes.cast(params_address, ctypes.POINTER(ctypes.c_void_p))[0]
        self.launches.append({"grid": grid, "stream": stream, "params": ctypes.string_at(params, self.params_size)})


class FakeFunction:
    handle, device_index = 0x1234, 0


class FakeTensor:
    def __init__(self, address):
        self.address = address

    def data_ptr(self):
        return self.address


def test_a_repeated_problem_is_packed_once_and_patched():
    driver = FakeDriver(16)
    host = LC.LightConv(FakeFunction(), L.expected_info(128, True, True, 2, False, 1), driver)
    args = (2, 9, 11, 64, 128, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 0, 132)
    t = [FakeTensor(a) for a in (0x10000, 0x20000, 0x30000, 0x40000, 0x50000, 0x60000)]
    host.launch(t[0], t[1], t[2], None, *args, 7)
    host.launch(t[3], t[4], t[5], None, *args, 9)
    assert len(driver.encode_into.calls) == 3 and driver.shared == [host.info.smem]
    one, two = driver.launches
    assert (one["stream"], two["stream"]) == (7, 9) and one["grid"] == two["grid"]
    for descriptor, address in ((0, 0x40000), (128, 0x50000), (256, 0x60000)):
        assert struct.unpack_from("<Q", two["params"], descriptor + 16)[0] == address
    with pytest.raises(ValueError, match="split-K"):
        host.launch(t[0], t[1], t[2], None, *args[:18], 2, 0, 132, 7)
    dgrad = LC.LightConv(FakeFunction(), L.expected_info(128, True, False, 2, False, 2), FakeDriver(16))
    strided = (2, 9, 11, 64, 128, 3, 3, 1, 1, 1, 1, 2, 2, 1, 1, 9 * 11 * 64, 11 * 64, 64, 1, 0, 132)
    with pytest.raises(ValueError, match="LIGHT_D_ROWS"):  # a strided dgrad takes the kernel of its phases
        dgrad.launch(t[0], t[1], t[2], None, *strided, 7)
    with pytest.raises(ValueError, match="NHWC memory"):
        dgrad.launch(t[0], t[1], t[2], None, *strided[:11], 1, 1, 1, 1, 9 * 11 * 64, 2 * 11 * 64, 64, 1, 0, 132, 7)


def test_a_strided_dgrad_launch_patches_every_phase_descriptor():
    driver = FakeDriver(16)
    driver.params_size = 512 + LC.MAX_PHASES * LC.PHASE_BYTES
    rows = LC.LightConv(FakeFunction(), L.expected_info(128, True, False, 2, False, 2, d_rows=True), driver)
    t = [FakeTensor(a) for a in (0x10000, 0x20000, 0x30000, 0x40000, 0x50000, 0x60000)]
    strided = (2, 9, 11, 64, 128, 3, 3, 1, 1, 1, 1, 2, 2, 1, 1, 9 * 11 * 64, 11 * 64, 64, 1, 0, 132)
    (first,) = rows.launch(t[0], t[1], t[2], t[2], *strided, 7)  # conv2d_run._call passes dx as the bias too
    (again,) = rows.launch(t[3], t[4], t[5], t[5], *strided, 9)
    assert again is first and len(driver.encode_into.calls) == 4 + 2  # packed once: four phases, B and D
    assert first.a_descriptors == tuple(LC.PHASE_ENTRIES + i * LC.PHASE_BYTES for i in range(4))
    params = driver.launches[-1]["params"]
    assert struct.unpack_from("<Q", params, L.FIELDS)[0] == 0x60000  # D's address where the rows are stored from
    assert struct.unpack_from("<3i", params, LC.CONV_FIELDS + 52) == (9 * 11 * 64, 2 * 11 * 64, 2 * 64)
    assert struct.unpack_from("<i", params, LC.PHASES_FIELD)[0] == 4
    for descriptor in first.a_descriptors:
        assert struct.unpack_from("<Q", params, descriptor + 16)[0] == 0x40000
    assert struct.unpack_from("<Q", params, 128 + 16)[0] == 0x50000
    by_three = (1, 11, 10, 64, 64, 3, 2, 1, 1, 0, 0, 3, 2, 1, 1, 11 * 10 * 64, 10 * 64, 64, 1, 0, 132)
    assert len(rows.launch(t[0], t[1], t[2], t[2], *by_three, 7)) == 2  # six phases: four, then two
    with pytest.raises(ValueError, match="multiples of 8"):
        rows.launch(t[0], t[1], t[2], t[2], *strided[:15], 9 * 11 * 64, 11 * 64, 68, 1, 0, 132, 7)


class EmulatingDriver(FakeDriver):
    """Runs the strided-dgrad kernel's launches on CPU memory, when asked (`run`: torch ops of its own must not
    count as the launching code's): emulate_phased_dgrad over the Params a launch passed, dy and the filter read
    at the addresses the descriptors were encoded with, dx written at the bias field's."""

    params_size = 512 + LC.MAX_PHASES * LC.PHASE_BYTES

    def __init__(self, shapes: dict) -> None:
        super().__init__(16)
        self.shapes = shapes  # "dy": (N, P, Q, K), "krsc": (K, R, S, C), "dx": (N, H, W, C), float32 memory

    def run(self) -> None:
        params = self.launches[-1]["params"]
        calls = self.encode_into.calls[-(struct.unpack_from("<i", params, LC.PHASES_FIELD)[0] + 2):]
        descriptors = {offset: args for offset, args, _ in calls}
        addresses = {offset: address for offset, _, address in calls}

        def at(address, shape):
            count = shape[0] * shape[1] * shape[2] * shape[3]
            return torch.frombuffer((ctypes.c_float * count).from_address(address), dtype=torch.float32).view(shape)

        dy = at(addresses[LC.PHASE_ENTRIES], self.shapes["dy"]).double()
        krsc = at(addresses[128], self.shapes["krsc"]).double()
        dx = at(struct.unpack_from("<Q", params, L.FIELDS)[0], self.shapes["dx"]).view(-1)
        out = torch.full(dx.shape, float("nan"), dtype=torch.float64)
        emulate_phased_dgrad(params, descriptors, dy, krsc, out, self.launches[-1]["grid"][0])
        written = ~out.isnan()
        dx[written] = out[written].float()


def test_a_strided_dgrad_runs_as_one_launch_that_only_allocates_and_launches(monkeypatch):
    """conv2d_run's strided dgrad on the light kernel: one call of its host side, no copy of the filter's taps
    and no zeroing of dx through torch (what the C++ host path's Recording requires), torch's input gradient."""
    from jitops import native
    from jitops.ops import conv2d_run

    n, c, h, w, k = 2, 16, 9, 8, 24
    stride, padding, dilation = (2, 2), (1, 1), (1, 1)
    weight = torch.randn(k, c, 3, 3).contiguous(memory_format=torch.channels_last)
    p, q = (output_size(size, 3, 2, 1, 1) for size in (h, w))
    grad = torch.randn(n, k, p, q).contiguous(memory_format=torch.channels_last)
    cls = conv_class(stride=stride, padding=padding, dilation=dilation)
    driver = EmulatingDriver({"dy": (n, p, q, k), "krsc": (k, 3, 3, c), "dx": (n, h, w, c)})
    function = FakeFunction()
    function.light_conv_host = LC.LightConv(function, L.expected_info(128, True, False, 2, False, 2, d_rows=True),
                                            driver)
    kern = SimpleNamespace(shape_class=cls, dgrad=function)
    monkeypatch.setattr(conv2d_run, "_launch_args", lambda t: (0, 132, 0))
    watch = native._Allocations()
    with watch:
        dx = conv2d_run._input_grad_cuda(kern, grad, weight, (n, c, h, w), stride, padding, dilation)
    assert watch.pure, "the run copied or zeroed through torch"
    assert len(driver.launches) == 1 and dx.is_contiguous(memory_format=torch.channels_last)
    driver.run()
    want = torch.nn.grad.conv2d_input((n, c, h, w), weight, grad, stride=stride, padding=padding, dilation=dilation)
    torch.testing.assert_close(dx, want, rtol=1e-5, atol=1e-5)


# ---- on a GPU -----------------------------------------------------------------------------------------------------
# The op's test geometries (tests/test_conv2d.py) and ResNet-50's layer kinds at batch 4: 1x1, 3x3, strided 3x3,
# strided 1x1, channels that are not a multiple of 64, and more filters than one tile.
GPU_CASES = [
    ((2, 8, 9, 11), (16, 3, 3), 1, 1, 1), ((2, 8, 9, 11), (16, 3, 3), 2, 1, 1), ((1, 16, 13, 13), (8, 3, 3), 1, 2, 2),
    ((2, 16, 7, 9), (24, 1, 1), 1, 0, 1), ((2, 16, 9, 9), (32, 1, 1), 2, 0, 1), ((1, 3, 15, 15), (8, 7, 7), 2, 3, 1),
    ((2, 12, 8, 8), (20, 3, 3), (2, 1), (1, 0), (1, 2)), ((4, 64, 56, 56), (64, 3, 3), 1, 1, 1),
    ((4, 256, 56, 56), (64, 1, 1), 1, 0, 1), ((4, 128, 56, 56), (128, 3, 3), 2, 1, 1),
    ((4, 1024, 14, 14), (2048, 1, 1), 2, 0, 1), ((4, 72, 20, 20), (200, 3, 3), 1, 1, 1),
    ((4, 512, 7, 7), (512, 3, 3), 1, 1, 1)]
GPU_IDS = [f"x{c[0]}-k{c[1]}-s{c[2]}-p{c[3]}-d{c[4]}".replace(" ", "") for c in GPU_CASES]
TOLERANCE = {FP16: 2e-3, BF16: 1.5e-2}


def _light_kernels_of(op, args, cls):
    return op.op.loaded(args[0].get_device(), cls).__dict__


def _gpu_args(case, dtype):
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the light kernels are sm_90a only")
    from test_conv2d import make_args
    return make_args(case, dtype, "cuda", channels_last=True)


@contextlib.contextmanager
def _light_kernels(wgrad_splits: int):
    """The light kernels, wgrad forced to this many slices; the kernel memo cleared on both sides (kernels loaded
    under another setting must not answer)."""
    jitops.clear_memory_cache()
    try:
        with jitops.config.scope(conv2d_sm90_kernel="light", conv2d_splits={"wgrad": wgrad_splits}):
            yield
    finally:
        jitops.clear_memory_cache()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [BF16, FP16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", GPU_CASES, ids=GPU_IDS)
def test_light_conv_matches_fp32_conv(case, dtype):
    from test_conv2d_gpu import fp32_reference, relative_error
    x, w, b, *geometry = _gpu_args(case, dtype)
    x.requires_grad_(True)
    w.requires_grad_(True)
    with _light_kernels(8):  # where the problem has 8 k-blocks (test_light_wgrad_* takes one and three slices)
        y = jitops.conv2d(x, w, b, *geometry)
        grad = torch.randn_like(y)
        dx, dw = torch.autograd.grad(y, (x, w), grad)
        cls = conv_module.shape_class(x, w, b, *geometry)
        loaded = _light_kernels_of(conv_module.conv2d, (x,), cls) if not cls.im2col else {}
    if not cls.im2col:  # the stem's 1x1 conv over its im2col matrix is a class of its own
        assert isinstance(loaded.get("fprop"), jitops.launch.CudaFunction), loaded
    want_y, (want_dx, want_dw, _) = fp32_reference(x, w, b, *geometry, grad=grad)
    for name, got, want in (("y", y, want_y), ("dx", dx, want_dx), ("dw", dw, want_dw)):
        error = relative_error(got, want)
        assert error < TOLERANCE[dtype], f"{name}: relative error {error:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("case", GPU_CASES, ids=GPU_IDS)
def test_light_wgrad_in_one_and_in_three_slices(case, splits):
    """One slice of aligned channels is the direct kernel, which writes dw (16-bit) itself; three, fp32 slices."""
    from test_conv2d_gpu import fp32_reference, relative_error
    x, w, b, *geometry = _gpu_args(case, BF16)
    w.requires_grad_(True)
    with _light_kernels(splits):
        y = jitops.conv2d(x, w, b, *geometry)
        grad = torch.randn_like(y)
        (dw,) = torch.autograd.grad(y, (w,), grad)
        cls = conv_module.weight_grad_shape_class(grad, x, w.shape, *geometry)
        loaded = _light_kernels_of(conv_module.conv2d_weight_grad, (grad,), cls)
    if not cls.im2col:
        assert isinstance(loaded.get("wgrad_direct" if cls.splits == 1 else "wgrad"), jitops.launch.CudaFunction)
        assert cls.splits == 1 or "wgrad_direct" not in loaded
    want_y, (_, want_dw, _) = fp32_reference(x, w, b, *geometry, grad=grad)
    error = relative_error(dw, want_dw)
    assert error < TOLERANCE[BF16], f"dw: relative error {error:.2e}"
