"""jitops.grouped_gemm's light sm_90a kernels (jitops/light_grouped.py; kernels/gemm/sm90_light_gemm.cu with
LIGHT_GROUPED), the default route.

On the CPU: each form compiles under NVRTC for sm_90a with no spills; the kernel classes and requests each call
picks (on meta tensors); the prewarm manifest and the backward's prefetch name the light kernels; Params, the list
form's table and the grid, packed with a recording encoder; repeated problems patch only addresses.
On a Hopper GPU (marked): ragged M, K and N and the list form against a float64 reference on awkward sizes, the
light kernel against CUTLASS's, a ragged K group isolated from its neighbour's infinities, offsets out of range
clamped (no out-of-bounds access), and CUDA-graph capture.  The op's own GPU tests (test_grouped_gemm_gpu.py) run
on this route too.
"""
from __future__ import annotations

import ctypes
import importlib
import re
import struct

import pytest
import torch

import jitops
from jitops import light_gemm as L
from jitops import light_grouped as LG
from jitops.backends import toolkit
from jitops.backends.nvrtc import NvrtcBackend
from jitops.cutlass_host import SWIZZLE_128B, TMA_UINT16, TmaArgs
from jitops.errors import ConfigError
from jitops.ops import grouped_gemm as gg
from jitops.ops import grouped_gemm_plan as gg_plan
from jitops.specs import Target

from fakes import FakeTmaDriver

SM90 = Target.parse("sm_90a")
BF16, FP16 = torch.bfloat16, torch.float16


def meta(shape, stride=None, dtype=BF16):
    return torch.empty_strided(shape, stride, dtype=dtype, device="meta") if stride else \
        torch.empty(shape, dtype=dtype, device="meta")


def form_of(request) -> tuple[int, int, int, int]:
    """(LIGHT_GROUPED, A K-major, B K-major, tile N) of a light request."""
    d = dict(request.defines)
    return int(d["LIGHT_GROUPED"]), int(d["LIGHT_A_KMAJOR"]), int(d["LIGHT_B_KMAJOR"]), int(d["LIGHT_TILE_N"])


# ---- compiling ----------------------------------------------------------------------------------------------------
BUILDS = [  # (dtype, form, A K-major, B K-major, tile N)
    (BF16, 1, 1, 0, 256), (BF16, 1, 1, 1, 256), (FP16, 1, 1, 0, 128), (BF16, 2, 0, 0, 256), (FP16, 2, 0, 0, 128),
    (BF16, 3, 1, 0, 256), (BF16, 3, 1, 1, 128), (FP16, 3, 0, 0, 256), (BF16, 3, 0, 1, 256)]


@pytest.mark.parametrize("dtype,form,a_kmajor,b_kmajor,tile_n", BUILDS,
                         ids=[f"{str(d)[6:]}-{f}-{a}{b}-n{t}" for d, f, a, b, t in BUILDS])
def test_each_form_compiles_for_sm90a_with_no_spills(dtype, form, a_kmajor, b_kmajor, tile_n):
    kernel = gg_plan.GemmKernelClass(dtype, bool(a_kmajor), not b_kmajor, f"light_128x{tile_n}")
    request = LG.request(kernel, {1: "M", 2: "K", 3: "list"}[form])
    assert form_of(request) == (form, a_kmajor, b_kmajor, tile_n)
    options = NvrtcBackend().options(request, "sm_90a") + ["--ptxas-options=-v"]
    with toolkit.nvrtc().program(request.source.read(), request.source.name) as program:
        program.add_name_expression(request.entry)
        assert program.compile(options), program.log()
        cubin, ptx, log = program.cubin(), program.ptx(), program.log()
    ab = "bf16" if dtype == BF16 else "f16"
    assert f"wgmma.mma_async.sync.aligned.m64n{tile_n}k16.f32.{ab}.{ab}" in ptx
    assert "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" in log, log
    assert "C7510" not in log, log
    info = L.LightInfo.from_cubin(cubin)
    assert info == L.expected_info(tile_n, bool(a_kmajor), bool(b_kmajor), grouped=form)
    assert info.params_size == 448
    if form == 1:  # B through a 3-D descriptor, D by rows (st.global), no TMA store
        assert "cp.async.bulk.tensor.3d.shared::cluster.global" in ptx and "st.global.v4" in ptx
        assert "cp.async.bulk.tensor.2d.global.shared::cta" not in ptx
    elif form == 2:  # the last k-block's rows zeroed, then both consumers meet; D by a 3-D TMA store
        assert "cp.async.bulk.tensor.3d.global.shared::cta" in ptx and "fence.proxy.async.shared::cta" in ptx
        assert re.search(r"bar\.sync\s+3, 256", ptx) or "bar.sync" in ptx
    else:  # descriptors from the table in global memory, acquired first
        assert "fence.proxy.tensormap::generic.acquire.gpu" in ptx
        assert "cp.async.bulk.tensor.2d.global.shared::cta" in ptx


