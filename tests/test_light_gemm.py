"""jitops.gemm's light sm_90a kernel (kernels/gemm/sm90_light_gemm.cu, JITOPS_GEMM_SM90_KERNEL=light).

On the CPU: it compiles under NVRTC for sm_90a (about 1-2 s on the 2-core dev box) with wgmma (operand layouts as
asked), TMA and register reconfiguration in its PTX, no spills, no local memory and no serialized wgmma; the
launch facts it exports match the host side's; the host side's descriptors, Params, grid and hot path; the route
the setting picks, with unsupported classes falling back to CUTLASS's kernel.  On a GPU (marked): results
against an fp32 torch.matmul reference on awkward and benchmark shapes, in every operand layout."""
from __future__ import annotations

import ctypes
import os
import re
import struct

import pytest
import torch
import torch.nn.functional as F

import jitops
from jitops import light_gemm as L
from jitops.backends import toolkit
from jitops.backends.nvrtc import NvrtcBackend
from jitops.cutlass_host import SWIZZLE_128B, TMA_FLOAT32, TMA_UINT16, TmaArgs, elf_symbol
from jitops.ops import gemm as G
from jitops.ops import gemm_plan as P
from jitops.specs import Target

from fakes import FakeTmaDriver
SM90A = Target.parse("sm_90a")
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32


def gemm_class(m: int, k: int, n: int, dtype=BF16, out_dtype=None, bias=False, activation=None, b_kmajor=True,
               a_kmajor=True):
    """jitops.gemm's shape class of a call on meta tensors (a (M, K), b (K, N); b_kmajor: b = w.t())."""
    a = torch.empty((m, k) if a_kmajor else (k, m), dtype=dtype, device="meta")
    a = a if a_kmajor else a.t()
    b = torch.empty((n, k), dtype=dtype, device="meta").t() if b_kmajor else \
        torch.empty((k, n), dtype=dtype, device="meta")
    bias_t = torch.empty((n,), dtype=dtype, device="meta") if bias else None
    return G.shape_class(a, b, bias_t, activation, out_dtype)


# ---- compiling ----------------------------------------------------------------------------------------------------
def compile_with_ptx(request) -> tuple[bytes, str, str]:
    """(cubin, PTX, log) of one NVRTC compile with the backend's options and ptxas -v (registers, spills)."""
    options = NvrtcBackend().options(request, "sm_90a") + ["--ptxas-options=-v"]
    with toolkit.nvrtc().program(request.source.read(), request.source.name) as program:
        program.add_name_expression(request.entry)
        if not program.compile(options):
            pytest.fail(program.log())
        return program.cubin(), program.ptx(), program.log()


BUILDS = [  # (inputs, output, tile M, tile N, fused, A K-major, B K-major, pingpong)
    (BF16, BF16, 128, 256, False, True, True, False), (BF16, FP32, 128, 256, True, True, True, False),
    (FP16, FP16, 128, 128, True, True, True, False), (FP16, FP32, 128, 128, False, True, True, False),
    (BF16, BF16, 128, 256, False, True, False, False), (BF16, BF16, 128, 128, True, False, True, False),
    (FP16, FP16, 128, 256, False, False, False, False), (BF16, BF16, 128, 128, False, True, True, True),
    (BF16, BF16, 128, 128, True, True, False, True), (FP16, FP32, 128, 128, True, False, False, True),
    # the few-row buckets' 64-row tiles (tile_m_for): one consumer warpgroup, 256 threads, no setmaxnreg
    (BF16, BF16, 64, 128, False, True, True, False), (BF16, BF16, 64, 64, True, True, True, False),
    (BF16, BF16, 64, 128, True, True, False, False), (BF16, BF16, 64, 64, False, False, False, False),
    (BF16, BF16, 64, 256, False, True, True, False),
    # the wave buckets' 192-row and 192-column tiles: three consumer warpgroups, 512 threads, 152 registers each
    (BF16, BF16, 192, 192, False, True, True, False), (BF16, BF16, 192, 192, True, True, True, False),
    (FP16, FP32, 192, 192, True, False, False, False), (BF16, BF16, 192, 192, False, True, False, False),
    (BF16, BF16, 192, 128, False, False, False, False), (BF16, BF16, 128, 192, True, True, True, False),
    (BF16, BF16, 128, 192, False, False, False, False)]


@pytest.mark.parametrize("dtype,out_dtype,tile_m,tile_n,fused,a_kmajor,b_kmajor,pingpong", BUILDS,
                         ids=[f"{d}-{o}-m{m}n{t}-{'fused' if f else 'plain'}-{'T' if ak else 'N'}{'T' if bk else 'N'}"
                              f"{'-pingpong' if pp else ''}".replace("torch.", "")
                              for d, o, m, t, f, ak, bk, pp in BUILDS])