# ---- which kernels a call takes --------------------------------------------------------------------------------
def test_the_light_kernels_are_the_default_and_cutlass_a_setting(monkeypatch):
    x, w, offsets = meta((9216, 2048)), meta((64, 2048, 1024)), meta((64,), dtype=torch.int32)
    cls = gg.ragged_shape_class(x, w, offsets)
    assert cls.kernel == gg_plan.GemmKernelClass(BF16, True, True, "light_128x256")
    assert set(gg._kernels(cls, SM90)) == {"light"}
    assert gg._kernels(cls, Target.parse("sm_80")) == {}
    monkeypatch.setenv("JITOPS_GROUPED_GEMM_SM90_KERNEL", "cutlass")
    assert gg.ragged_shape_class(x, w, offsets).kernel.config == gg_plan.DEFAULT  # the memo keys on the setting
    monkeypatch.setenv("JITOPS_GROUPED_GEMM_SM90_KERNEL", "fast")
    with pytest.raises(ConfigError, match="JITOPS_GROUPED_GEMM_SM90_KERNEL='fast'"):
        gg.ragged_shape_class(meta((9215, 2048)), w, offsets)


def test_a_forced_configuration_picks_its_family():
    x, w, offsets = meta((100, 64)), meta((4, 64, 512)), meta((4,), dtype=torch.int32)
    with jitops.config.scope(grouped_gemm_config="light_128x128"):
        assert form_of(gg._kernels(gg.ragged_shape_class(x, w, offsets), SM90)["light"])[3] == 128
    with jitops.config.scope(grouped_gemm_config=gg_plan.DEFAULT):
        assert set(gg._kernels(gg.ragged_shape_class(x, w, offsets), SM90)) == {"gemm"}
    with jitops.config.scope(grouped_gemm_config="light_64x64"), pytest.raises(ValueError, match="light_128x256"):
        gg.ragged_shape_class(x, w, offsets)


def test_narrow_outputs_take_128_wide_tiles():
    offsets = meta((4,), dtype=torch.int32)
    assert gg.ragged_shape_class(meta((100, 64)), meta((4, 64, 128)), offsets).kernel.config == "light_128x128"
    assert gg.ragged_shape_class(meta((100, 64)), meta((4, 64, 136)), offsets).kernel.config == "light_128x256"
    listed = gg.list_shape_class([meta((64, 64))] * 2, [meta((64, 64)), meta((64, 512))])
    assert listed.kernel.config == "light_128x256"  # the widest product decides


def test_the_prewarm_manifest_names_every_training_kernel_at_both_tile_widths():
    """Ragged M with B N-major (forward) and K-major (dx), ragged K (dw), and the list form's forward, dA and dB,
    each at both tile widths, in bf16 and fp16: 24 light kernels."""
    requests = set()
    public = jitops.find_public("grouped_gemm")
    for item in gg.PREWARM:
        for dtype in item["dtypes"]:
            for shapes in item["shapes"]:
                entry, shapes, kwargs = public.form(shapes, item["kwargs"])
                args = entry.example_args(dtype, shapes, kwargs, None)
                for op, a in public.calls(entry, args):
                    requests |= {(dtype,) + form_of(r) for r in gg._kernels(op.shape_class(*a), SM90).values()}
    layouts = {(1, 1, 0), (1, 1, 1), (2, 0, 0), (3, 1, 0), (3, 1, 1), (3, 0, 0)}
    assert requests == {(dtype, *layout, tile) for dtype in ("bf16", "fp16") for layout in layouts
                        for tile in (128, 256)}


def test_backward_kernels_are_prefetched(monkeypatch):
    op_module = importlib.import_module("jitops.op")
    requested = []
    monkeypatch.setattr(op_module.runtime, "get_kernel", lambda request, *args: requested.append(request))
    monkeypatch.setattr(op_module, "ensure_context", lambda index: None)
    monkeypatch.setattr(op_module, "_PREFETCHED", set())
    monkeypatch.setitem(gg.grouped_gemm_ragged.op._targets, 0, SM90)
    x, w = meta((9216, 2048)).requires_grad_(), meta((64, 2048, 1024)).requires_grad_()
    for thread in gg.grouped_gemm_ragged.op.prefetch(x, w, meta((64,), dtype=torch.int32)):
        thread.join()
    assert {form_of(r) for r in requested} == {(1, 1, 1, 256), (2, 0, 0, 256)}


# ---- Params, the table, the grid -------------------------------------------------------------------------------
class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[int, TmaArgs, int]] = []

    def __call__(self, buffer, offset: int, args: TmaArgs, address: int) -> None:
        ctypes.memmove(ctypes.addressof(buffer) + offset, struct.pack("<Q", address) + bytes(120), 128)
        self.calls.append((offset, args, address))


def test_ragged_m_params():
    info = L.expected_info(256, True, False, grouped=1)
    recorder = Recorder()
    p = LG.RaggedProblem("M", 64, 9216, 1024, 2048, 2048, 1024, 2048 * 1024, 1024, 132)
    params = LG.pack_ragged(info, p, (0xA000, 0xB000, 0xD000, 0xF000), recorder)
    assert len(params) == 448
    a, b, d = (args for _, args, _ in recorder.calls)
    assert a == TmaArgs(TMA_UINT16, (2048, 9216), (4096,), (64, 128), SWIZZLE_128B)  # A (T, K), K inner
    assert b == TmaArgs(TMA_UINT16, (1024, 2048, 64), (2048, 4 << 20), (64, 64, 1), SWIZZLE_128B)  # (N, K, G)
    assert d.dims == (1024, 9216)  # encoded, unused: D is stored by rows
    assert struct.unpack_from("<Qiiiii", params, L.FIELDS) == (0, 9216, 1024, 2048, 0, L.GROUP_ROWS)
    assert struct.unpack_from("<QQii", params, LG.GROUPED_FIELDS) == (0xF000, 0xD000, 64, 1024)
    assert LG.GROUPED_FIELDS == 416
    assert LG.ragged_grid(p, 256) == (132, 1, 1)
    small = p._replace(m=100, groups=2, sm_count=132)
    assert LG.ragged_grid(small, 256) == ((1 + 2) * 4, 1, 1)  # at most ceil(T / 128) + G tile rows


def test_ragged_k_params():
    info = L.expected_info(256, False, False, grouped=2)
    recorder = Recorder()
    p = LG.RaggedProblem("K", 64, 2048, 1024, 9216, 2048, 1024, 0, 1024, 132)
    params = LG.pack_ragged(info, p, (0xA000, 0xB000, 0xD000, 0xF000), recorder)
    a, b, d = (args for _, args, _ in recorder.calls)
    assert a == TmaArgs(TMA_UINT16, (2048, 9216), (4096,), (64, 64), SWIZZLE_128B)  # A (M, T), M inner
    assert b == TmaArgs(TMA_UINT16, (1024, 9216), (2048,), (64, 64), SWIZZLE_128B)  # B (T, N), N inner
    assert d == TmaArgs(TMA_UINT16, (1024, 2048, 64), (2048, 2048 * 2048), (64, 64, 1), SWIZZLE_128B)
    assert struct.unpack_from("<QQii", params, LG.GROUPED_FIELDS) == (0xF000, 0, 64, 1024)
    assert LG.ragged_grid(p, 256) == (132, 1, 1)