def test_kernel_compiles_for_sm90a_with_wgmma_and_no_spills(dtype, out_dtype, tile_m, tile_n, fused, a_kmajor,
                                                            b_kmajor, pingpong):
    extra = {"LIGHT_TILE_M": tile_m} if tile_m != L.TILE_M else {}
    request = L.LIGHT_GEMM.bind(
        "bf16", LIGHT_T=L.IN_TYPES[dtype], LIGHT_OUT=L.OUT_TYPES[out_dtype], LIGHT_TILE_N=tile_n,
        LIGHT_FUSED=int(fused), LIGHT_A_KMAJOR=int(a_kmajor), LIGHT_B_KMAJOR=int(b_kmajor),
        LIGHT_PINGPONG=int(pingpong), **extra)
    cubin, ptx, log = compile_with_ptx(request)
    ab = "bf16" if dtype == BF16 else "f16"
    assert f"wgmma.mma_async.sync.aligned.m64n{tile_n}k16.f32.{ab}.{ab}" in ptx
    # imm-trans-a, imm-trans-b: 1 for an MN-major tile, on every wgmma
    transposes = set(re.findall(r"p, 1, 1, (\d), (\d);", ptx))
    assert transposes == {(str(int(not a_kmajor)), str(int(not b_kmajor)))}
    # TMA loads a k-block issues: one box a K-major tile, 64-row boxes an MN-major one
    boxes = (1 if a_kmajor else tile_m // 64) + (1 if b_kmajor else tile_n // 64)
    loads = ptx.count("cp.async.bulk.tensor.2d.shared::cluster.global")
    assert loads and loads % boxes == 0
    assert "mbarrier.try_wait.parity" in ptx
    # two or three consumer warpgroups trade registers with the producer; one has all it needs at launch
    assert ("setmaxnreg.inc" in ptx) == (tile_m > 64) and ("setmaxnreg" in ptx) == (tile_m > 64)
    # ptxas: no stack, no spills, no serialized wgmma (C7510: "wgmma ... serialized"), within the threads' share
    assert "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" in log, log
    assert "C7510" not in log and "serialized" not in log, log
    info = L.LightInfo.from_cubin(cubin)
    registers = int(re.search(r"Used (\d+) registers", log).group(1))
    assert registers <= min(255, 65536 // info.threads)
    assert info == L.expected_info(tile_n, a_kmajor, b_kmajor, out_dtype.itemsize, pingpong, tile_m=tile_m)
    assert info.threads == 128 * (tile_m // 64 + 1) and info.tile_m == tile_m
    # the epilogue: one TMA store a 128-byte column chunk of a warpgroup's rows, through swizzled shared memory;
    # the only other global stores are a split tail's fp32 slices, its counters counted and reset by atomics
    assert "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group" in ptx
    assert set(re.findall(r"\tst\.global\.(\S+)", ptx)) == (set() if pingpong else {"f32"})
    assert ("atom.global.add" in ptx) == ("atom.global.exch" in ptx) == (not pingpong)
    assert elf_symbol(cubin, "jitops_sm90_light_gemm")  # the entry, unmangled: extern "C"
    assert (struct.unpack_from("<I", cubin, 48)[0] >> 8) & 0xFF == 90


def test_each_bucket_takes_its_tile():
    tiles = {}
    for bucket, (m, n, k) in P.BUCKET_EXAMPLES.items():
        cls = gemm_class(m, k, n)  # (M, K, N)
        assert cls.bucket == bucket
        defines = dict(L.request(cls).defines)
        tiles[bucket] = (int(defines.get("LIGHT_TILE_M", "128")), int(defines["LIGHT_TILE_N"]))
        assert tiles[bucket][0] == L.tile_m_for(bucket)
    assert tiles == {"large": (128, 256), "large_short_k": (128, 128), "medium": (128, 128), "small": (128, 64),
                     "skinny": (64, 128), "decode": (64, 256), "decode_narrow": (64, 128),
                     "wave_192x192": (192, 192), "wave_128x192": (128, 192), "wave_192x128": (192, 128)}
    # the wave model's tiles are the kernel's
    assert all(L.TILES[bucket] == P.WAVE_TILES[bucket][:2] for bucket in P.WAVE_TILES)


def test_the_route_builds_it_through_the_runtime(fresh_cache):
    """The whole build path with the setting on: request, cache key, NVRTC, entry on disk, lowered name."""
    cls = gemm_class(1000, 1000, 1000, bias=True, activation="gelu")
    with jitops.config.scope(gemm_sm90_kernel="light"):
        requests = G.cuda_kernels(cls, SM90A)
    [(name, request)] = requests.items()
    assert name == "sm90_light"
    assert jitops.runtime.prewarm(request, SM90A) == "compiled"
    key, _ = jitops.runtime.key_for(request, SM90A)
    entry = jitops.runtime.find_entry(key, any_toolchain=False)
    assert entry.meta["lowered_name"] == "jitops_sm90_light_gemm"
    info = L.LightInfo.from_cubin(entry.file("kernel.cubin").read_bytes())
    assert info == L.expected_info(L.tile_n_for(cls.bucket), cls.a_kmajor, cls.b_kmajor, cls.out_dtype.itemsize,
                                   L.pingpong_for(cls.bucket), tile_m=L.tile_m_for(cls.bucket))


# ---- the route ---------------------------------------------------------------------------------------------------
def test_default_route_is_light_and_cutlass_is_a_setting():
    cls = gemm_class(4096, 4096, 4096)
    assert G.cuda_kernels(cls, SM90A) == {"sm90_light": L.request(cls)}
    with jitops.config.scope(gemm_sm90_kernel="light"):
        assert G.cuda_kernels(cls, SM90A) == {"sm90_light": L.request(cls)}
    with jitops.config.scope(gemm_sm90_kernel="cutlass"):  # CUTLASS's requests as they were
        assert G.cuda_kernels(cls, SM90A) == {"sm90": G.sm90_request(cls, P.SM90_CONFIGS[cls.bucket])}


@pytest.mark.parametrize("m,k,n,dtype,out_dtype,fused,tile_n,a_kmajor,b_kmajor", [
    (4096, 4096, 4096, BF16, None, False, 256, True, True), (257, 1032, 4096, BF16, FP32, True, 128, True, True),
    (1000, 1000, 1000, FP16, None, True, 64, True, False), (1, 4096, 4096, BF16, None, False, 128, True, True),
    (4096, 4096, 4096, BF16, None, True, 256, False, False), (512, 4096, 1024, BF16, None, False, 64, False, True),
    (8192, 1024, 4096, BF16, None, True, 128, True, True)])
def test_light_route_for_every_layout(m, k, n, dtype, out_dtype, fused, tile_n, a_kmajor, b_kmajor):
    cls = gemm_class(m, k, n, dtype, out_dtype, bias=fused, a_kmajor=a_kmajor, b_kmajor=b_kmajor)
    assert (cls.a_kmajor, cls.b_kmajor) == (a_kmajor, b_kmajor)
    with jitops.config.scope(gemm_sm90_kernel="light"):
        [(name, request)] = G.cuda_kernels(cls, SM90A).items()
    assert name == "sm90_light" and request.kernel == "gemm_sm90_light"
    assert dict(request.defines) == {"LIGHT_T": str(L.IN_TYPES[dtype]), "LIGHT_OUT": str(int(out_dtype == FP32)),
                                     "LIGHT_TILE_N": str(tile_n), "LIGHT_FUSED": str(int(fused)),
                                     "LIGHT_A_KMAJOR": str(int(a_kmajor)), "LIGHT_B_KMAJOR": str(int(b_kmajor)),
                                     "LIGHT_PINGPONG": str(int(cls.bucket == "large_short_k")),
                                     **({"LIGHT_TILE_M": "64"} if m <= 256 and n >= 4096 else {})}


@pytest.mark.parametrize("case", ["N not a multiple of 8", "K not a multiple of 8", "M of a column-major a"])
def test_unsupported_classes_fall_back_to_cutlass(case):
    cls = {"N not a multiple of 8": lambda: gemm_class(1000, 1000, 1001),
           "K not a multiple of 8": lambda: gemm_class(1000, 1002, 1000),
           "M of a column-major a": lambda: gemm_class(1001, 1000, 1000, a_kmajor=False)}[case]()
    assert L.unsupported(cls)
    with jitops.config.scope(gemm_sm90_kernel="light"):
        light = G.cuda_kernels(cls, SM90A)
    assert light == G.cuda_kernels(cls, SM90A) and "sm90_light" not in light


def test_light_setting_leaves_other_archs_alone():
    cls = gemm_class(1000, 1000, 1000)
    with jitops.config.scope(gemm_sm90_kernel="light"):
        assert list(G.cuda_kernels(cls, Target.parse("sm_80"))) == ["sm80"]


def test_bad_setting_names_the_variable(monkeypatch):
    monkeypatch.setenv("JITOPS_GEMM_SM90_KERNEL", "fast")
    with pytest.raises(jitops.ConfigError, match="JITOPS_GEMM_SM90_KERNEL"):
        jitops.config.gemm_sm90_kernel
    monkeypatch.setenv("JITOPS_GEMM_SM90_KERNEL", " Light ")
    assert jitops.config.gemm_sm90_kernel == "light"


# ---- host-side arithmetic ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("tile_n", [128, 256])
@pytest.mark.parametrize("out_bytes", [2, 4])
def test_expected_info_fills_shared_memory_with_whole_stages(tile_n, out_bytes):
    info = L.expected_info(tile_n, out_bytes=out_bytes)
    stage = (128 + tile_n) * 64 * 2
    epilogue = 2 * 2 * 64 * 128  # two staging buffers of 64 rows x 128 bytes a consumer warpgroup
    assert info.smem == 1024 + info.stages * stage + epilogue + 16 * info.stages + 32 <= L.MAX_SMEM
    assert info.stages == L.MAX_STAGES or 1024 + (info.stages + 1) * (stage + 16) + epilogue + 32 > L.MAX_SMEM
    assert info.stages >= 4 and info.threads == 384 and (info.tile_m, info.tile_n, info.tile_k) == (128, tile_n, 64)
    assert info.store_cols * out_bytes == 128 and (info.tma_b, info.tma_d) == (128, 256)


def test_operand_descriptor_arguments():
    # A of 257 x 1032 with a padded leading dimension: K inner, 64-element (128-byte) boxes of 128 rows.
    assert L.operand_tma(True, 257, 1032, 1040, 128) == \
        TmaArgs(TMA_UINT16, (1032, 257), (2080,), (64, 128), SWIZZLE_128B)
    assert L.operand_tma(True, 4096, 4096, 4096, 256).box == (64, 256)
    # MN-major (a column-major A, a row-major B): rows inner, 64 x 64 boxes whatever the tile
    assert L.operand_tma(False, 4096, 1032, 4104, 256) == \
        TmaArgs(TMA_UINT16, (4096, 1032), (8208,), (64, 64), SWIZZLE_128B)


def test_output_descriptor_arguments():
    # D of 257 x 1032: N inner, boxes of 64 rows by 128 bytes (64 16-bit or 32 fp32 columns)
    assert L.output_tma(257, 1032, 1032, 64) == TmaArgs(TMA_UINT16, (1032, 257), (2064,), (64, 64), SWIZZLE_128B)
    assert L.output_tma(257, 1032, 1040, 32) == TmaArgs(TMA_FLOAT32, (1032, 257), (4160,), (32, 64), SWIZZLE_128B)


class Recorder:
    """Stands in for cuTensorMapEncodeTiled: the descriptor holds "LTMA" and the call's index."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, TmaArgs, int]] = []

    def __call__(self, buffer, offset: int, args: TmaArgs, address: int) -> None:
        ctypes.memmove(ctypes.addressof(buffer) + offset, b"LTMA" + struct.pack("<I", len(self.calls)) + bytes(120),
                       128)
        self.calls.append((offset, args, address))


@pytest.mark.parametrize("m,n,k,tile_n,sms,grid,group,a_kmajor,b_kmajor,split", [
    (257, 4096, 1032, 128, 132, 96, 3, True, True, (96, 1)), (4096, 4096, 4096, 256, 132, 132, 8, True, True, (512, 1)),
    (1, 4096, 4096, 128, 132, 128, 1, True, False, (0, 4)),  # 32 tiles: each split 4 ways, 16 k-blocks a split
    (1000, 1000, 1000, 128, 114, 64, 8, False, True, (64, 1)), (128, 128, 128, 128, 132, 1, 1, False, False, (1, 1)),
    (6304, 768, 768, 128, 132, 132, 8, True, True, (300, 1)),  # ViT-B/16's proj: 12 k-blocks, too few to split
    (6304, 768, 3072, 128, 132, 132, 8, True, True, (300, 1))])  # its fc2: more tiles than SMs, whole
def test_params_and_grid(m, n, k, tile_n, sms, grid, group, a_kmajor, b_kmajor, split):
    info = L.expected_info(tile_n, a_kmajor, b_kmajor)
    recorder = Recorder()
    lda, ldb = (k if a_kmajor else m) + 8, k if b_kmajor else n
    problem = L.Problem(m, n, k, lda, ldb, n, 2, sms)
    params, got_grid = L.pack_params(info, problem, (0xA000, 0xB000, 0xD000, 0xE000), recorder)
    assert len(params) == 448 and got_grid == (grid, 1, 1)
    assert struct.unpack_from("<Qiiiii", params, 384) == (0xE000, m, n, k, 2, group)
    assert struct.unpack_from("<ii4xQ", params, 412) == (*split, 0)  # the workspace: patched each call
    assert recorder.calls == [(0, L.operand_tma(a_kmajor, m, k, lda, 128), 0xA000),
                              (128, L.operand_tma(b_kmajor, n, k, ldb, tile_n), 0xB000),
                              (256, L.output_tma(m, n, n, 64), 0xD000)]
    assert params[0:4] == b"LTMA" and params[128:132] == b"LTMA" and params[256:260] == b"LTMA"


@pytest.mark.parametrize("b_kmajor", [True, False], ids=["forward", "input-gradient"])
def test_a_short_b_is_described_with_its_stored_rows(b_kmajor):
    """Problem.b_rows: B stored shorter than the problem (GPT-2's head: its 50257-row weight read by the 50264-wide
    padded problems).  B's descriptor holds the stored rows, N for a K-major B, K for an MN-major one, so TMA reads
    zeros past them; the problem's fields and the other descriptors are unchanged."""
    info = L.expected_info(128, True, b_kmajor)
    recorder = Recorder()
    m, n, k = (4096, 50264, 1024) if b_kmajor else (4096, 1024, 50264)
    ldb = 1024  # the weight's rows: the forward's K, the input gradient's N
    params, _ = L.pack_params(info, L.Problem(m, n, k, k, ldb, n, 0, 132, 50257), (0xA000, 0xB000, 0xD000, 0),
                              recorder)
    short = L.operand_tma(True, 50257, k, ldb, 128) if b_kmajor else L.operand_tma(False, n, 50257, ldb, 128)
    assert recorder.calls[0] == (0, L.operand_tma(True, m, k, k, 128), 0xA000)
    assert recorder.calls[1] == (128, short, 0xB000)
    assert recorder.calls[2] == (256, L.output_tma(m, n, n, 64), 0xD000)
    assert struct.unpack_from("<Qiiiii", params, 384)[1:4] == (m, n, k)
    with pytest.raises(ValueError, match="B stores"):
        L.check_problem(m, n, k, k, ldb, n, (0, 0, 0, 0), (n if b_kmajor else k) + 1, b_kmajor)


def _start_unit(tile: int, tiles: int, k_blocks: int, split_from: int, splits: int) -> tuple[int, int, int, int, int]:
    """kernels/gemm/sm90_light_gemm.cu's start_unit for the plain GEMM, transcribed: (output tile, first k-block,
    k-blocks, split or -1, slot)."""
    if tile < split_from:
        return tile, 0, k_blocks, -1, 0
    v = tile - split_from
    slot, split = divmod(v, splits)
    k_begin = split * k_blocks // splits
    return split_from + slot, k_begin, (split + 1) * k_blocks // splits - k_begin, split, slot


@pytest.mark.parametrize("m,n,k,tile_m,tile_n,sms", [
    (6304, 768, 768, 128, 128, 132), (6304, 768, 3072, 128, 128, 132), (1, 4096, 4096, 64, 128, 132),
    (16, 14336, 4096, 64, 256, 132), (256, 4096, 14336, 64, 128, 132), (1000, 1000, 1008, 128, 256, 132),
    (4096, 4096, 4096, 128, 256, 132), (8192, 128, 65536, 128, 128, 114), (300, 72, 136, 128, 128, 132),
    (768, 768, 6304, 128, 64, 132), (32, 8192, 8192, 64, 128, 132), (3000, 200, 8192, 128, 128, 132),
    (768, 768, 6304, 128, 128, 132), (256, 256, 65536, 128, 128, 132), (128, 4096, 14336, 64, 128, 132)])
def test_split_units_cover_every_k_block_of_every_tile_once(m, n, k, tile_m, tile_n, sms):
    """The split tail's walk, as the CTAs take it (unit = blockIdx + i * grid): every k-block of every tile in
    exactly one unit, each split at least SPLIT_MIN_BLOCKS k-blocks, the slices and counters inside the workspace
    the host allocates, and the split tiles in the last wave only."""
    tiles, k_blocks = -(-m // tile_m) * -(-n // tile_n), -(-k // 64)
    split_from, splits = L.split_tail(m, n, k, tile_m, tile_n, False, 1, sms)
    assert L.split_tail(m, n, k, tile_m, tile_n, True, 1, sms) == (tiles, 1)  # pingpong builds never split
    assert L.split_tail(m, n, k, tile_m, tile_n, False, 2, sms) == (tiles, 1)  # nor cluster builds
    units = split_from + (tiles - split_from) * splits
    grid = L.grid(L.Problem(m, n, k, k, k, n, 0, sms), tile_n, tile_m=tile_m, tail=(split_from, splits))[0]
    covered: dict[int, list[int]] = {}
    slices = set()
    for cta in range(grid):
        for unit in range(cta, units, grid):
            tile, k_begin, count, split, slot = _start_unit(unit, tiles, k_blocks, split_from, splits)
            covered.setdefault(tile, []).extend(range(k_begin, k_begin + count))
            if split >= 0:
                assert count >= L.SPLIT_MIN_BLOCKS and unit >= split_from
                slices.add((slot, split))
    assert sorted(covered) == list(range(tiles))
    assert all(sorted(blocks) == list(range(k_blocks)) for blocks in covered.values())
    nbytes, counters = L.workspace_bytes(m, n, tile_m, tile_n, split_from, splits)
    tail = tiles - split_from
    if splits == 1:
        assert (nbytes, counters) == (0, 0) and not slices
        return
    assert tile_n <= L.SPLIT_MAX_TILE_N  # 64 x 256 decode tiles lost to their fix-up
    assert split_from == 0 and tail * splits <= sms and splits <= L.SPLIT_MAX  # every tile, one round of units
    assert slices == {(slot, split) for slot in range(tail) for split in range(splits)}
    consumers = tile_m // 64
    slice_floats = 64 * tile_n  # a warpgroup's: its 64 rows of the tile
    assert nbytes == tail * splits * consumers * slice_floats * 4
    assert counters == tail * consumers <= L.COUNTERS_MIN  # one a split tile and warpgroup, in one buffer a stream


@pytest.mark.parametrize("m,n,k,tile_m,tile_n,expected", [
    (768, 768, 6304, 128, 128, (0, 3)),     # 36 tiles, 99 k-blocks: three ways, 108 units in one round
    (768, 768, 6304, 128, 64, (72, 1)),     # 72 tiles: two ways would take two rounds (they lost on the H200)
    (1, 4096, 4096, 64, 128, (0, 4)),       # decode: 32 tiles, four splits of 16 k-blocks in one round
    (128, 4096, 14336, 64, 128, (0, 2)),    # 64 tiles: two ways fill the SMs
    (256, 256, 65536, 128, 128, (0, 4)),    # 4 tiles: at most SPLIT_MAX ways (16 ways lost to the fix-up)
    (1, 14336, 4096, 64, 256, (56, 1)),     # 64 x 256 tiles never split (they lost on the H200)
    (1024, 1024, 4096, 128, 64, (128, 1)),  # 128 tiles: a wave nearly full, nothing to gain
    (6304, 768, 768, 128, 128, (300, 1)),   # more tiles than SMs
    (512, 512, 1024, 128, 128, (16, 1))])   # 16 k-blocks: under two splits' minimum
def test_the_split_count_follows_the_round_model(m, n, k, tile_m, tile_n, expected):
    assert L.split_tail(m, n, k, tile_m, tile_n, False, 1, 132) == expected


def test_problems_the_kernel_cannot_take_are_rejected():
    with pytest.raises(ValueError, match="multiples of 8"):
        L.check_problem(64, 100, 64, 64, 64, 100, (0, 0, 0, 0))
    with pytest.raises(ValueError, match="multiples of 8"):
        L.check_problem(64, 64, 64, 68, 64, 64, (0, 0, 0, 0))
    with pytest.raises(ValueError, match="16-byte aligned"):
        L.check_problem(64, 64, 64, 64, 64, 64, (2, 0, 0, 0))
    with pytest.raises(ValueError, match="16-byte aligned"):  # D: the epilogue stores it by TMA
        L.check_problem(64, 64, 64, 64, 64, 64, (0, 0, 8, 0))
    with pytest.raises(ValueError, match="multiples of 8"):
        L.check_problem(64, 64, 64, 64, 64, 68, (0, 0, 0, 0))
    with pytest.raises(ValueError, match="empty"):
        L.check_problem(0, 64, 64, 64, 64, 64, (0, 0, 0, 0))


class FakeDriver(FakeTmaDriver):
    def __init__(self, address_field):
        super().__init__(address_field, Recorder())

    def launch(self, function, grid, block, smem, stream, params_address):
        params = ctypes.cast(params_address, ctypes.POINTER(ctypes.c_void_p))[0]
        self.launches.append({"grid": grid, "block": block, "smem": smem, "stream": stream,
                              "params": ctypes.string_at(params, 448)})


class FakeFunction:
    handle, device_index = 0x1234, 0


@pytest.mark.parametrize("address_field", [16, None], ids=["patched in place", "through the driver"])
def test_repeated_problems_reuse_params_and_patch_only_addresses(address_field, monkeypatch):
    class Buffer:  # the split's slices and counters, at the same addresses each call (no GPU here)
        def __init__(self, address):
            self.data_ptr = lambda: address

    monkeypatch.setattr(L, "split_workspace", lambda device, stream, nbytes, count: (Buffer(0x80000), Buffer(0x90000)))
    info = L.expected_info(128)
    driver = FakeDriver(address_field)
    host = L.LightGemm(FakeFunction(), info, driver)
    shape = (1000, 1000, 4096, 4096, 4096, 1000, 1, 132)
    host.run(0x10000, 0x20000, 0x30000, 0x40000, *shape, stream=7)
    host.run(0x50000, 0x60000, 0x70000, 0, *shape, stream=9)
    assert len(driver.encode_into.calls) == 3 and driver.shared == [info.smem]
    assert driver.contexts == [0]  # a context before the first encode (autograd's threads start without one)
    one, two = driver.launches
    # 64 tiles of 128 x 128 for 132 SMs, 64 k-blocks: each split 2 ways (split_tail)
    assert one["block"] == 384 and one["smem"] == info.smem and one["grid"] == two["grid"] == (128, 1, 1)
    assert (one["stream"], two["stream"]) == (7, 9)
    assert struct.unpack_from("<QQ", one["params"], L.WORKSPACE_FIELD) == (0x80000, 0x90000)  # each call's workspace
    assert struct.unpack_from("<Q", two["params"], 384)[0] == 0
    changed = {i for i in range(448) if one["params"][i] != two["params"][i]}
    if address_field is None:
        assert [address for _, address in driver.replaced] == [0x50000, 0x60000, 0x70000]
        assert changed <= set(range(384, 392))
    else:
        for descriptor, address in ((0, 0x50000), (128, 0x60000), (256, 0x70000)):
            assert struct.unpack_from("<Q", two["params"], descriptor + address_field)[0] == address
        assert changed <= {descriptor + address_field + i for descriptor in (0, 128, 256) for i in range(8)} | \
            set(range(384, 392))
    host.run(0x10000, 0x20000, 0x30000, 0x40000, 2000, *shape[1:], stream=7)  # a new size: packed afresh
    assert len(driver.encode_into.calls) == 6
    assert struct.unpack_from("<i", driver.launches[-1]["params"], 392)[0] == 2000
    with pytest.raises(ValueError, match="16-byte aligned"):  # a new output address is checked too
        host.run(0x10000, 0x20000, 0x30008, 0x40000, *shape, stream=7)


# ---- on a GPU ----------------------------------------------------------------------------------------------------
# (M, K, N): the benchmark's and the shapes, awkward M, N and K that are not multiples of the tile;
# (4100, 1000, 4104) and (8192, 512, 4096) are many tiles with a short K (the pingpong kernel).
GPU_SHAPES = [(128, 128, 128), (1000, 1000, 1000), (4096, 4096, 4096), (257, 1032, 4096), (257, 4096, 1032),
              (1, 4096, 4096), (7, 256, 512), (4097, 256, 512), (8192, 512, 4096), (300, 72, 136),
              (4100, 1000, 4104)]
TOLERANCES = {BF16: (1.6e-2, 1.6e-2), FP16: (2e-3, 2e-3)}


def _reference(a, b, bias, activation):
    z = a.float() @ b.float()
    if bias is not None:
        z = z + bias.float()
    if activation == "relu":
        return torch.relu(z)
    if activation in ("gelu", "gelu_tanh"):
        return F.gelu(z, approximate="tanh" if activation == "gelu_tanh" else "none")
    return z


def _run_light(a, b, bias=None, activation=None, out_dtype=None, expect_light=True):
    jitops.clear_memory_cache()  # kernels loaded under the default setting must not answer
    with jitops.config.scope(gemm_sm90_kernel="light"):
        out = jitops.gemm(a, b, bias=bias, activation=activation, out_dtype=out_dtype)
        cls = G.shape_class(a, b, bias, activation, out_dtype)
        kernels = G.gemm.op.loaded(a.get_device(), cls)
    assert ("sm90_light" in kernels.__dict__) == expect_light, kernels
    jitops.clear_memory_cache()
    return out


def _needs_sm90():
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the light kernel is sm_90a only")


@pytest.mark.gpu
@pytest.mark.parametrize("m,k,n", GPU_SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("dtype", [BF16, FP16], ids=["bf16", "fp16"])
def test_light_kernel_matches_fp32_matmul(m, k, n, dtype):
    _needs_sm90()
    g = torch.Generator().manual_seed(m * 31 + n * 7 + k)
    a = torch.randn(m, k, generator=g).to("cuda", dtype)
    w = torch.randn(n, k, generator=g).to("cuda", dtype)
    out = _run_light(a, w.t())
    assert out.shape == (m, n) and out.dtype == dtype and out.is_contiguous()
    rtol, atol = TOLERANCES[dtype]
    torch.testing.assert_close(out.float(), _reference(a, w.t(), None, None), rtol=rtol, atol=atol)


@pytest.mark.gpu
@pytest.mark.parametrize("m,k,n,activation", [(16, 4096, 4096, None), (1, 14336, 4096, None), (128, 14336, 4096, None),
                                               (16, 4096, 4096, "gelu")],
                         ids=lambda v: str(v))
def test_a_split_tail_matches_fp32_and_repeats_its_bits(m, k, n, activation):
    """Shapes whose tiles the host splits (split_tail: decode GEMVs on 64-row tiles four ways, a 128-row skinny GEMM
    two ways, a fused epilogue): the result within tolerance, and
    the same bits on every call (the slices are summed in split order, whichever split finishes last; a call that
    found its counters not reset would leave tiles unwritten)."""
    _needs_sm90()
    g = torch.Generator().manual_seed(m + k + n)
    a = torch.randn(m, k, generator=g).to("cuda", BF16)
    w = torch.randn(n, k, generator=g).to("cuda", BF16)
    bias = torch.randn(n, generator=g).to("cuda", BF16) if activation else None
    cls = G.shape_class(a, w.t(), bias, activation, None)
    tile_m, tile_n, pingpong = L.tile_m_for(cls.bucket), L.tile_n_for(cls.bucket), L.pingpong_for(cls.bucket)
    count = torch.cuda.get_device_properties(0).multi_processor_count
    assert L.split_tail(m, n, k, tile_m, tile_n, pingpong, 1, count)[1] > 1, "not a split shape on this GPU"
    first = _run_light(a, w.t(), bias, activation)
    for _ in range(3):
        assert torch.equal(_run_light(a, w.t(), bias, activation), first)
    torch.testing.assert_close(first.float(), _reference(a, w.t(), bias, activation), rtol=1.6e-2, atol=1.6e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("out_dtype", [None, FP32], ids=["same", "fp32"])
def test_light_kernel_fused_epilogue(activation, out_dtype):
    _needs_sm90()
    m, k, n = 1000, 1032, 4096
    if out_dtype is None:  # and the pingpong kernel's epilogue: many tiles, a short K
        m, k, n = 4100, 1000, 4104
    g = torch.Generator().manual_seed(5)
    a = torch.randn(m, k, generator=g).to("cuda", BF16)
    w = (torch.randn(n, k, generator=g) / 32).to("cuda", BF16)
    bias = torch.randn(n, generator=g).to("cuda", BF16)
    out = _run_light(a, w.t(), bias, activation, out_dtype)
    assert out.dtype == (out_dtype or BF16)
    tol = (1e-3, 1e-3) if out_dtype == FP32 else TOLERANCES[BF16]
    torch.testing.assert_close(out.float(), _reference(a, w.t(), bias, activation), rtol=tol[0], atol=tol[1])


@pytest.mark.gpu
def test_light_kernel_reads_padded_rows_and_new_buffers():
    """Leading dimensions larger than K (views into wider buffers), then the same problem on other buffers (the
    cached Params patched with the new addresses)."""
    _needs_sm90()
    a_buffer = torch.randn(600, 1024 + 64, device="cuda", dtype=BF16)
    w_buffer = torch.randn(768, 1024 + 128, device="cuda", dtype=BF16)
    a, w = a_buffer[:, :1024], w_buffer[:, :1024]
    torch.testing.assert_close(_run_light(a, w.t()).float(), _reference(a, w.t(), None, None), rtol=1.6e-2,
                               atol=1.6e-2)
    with jitops.config.scope(gemm_sm90_kernel="light"):
        first = jitops.gemm(a, w.t())
        a2, w2 = torch.randn_like(a), torch.randn_like(w)
        second = jitops.gemm(a2, w2.t())
    torch.testing.assert_close(first.float(), _reference(a, w.t(), None, None), rtol=1.6e-2, atol=1.6e-2)
    torch.testing.assert_close(second.float(), _reference(a2, w2.t(), None, None), rtol=1.6e-2, atol=1.6e-2)
    jitops.clear_memory_cache()


@pytest.mark.gpu
def test_light_kernel_first_used_in_a_backward(monkeypatch):
    """autograd runs the backward's GEMMs on a device thread of its own that starts without a current CUDA
    context: the process's first light host side (its descriptor probe) and a new problem's descriptors may be
    made there (a Linear's first backward raised CUDA_ERROR_INVALID_CONTEXT from cuTensorMapEncodeTiled)."""
    _needs_sm90()
    jitops.clear_memory_cache()  # fresh host sides
    x = torch.randn(300, 512, device="cuda", dtype=BF16, requires_grad=True)
    w = torch.randn(384, 512, device="cuda", dtype=BF16)
    y = jitops.gemm(x, w.t())
    monkeypatch.setattr(L._LightDriver, "_instance", None)  # the backward's GEMM makes the process's first
    dy = torch.randn_like(y)
    (grad,) = torch.autograd.grad(y, [x], dy)
    torch.testing.assert_close(grad.float(), (dy.float() @ w.float()), rtol=1.6e-2, atol=1.6e-2)
    jitops.clear_memory_cache()


@pytest.mark.gpu
@pytest.mark.parametrize("a_t,b_t", [(False, False), (True, False), (True, True)], ids=["NN", "TN", "TT"])
@pytest.mark.parametrize("m,k,n", [(1000, 1000, 1000), (257, 1032, 4096), (4096, 4096, 4096), (7, 256, 512),
                                   (4100, 1000, 4104)], ids=lambda v: str(v))
def test_light_kernel_mn_major_operands(m, k, n, a_t, b_t):
    """a column-major (a_t: the view of a (K, M) matrix) and/or b row-major (not b_t): MN-major tiles, the
    transposed wgmma; the backward's GEMMs take these layouts."""
    _needs_sm90()
    g = torch.Generator().manual_seed(m + n + k)
    a = torch.randn(k, m, generator=g).to("cuda", BF16).t() if a_t else torch.randn(m, k, generator=g).to("cuda", BF16)
    b = torch.randn(n, k, generator=g).to("cuda", BF16).t() if b_t else torch.randn(k, n, generator=g).to("cuda", BF16)
    out = _run_light(a, b, expect_light=not (a_t and m % 8))
    torch.testing.assert_close(out.float(), _reference(a, b, None, None), rtol=1.6e-2, atol=1.6e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["N = 1001", "K = 1002"])
def test_unsupported_shapes_fall_back_to_cutlass_on_the_gpu(case):
    _needs_sm90()
    a = torch.randn(300, 1024 if case == "N = 1001" else 1002, device="cuda", dtype=BF16)
    b = torch.randn(1001, 1024, device="cuda", dtype=BF16).t() if case == "N = 1001" else \
        torch.randn(512, 1002, device="cuda", dtype=BF16).t()
    out = _run_light(a, b, expect_light=False)
    torch.testing.assert_close(out.float(), _reference(a, b, None, None), rtol=1.6e-2, atol=1.6e-2)


def test_gpu_tests_cover_the_goal_shapes():
    """The issue's shapes are among the GPU cases, so the next GPU session verifies exactly them."""
    assert {(1000, 1000, 1000), (4096, 4096, 4096), (257, 1032, 4096)} <= set(GPU_SHAPES)
    assert os.path.basename(L.LIGHT_GEMM.source.relpath) == "sm90_light_gemm.cu"


class FakeTma:
    """A driver whose descriptors keep the global address at byte `field` (None: scattered, unpatchable)."""

    def __init__(self, field):
        self.field = field
        self.bound: list = []  # devices whose context ensure_context bound on this thread

    def encode_into(self, buffer, offset, args, address):
        assert self.bound, "cuTensorMapEncodeTiled needs a current context: ensure_context first"
        assert (ctypes.addressof(buffer) + offset) % 64 == 0, "the driver wants 64-byte aligned tensor maps"
        ctypes.memmove(ctypes.addressof(buffer) + offset, bytes(range(128)), 128)
        if self.field is not None:
            ctypes.memmove(ctypes.addressof(buffer) + offset + self.field, struct.pack("<Q", address), 8)

    def replace(self, descriptor, address):
        if self.field is None:
            return 1  # CUDA_ERROR_INVALID_VALUE
        ctypes.memmove(descriptor + self.field, struct.pack("<Q", address), 8)
        return 0

    def set_shared_memory(self, function, size):
        pass

    def ensure_context(self, device_index):
        self.bound.append(device_index)


def test_tma_driver_binds_a_context_for_every_caller_thread(monkeypatch):
    """The process's one _TmaDriver, made on one thread, still binds the caller's context on another (autograd's
    device thread, where a light kernel's descriptor probe raised CUDA_ERROR_INVALID_CONTEXT on the H100)."""
    import threading

    from jitops import cutlass_host

    bound: list = []
    monkeypatch.setattr(cutlass_host, "ensure_context", lambda device_index: bound.append(
        (threading.get_ident(), device_index)))
    monkeypatch.setattr(cutlass_host._TmaDriver, "_instance", object())  # made earlier, elsewhere
    other = threading.Thread(target=cutlass_host._TmaDriver.get, args=(0,))
    other.start()
    other.join()
    cutlass_host._TmaDriver.get(0)
    assert [device for _, device in bound] == [0, 0] and bound[0][0] != bound[1][0]


@pytest.mark.parametrize("field", [0, 40, None])
def test_driver_finds_where_rank2_descriptors_keep_the_address(monkeypatch, field):
    # get() leaves this thread a current context, as _TmaDriver.get does (next test); the probe comes after it
    # (FakeTma.encode_into checks).
    def get(cls, device_index):
        tma = FakeTma(field)
        tma.ensure_context(device_index)
        return tma

    monkeypatch.setattr(L._TmaDriver, "get", classmethod(get))
    monkeypatch.setattr(L._Driver, "get", classmethod(lambda cls: object()))
    driver = L._LightDriver(0)
    assert driver.address_field == field
    params = bytearray(320)
    buffer = (ctypes.c_char * 320).from_buffer(params)
    driver.encode_into(buffer, 128, L.operand_tma(True, 64, 64, 64, 128), 0xABC0)  # Params is only 16-byte aligned
    assert params[128 + 100] == 100 and (field is None or struct.unpack_from("<Q", params, 128 + field)[0] == 0xABC0)


@pytest.mark.gpu
@pytest.mark.parametrize("m,k,n,a_t", [(6304, 768, 768, False), (4096, 1024, 1088, False), (1024, 4096, 1024, True),
                                       (300, 512, 320, False)], ids=lambda v: str(v))
def test_a_cluster_kernel_gives_the_single_cta_kernels_bits(m, k, n, a_t):
    """LIGHT_CLUSTER 2 (two CTAs along N, each multicasting half of A's tile into both) computes the same products
    in the same order as one CTA a tile: the same bits, K-major or MN-major A, with an odd count of tile columns
    (the last pair's second tile past N: 1088 = 8.5 tiles of 128; 320 = 5 of 64) and a last tile row of 44 rows."""
    _needs_sm90()
    from jitops.launch import current_stream, sm_count
    g = torch.Generator().manual_seed(m + k + n)
    a = torch.randn(k, m, generator=g).to("cuda", BF16).t() if a_t else torch.randn(m, k, generator=g).to("cuda", BF16)
    b = torch.randn(n, k, generator=g).to("cuda", BF16).t()
    cls = G.shape_class(a, b, None, None, None)
    params = dict(L.request(cls).params)
    if "LIGHT_TILE_M" in params:  # a wave bucket's 192-row tile: the clusters pair 128-row tiles
        params.pop("LIGHT_TILE_M")
        params["LIGHT_TILE_N"] = "128"
    single = L.LIGHT_GEMM.bind(L.request(cls).dtype, **params)
    outs = []
    for request in (single, L.LIGHT_GEMM.bind(single.dtype, LIGHT_CLUSTER=2, **params)):
        kernel = jitops.runtime.get_kernel(request, Target("cuda", torch.cuda.get_device_capability(0)), 0)
        out = torch.full((m, n), float("nan"), device="cuda", dtype=BF16)
        L.run(kernel, a, b, out, None, m, n, k, m if a_t else k, k, 0, sm_count(0), current_stream(0))
        outs.append(out)
    torch.testing.assert_close(outs[0].float(), _reference(a, b, None, None), rtol=1.6e-2, atol=1.6e-2)
    assert torch.equal(outs[0], outs[1])