def test_list_table_and_grid():
    info = L.expected_info(256, True, False, grouped=3)
    recorder = Recorder()
    groups = [LG.ListGroup(2048, 4096, 4096, 0xA0, 4096, 0xB0, 4096, 0xD0),
              LG.ListGroup(37, 64, 256, 0xA1, 256, 0xB1, 64, 0xD1)]
    table = LG.pack_table(info, groups, recorder)
    assert len(table) == 2 * LG.ENTRY_BYTES
    assert [(offset, address) for offset, _, address in recorder.calls] == [
        (0, 0xA0), (128, 0xB0), (256, 0xD0), (448, 0xA1), (576, 0xB1), (704, 0xD1)]
    assert recorder.calls[4][1] == TmaArgs(TMA_UINT16, (64, 256), (128,), (64, 64), SWIZZLE_128B)  # B MN-major
    assert struct.unpack_from("<iii", table, LG.ENTRY_BYTES + LG.ENTRY_SIZES) == (37, 64, 256)
    assert LG.list_grid(groups, 256, 132) == (132, 1, 1)
    assert LG.list_grid(groups[1:], 256, 132) == (1, 1, 1)


def test_bad_problems_are_refused():
    with pytest.raises(ValueError, match="multiples of 8"):
        LG.check_ragged(LG.RaggedProblem("M", 4, 100, 30, 64, 64, 30, 64 * 30, 30, 132), (0, 0, 0, 0))
    with pytest.raises(ValueError, match="empty problem"):
        LG.check_ragged(LG.RaggedProblem("K", 4, 64, 32, 0, 64, 32, 0, 32, 132), (0, 0, 0, 0))


class FakeDriver(FakeTmaDriver):
    def launch(self, function, grid, block, smem, stream, params_address):
        params = ctypes.cast(params_address, ctypes.POINTER(ctypes.c_void_p))[0]  # kernelParams: one pointer
        self.launches.append((grid, block, smem, stream, ctypes.string_at(params, 448)))


class FakeFunction:
    device_index = 0


@pytest.mark.parametrize("address_field", [16, None])
def test_repeated_ragged_problems_patch_only_addresses(address_field):
    driver = FakeDriver(address_field, Recorder())
    host = LG.LightGrouped(FakeFunction(), L.expected_info(256, True, False, grouped=1), driver)
    p = LG.RaggedProblem("M", 4, 300, 64, 64, 64, 64, 64 * 64, 64, 132)
    host.ragged(p, 0xA000, 0xB000, 0xD000, 0xF000, 7)
    host.ragged(p, 0xA000, 0xB000, 0xD000, 0xF000, 7)
    assert len(driver.encode_into.calls) == 3 and driver.shared == [info_smem(host)]
    host.ragged(p, 0xA100, 0xB000, 0xD100, 0xF100, 7)
    assert len(driver.encode_into.calls) == 3  # no new encode
    params = driver.launches[-1][4]
    assert struct.unpack_from("<QQ", params, LG.GROUPED_FIELDS) == (0xF100, 0xD100)
    if address_field is None:
        assert [address for _, address in driver.replaced] == [0xA100, 0xD100]
    else:
        assert struct.unpack_from("<Q", params, L.TMA_A + address_field)[0] == 0xA100
    assert driver.launches[-1][:4] == (((4 + 3) * 1, 1, 1), 384, info_smem(host), 7)


class ListFakeDriver(FakeDriver):
    def launch(self, function, grid, block, smem, stream, params_address):
        """Reads the table the Params point to while it is alive (the device copy is the call's)."""
        super().launch(function, grid, block, smem, stream, params_address)
        table, _, groups, _ = struct.unpack_from("<QQii", self.launches[-1][4], LG.GROUPED_FIELDS)
        self.launches[-1] += (ctypes.string_at(table, groups * LG.ENTRY_BYTES),)


def test_repeated_list_problems_patch_only_addresses():
    driver = ListFakeDriver(0, Recorder())  # the recorder writes the address where the patch does
    host = LG.LightGrouped(FakeFunction(), L.expected_info(256, True, False, grouped=3), driver)
    groups = [LG.ListGroup(2048, 4096, 4096, 0xA000, 4096, 0xB000, 4096, 0xD000),
              LG.ListGroup(37, 64, 256, 0xA100, 256, 0xB100, 64, 0xD100)]
    for _ in range(2):
        host.list(groups, torch.device("cpu"), 132, 7)
    assert len(driver.encode_into.calls) == 6
    host.list([groups[0], groups[1]._replace(a=0xA200, d=0xD200)], torch.device("cpu"), 132, 7)
    assert len(driver.encode_into.calls) == 6  # patched, not encoded again
    grid, block, _, stream, params, table = driver.launches[-1]
    assert grid == (132, 1, 1) and block == 384 and stream == 7
    entry = LG.ENTRY_BYTES
    assert [struct.unpack_from("<Q", table, entry + offset)[0] for offset in (LG.ENTRY_A, LG.ENTRY_B, LG.ENTRY_D)] \
        == [0xA200, 0xB100, 0xD200]
    assert struct.unpack_from("<iii", table, entry + LG.ENTRY_SIZES) == (37, 64, 256)
    with pytest.raises(ValueError, match="16-byte aligned"):
        host.list([groups[0]._replace(a=0xA300), groups[1]._replace(d=0xD308)], torch.device("cpu"), 132, 7)
    host.list(groups, torch.device("cpu"), 132, 7)  # the refused call left the table as it was
    assert struct.unpack_from("<Q", driver.launches[-1][5], LG.ENTRY_A)[0] == 0xA000


def info_smem(host):
    return host.info.smem


# ---- on a Hopper GPU -----------------------------------------------------------------------------------------------
def hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def offsets_of(sizes):
    return torch.tensor(sizes, dtype=torch.int64).cumsum(0).to("cuda", torch.int32)


def reference(a, b, sizes):
    """float64 on the CPU, from host sizes: ragged M (2-D a, 3-D b), K (2-D, 2-D) or N (3-D, 2-D)."""
    a, b = a.double().cpu(), b.double().cpu()
    bounds = torch.tensor([0] + list(sizes)).cumsum(0).tolist()
    if a.dim() == 2 and b.dim() == 3:
        return torch.cat([a[s:e] @ b[g] for g, (s, e) in enumerate(zip(bounds, bounds[1:]))])
    if a.dim() == 2:
        return torch.stack([a[:, s:e] @ b[s:e] for s, e in zip(bounds, bounds[1:])])
    return torch.cat([a[g] @ b[:, s:e] for g, (s, e) in enumerate(zip(bounds, bounds[1:]))], dim=1)


def error(got, want) -> float:
    got, want = got.double().cpu(), want.double().cpu()
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


# Groups that are empty, one row, on and off the 128-row tiles, and more than one tile row.
SIZES = [0, 1, 37, 128, 129, 0, 300, 64, 255, 2]


@pytest.mark.gpu
@pytest.mark.skipif(not hopper(), reason="needs a Hopper GPU (sm_90a)")
@pytest.mark.parametrize("dtype", [BF16, FP16])
@pytest.mark.parametrize("k,n", [(256, 1024), (72, 200), (2048, 136)])
@pytest.mark.parametrize("b_kmajor", [False, True])
def test_ragged_m_matches_float64(dtype, k, n, b_kmajor):
    g = torch.Generator().manual_seed(k + n)
    x = torch.randn(sum(SIZES), k, generator=g).to("cuda", dtype)
    w = (torch.randn(len(SIZES), k, n, generator=g) / k ** 0.5).to("cuda", dtype)
    if b_kmajor:
        w = w.mT.contiguous().mT
    cls = gg.ragged_shape_class(x, w, offsets_of(SIZES))
    assert gg_plan.is_light(cls.kernel.config) and cls.kernel.b_row != b_kmajor and cls.copy_b is None
    out = jitops.grouped_gemm(x, w, offsets=offsets_of(SIZES))
    assert error(out, reference(x, w, SIZES)) < 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not hopper(), reason="needs a Hopper GPU (sm_90a)")
@pytest.mark.parametrize("dtype", [BF16, FP16])
def test_ragged_k_matches_float64_and_ignores_its_neighbours(dtype):
    g = torch.Generator().manual_seed(3)
    m, n = 192, 264
    x = torch.randn(sum(SIZES), m, generator=g).to("cuda", dtype)
    dy = torch.randn(sum(SIZES), n, generator=g).to("cuda", dtype)
    dw = jitops.grouped_gemm(x.mT, dy, offsets=offsets_of(SIZES))
    assert dw.shape == (len(SIZES), m, n)
    assert error(dw, reference(x.mT, dy, SIZES)) < 1e-2
    assert torch.equal(dw[0], torch.zeros_like(dw[0])) and torch.equal(dw[5], torch.zeros_like(dw[5]))
    # Rows of the next group inside a group's last k-block are zeroed, not multiplied: infinities there stay out.
    ends = torch.tensor(SIZES).cumsum(0).tolist()
    poisoned_x, poisoned_dy = x.clone(), dy.clone()
    poisoned_x[ends[2]:ends[3]] = float("inf")   # group 3 (128 rows) follows group 2 (37 rows)
    poisoned_dy[ends[2]:ends[3]] = float("nan")
    dw2 = jitops.grouped_gemm(poisoned_x.mT, poisoned_dy, offsets=offsets_of(SIZES))
    assert torch.equal(dw2[2], dw[2]) and torch.equal(dw2[1], dw[1])


@pytest.mark.gpu
@pytest.mark.skipif(not hopper(), reason="needs a Hopper GPU (sm_90a)")
def test_ragged_n_and_training_match_float64():
    g = torch.Generator().manual_seed(4)
    k, n = 128, 512
    x = torch.randn(sum(SIZES), k, generator=g).to("cuda", BF16).requires_grad_()
    w = (torch.randn(len(SIZES), k, n, generator=g) / k ** 0.5).to("cuda", BF16).requires_grad_()
    y = jitops.grouped_gemm(x, w, offsets=offsets_of(SIZES))
    grad = torch.randn_like(y)
    y.backward(grad)
    x64, w64 = x.detach().double().cpu().requires_grad_(), w.detach().double().cpu().requires_grad_()
    reference(x64, w64, SIZES).backward(grad.double().cpu())
    assert error(x.grad, x64.grad) < 1e-2 and error(w.grad, w64.grad) < 1e-2
    a3 = torch.randn(len(SIZES), 64, k, generator=g).to("cuda", BF16)
    b2 = torch.randn(k, sum(SIZES), generator=g).to("cuda", BF16)
    assert error(jitops.grouped_gemm(a3, b2, offsets=offsets_of(SIZES)), reference(a3, b2, SIZES)) < 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not hopper(), reason="needs a Hopper GPU (sm_90a)")
@pytest.mark.parametrize("a_t,b_t", [(False, False), (False, True), (True, False), (True, True)])
def test_list_matches_float64_in_every_layout(a_t, b_t):
    g = torch.Generator().manual_seed(5)
    dims = [(300, 136, 520), (1, 64, 8), (128, 1000, 256), (129, 72, 64)]
    As = [torch.randn(m, k, generator=g).to("cuda", BF16) for m, k, _ in dims]
    Bs = [(torch.randn(k, n, generator=g) / k ** 0.5).to("cuda", BF16) for _, k, n in dims]
    As = [a.mT.contiguous().mT for a in As] if a_t else As
    Bs = [b.mT.contiguous().mT for b in Bs] if b_t else Bs
    cls = gg.list_shape_class(As, Bs)
    assert gg_plan.is_light(cls.kernel.config)
    assert any(cls.copy_a) == a_t and not any(cls.copy_b)  # a column-major A with M = 300 or 129 is copied
    for a, b, out in zip(As, Bs, jitops.grouped_gemm(As, Bs)):
        assert error(out, a.double().cpu() @ b.double().cpu()) < 1e-2
    # new tensors of the same sizes: the table is patched, not re-encoded
    As2 = [a * 2 for a in As]
    for a, b, out in zip(As2, Bs, jitops.grouped_gemm(As2, Bs)):
        assert error(out, a.double().cpu() @ b.double().cpu()) < 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not hopper(), reason="needs a Hopper GPU (sm_90a)")
def test_light_and_cutlass_kernels_agree(monkeypatch):
    g = torch.Generator().manual_seed(6)
    sizes = torch.randint(32, 257, (64,), generator=g).tolist()
    x = torch.randn(sum(sizes), 512, generator=g).to("cuda", BF16)
    w = (torch.randn(64, 512, 256, generator=g) / 512 ** 0.5).to("cuda", BF16)
    light = jitops.grouped_gemm(x, w, offsets=offsets_of(sizes))
    monkeypatch.setenv("JITOPS_GROUPED_GEMM_SM90_KERNEL", "cutlass")
    cutlass = jitops.grouped_gemm(x, w, offsets=offsets_of(sizes))
    assert error(light, cutlass) < 2e-3
    assert error(light, reference(x, w, sizes)) < 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not hopper(), reason="needs a Hopper GPU (sm_90a)")
def test_offsets_out_of_range_are_clamped_not_followed():
    x = torch.randn(300, 64, device="cuda", dtype=BF16)
    w = torch.randn(3, 64, 32, device="cuda", dtype=BF16)
    bad = torch.tensor([200, 100, 10 ** 6], device="cuda", dtype=torch.int32)  # decreasing, then past T
    out = jitops.grouped_gemm(x, w, offsets=bad)
    torch.cuda.synchronize()  # an access out of bounds would fault here
    assert out.shape == (300, 32)
    assert error(out[:200], x[:200].double().cpu() @ w[0].double().cpu()) < 1e-2  # group 0 is the clamp's first
    dw = jitops.grouped_gemm(x.mT, torch.randn(300, 32, device="cuda", dtype=BF16), offsets=bad)
    torch.cuda.synchronize()
    assert torch.equal(dw[1], torch.zeros_like(dw[1]))  # clamped to an empty range


@pytest.mark.gpu
@pytest.mark.skipif(not hopper(), reason="needs a Hopper GPU (sm_90a)")
def test_ragged_form_is_captured_in_a_cuda_graph():
    x = torch.randn(sum(SIZES), 128, device="cuda", dtype=BF16)
    w = torch.randn(len(SIZES), 128, 256, device="cuda", dtype=BF16)
    offsets = offsets_of(SIZES)
    eager = jitops.grouped_gemm(x, w, offsets=offsets)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        jitops.grouped_gemm(x, w, offsets=offsets)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = jitops.grouped_gemm(x, w, offsets=offsets)
    x.mul_(2)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, jitops.grouped_gemm(x, w, offsets=offsets))
    assert error(captured, eager * 2) < 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not hopper(), reason="needs a Hopper GPU (sm_90a)")
def test_list_form_is_captured_in_a_cuda_graph():
    """The list form copies its table from pinned memory on every replay: that buffer is kept for the graph."""
    As = [torch.randn(m, 128, device="cuda", dtype=BF16) for m in (300, 64)]
    Bs = [torch.randn(128, 256, device="cuda", dtype=BF16) for _ in As]
    eager = jitops.grouped_gemm(As, Bs)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        jitops.grouped_gemm(As, Bs)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = jitops.grouped_gemm(As, Bs)
    for _ in range(3):  # other list calls take pinned buffers in between
        jitops.grouped_gemm([a[:64] for a in As], Bs)
    for a in As:
        a.mul_(2)
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(captured, eager):
        assert error(got, want * 2) < 1e-2

