"""jitops.grouped_gemm without a GPU: the CPU path (ATen) against a float64 reference with gradients for every
input and list element, gradcheck, opcheck and torch.compile; ragged edge cases; bad inputs; the kernel class
each call picks (layouts from strides) on meta tensors; and nvcc building one sm_90a kernel here.

Set JITOPS_TEST_GROUPED_SWEEP=1 to build every kernel configuration (about a minute each on 2 cores)."""
from __future__ import annotations

import ctypes
import importlib
import os

import pytest
import torch

import jitops
from jitops.backends import toolkit
from jitops.runtime import runtime
from jitops.specs import Target, kernels_root
from jitops.testing import check_op

DTYPES = [torch.float32, torch.float64]
SM90 = Target.parse("sm_90a")
from jitops.ops import grouped_gemm as gg
from jitops.ops import grouped_gemm_plan as gg_plan
from jitops.ops import grouped_gemm_run as gg_run


# ---- references ------------------------------------------------------------------------------------------------
def ragged_reference(a, b, offsets):
    """Float64 reference of the three ragged cases, from host offsets."""
    ends = [int(v) for v in offsets]
    starts = [0] + ends[:-1]
    if a.dim() == 2 and b.dim() == 3:
        return torch.cat([a[s:e] @ b[g] for g, (s, e) in enumerate(zip(starts, ends))] +
                         [a.new_zeros((0, b.shape[2]))])
    if a.dim() == 2 and b.dim() == 2:
        return torch.stack([a[:, s:e] @ b[s:e] for s, e in zip(starts, ends)]) if ends else \
            a.new_zeros((0, a.shape[0], b.shape[1]))
    return torch.cat([a[g] @ b[:, s:e] for g, (s, e) in enumerate(zip(starts, ends))] +
                     [a.new_zeros((a.shape[1], 0))], dim=1)


def list_reference(As, Bs):
    return [a @ b for a, b in zip(As, Bs)]


def offsets_of(sizes):
    return torch.tensor(sizes, dtype=torch.int64).cumsum(0).to(torch.int32)


# Ragged group sizes: an empty group (M_g = 0), one group, sizes that are not multiples of any tile.
SIZES = [[3, 0, 7, 1], [5], [0, 0, 4], [2, 9]]


def ragged_samples(mode):
    def samples(dtype, device):
        g = torch.Generator().manual_seed(7)
        out = []
        for sizes in SIZES:
            total, groups = sum(sizes), len(sizes)
            k, m, n = 6, 5, 4
            if mode == "M":
                a, b = torch.randn(total, k, generator=g), torch.randn(groups, k, n, generator=g)
            elif mode == "K":
                a, b = torch.randn(m, total, generator=g), torch.randn(total, n, generator=g)
            else:
                a, b = torch.randn(groups, m, k, generator=g), torch.randn(k, total, generator=g)
            out.append((a.to(device, dtype), b.to(device, dtype), offsets_of(sizes).to(device)))
        return out
    return samples


def list_samples(dtype, device):
    g = torch.Generator().manual_seed(3)
    dims = [[(4, 5, 3), (1, 7, 2), (6, 2, 8)], [(3, 4, 5)], [(0, 3, 2), (2, 0, 3), (3, 2, 0), (2, 2, 2)]]
    return [([torch.randn(m, k, generator=g).to(device, dtype) for m, k, _ in case],
             [torch.randn(k, n, generator=g).to(device, dtype) for _, k, n in case]) for case in dims]


# ---- CPU path against the reference, gradients, gradcheck, opcheck, torch.compile ---------------------------
@pytest.mark.parametrize("mode", ["M", "K", "N"])
def test_ragged_cpu_matches_reference_with_gradients(mode):
    report = check_op(jitops.grouped_gemm, ragged_reference, samples=ragged_samples(mode), dtypes=DTYPES,
                      device="cpu", opcheck=False, compile=True)
    assert len(report.checked) >= 2 * 2 * len(SIZES)


@pytest.mark.parametrize("mode", ["M", "K", "N"])
def test_ragged_opcheck(mode):
    for a, b, offsets in ragged_samples(mode)(torch.float64, "cpu"):
        torch.library.opcheck(gg.grouped_gemm_ragged.op.overload, (a.requires_grad_(), b.requires_grad_(),
                                                                   offsets))


def test_list_cpu_matches_reference_with_gradients():
    check_op(jitops.grouped_gemm, list_reference, samples=list_samples, dtypes=DTYPES, device="cpu",
             opcheck=False, compile=True, gradcheck=False)  # gradcheck does not look inside lists: below


def test_list_gradcheck_every_element():
    for As, Bs in list_samples(torch.float64, "cpu"):
        groups = len(As)

        def flat(*tensors):
            return tuple(jitops.grouped_gemm(list(tensors[:groups]), list(tensors[groups:])))

        inputs = tuple(t.requires_grad_() for t in (*As, *Bs))
        assert torch.autograd.gradcheck(flat, inputs)


def test_list_opcheck():
    for As, Bs in list_samples(torch.float64, "cpu"):
        torch.library.opcheck(gg.grouped_gemm_list.op.overload,
                              ([a.requires_grad_() for a in As], [b.requires_grad_() for b in Bs]))


def test_sizes_and_offsets_agree_and_int64_offsets_work():
    x, w = torch.randn(10, 4, dtype=torch.float64), torch.randn(3, 4, 2, dtype=torch.float64)
    by_sizes = jitops.grouped_gemm(x, w, sizes=[3, 0, 7])
    by_list = jitops.grouped_gemm(x, w, offsets=[3, 3, 10])
    by_tensor = jitops.grouped_gemm(x, w, offsets=torch.tensor([3, 3, 10]))
    by_size_tensor = jitops.grouped_gemm(x, w, sizes=torch.tensor([3, 0, 7], dtype=torch.int32))
    expected = ragged_reference(x, w, [3, 3, 10])
    for got in (by_sizes, by_list, by_tensor, by_size_tensor):
        torch.testing.assert_close(got, expected)


def test_ragged_second_order_gradients():
    """Each case's gradients are the other cases, so double backward works too."""
    a = torch.randn(9, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, 4, 5, dtype=torch.float64, requires_grad=True)
    offsets = offsets_of([2, 0, 7])
    assert torch.autograd.gradgradcheck(lambda x, y: jitops.grouped_gemm(x, y, offsets=offsets), (a, b))


def test_list_second_order_gradients():
    As = [torch.randn(3, 4, dtype=torch.float64, requires_grad=True), torch.randn(2, 3, dtype=torch.float64,
                                                                                   requires_grad=True)]
    Bs = [torch.randn(4, 2, dtype=torch.float64, requires_grad=True), torch.randn(3, 5, dtype=torch.float64,
                                                                                   requires_grad=True)]
    assert torch.autograd.gradgradcheck(lambda a0, a1, b0, b1: tuple(jitops.grouped_gemm([a0, a1], [b0, b1])),
                                        (*As, *Bs))


# ---- autograd wiring: grad_fn on every output, only the needed gradients ---------------------------------------
def test_every_list_output_has_a_grad_fn_when_any_input_requires_grad():
    As = [torch.randn(3, 4), torch.randn(2, 4)]
    Bs = [torch.randn(4, 5), torch.randn(4, 6, requires_grad=True)]
    outs = jitops.grouped_gemm(As, Bs)
    assert all(o.grad_fn is not None and o.requires_grad for o in outs)
    sum(o.sum() for o in outs).backward()
    assert Bs[1].grad is not None and Bs[0].grad is None and As[0].grad is None
    torch.testing.assert_close(Bs[1].grad, As[1].sum(0)[:, None].expand(4, 6))


def test_ragged_output_has_a_grad_fn():
    x = torch.randn(6, 4)
    w = torch.randn(2, 4, 3, requires_grad=True)
    y = jitops.grouped_gemm(x, w, sizes=[2, 4])
    assert y.grad_fn is not None
    with torch.no_grad():
        assert jitops.grouped_gemm(x, w, sizes=[2, 4]).grad_fn is None


@pytest.mark.parametrize("needs", [(True, False), (False, True), (True, True)])
def test_ragged_backward_computes_only_needed_gradients(monkeypatch, needs):
    calls = []
    real = gg.grouped_gemm_ragged

    def spy(a, b, offsets):
        calls.append((tuple(a.shape), tuple(b.shape)))
        return real(a, b, offsets)

    x = torch.randn(7, 4, dtype=torch.float64, requires_grad=needs[0])
    w = torch.randn(2, 4, 3, dtype=torch.float64, requires_grad=needs[1])
    y = jitops.grouped_gemm(x, w, sizes=[3, 4])
    monkeypatch.setattr(gg, "grouped_gemm_ragged", spy)
    y.sum().backward()
    assert len(calls) == sum(needs)
    assert (x.grad is not None) == needs[0] and (w.grad is not None) == needs[1]
    if needs[1]:  # dW: a reduction over each group's rows (ragged K)
        assert ((4, 7), (7, 3)) in calls


def test_list_backward_computes_only_needed_elements(monkeypatch):
    calls = []
    real = gg.grouped_gemm_list

    def spy(As, Bs):
        calls.append(len(As))
        return real(As, Bs)

    As = [torch.randn(3, 4, requires_grad=True), torch.randn(2, 4), torch.randn(5, 4, requires_grad=True)]
    Bs = [torch.randn(4, 2) for _ in range(3)]
    outs = jitops.grouped_gemm(As, Bs)
    monkeypatch.setattr(gg, "grouped_gemm_list", spy)
    sum(o.sum() for o in outs).backward()
    assert calls == [2]  # one launch for dA of the two elements that need it; no dB launch
    assert As[1].grad is None and all(b.grad is None for b in Bs)


def test_unused_list_outputs_get_no_gradient_work():
    As = [torch.randn(3, 4, requires_grad=True), torch.randn(2, 4, requires_grad=True)]
    Bs = [torch.randn(4, 2), torch.randn(4, 3)]
    outs = jitops.grouped_gemm(As, Bs)
    outs[1].sum().backward()
    assert As[1].grad is not None
    assert As[0].grad is None or not As[0].grad.any()


# ---- ragged edge cases ---------------------------------------------------------------------------------------
def test_no_groups_and_empty_operands():
    x, w = torch.randn(0, 4), torch.randn(0, 4, 3)
    assert jitops.grouped_gemm(x, w, sizes=[]).shape == (0, 3)
    y = jitops.grouped_gemm(torch.randn(5, 0), torch.randn(2, 0, 3), sizes=[2, 3])  # K = 0: zeros
    assert y.shape == (5, 3) and not y.any()
    dw = jitops.grouped_gemm(torch.randn(4, 0), torch.randn(0, 3), sizes=[0, 0])  # every group empty
    assert dw.shape == (2, 4, 3) and not dw.any()


def test_empty_group_gets_zero_weight_gradient():
    x = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 3, 2, dtype=torch.float64, requires_grad=True)
    jitops.grouped_gemm(x, w, sizes=[2, 0, 3]).sum().backward()
    assert not w.grad[1].any() and w.grad[0].any() and w.grad[2].any()


def test_ragged_n_output_is_a_transposed_view():
    a, b = torch.randn(2, 3, 4), torch.randn(4, 7)
    y = jitops.grouped_gemm(a, b, sizes=[3, 4])
    assert y.shape == (3, 7) and y.stride() == (1, 3)
    torch.testing.assert_close(y, ragged_reference(a, b, [3, 7]))


# ---- bad inputs: clear errors naming the argument ---------------------------------------------------------
def test_k_mismatch_names_the_argument():
    with pytest.raises(ValueError, match=r"'b'.*K"):
        jitops.grouped_gemm(torch.randn(6, 4), torch.randn(2, 5, 3), sizes=[2, 4])
    with pytest.raises(ValueError, match=r"'Bs\[1\]'.*K"):
        jitops.grouped_gemm([torch.randn(2, 3), torch.randn(2, 3)], [torch.randn(3, 2), torch.randn(4, 2)])


def test_mixed_dtypes_name_the_argument():
    with pytest.raises(TypeError, match=r"'b' has dtype float64"):
        jitops.grouped_gemm(torch.randn(6, 4), torch.randn(2, 4, 3, dtype=torch.float64), sizes=[2, 4])
    with pytest.raises(TypeError, match=r"'Bs\[0\]' has dtype float64"):
        jitops.grouped_gemm([torch.randn(2, 3)], [torch.randn(3, 2, dtype=torch.float64)])


def test_wrong_device_names_the_argument():
    with pytest.raises(ValueError, match=r"'b' is on meta"):
        jitops.grouped_gemm(torch.randn(6, 4), torch.randn(2, 4, 3, device="meta"), sizes=[2, 4])
    with pytest.raises(ValueError, match=r"'Bs\[1\]' is on meta"):
        jitops.grouped_gemm([torch.randn(2, 3)] * 2, [torch.randn(3, 2), torch.randn(3, 2, device="meta")])


def test_unsupported_dtype_names_the_argument():
    with pytest.raises(TypeError, match=r"'a' has dtype int32"):
        jitops.grouped_gemm(torch.ones(6, 4, dtype=torch.int32), torch.ones(2, 4, 3, dtype=torch.int32),
                            sizes=[2, 4])
    with pytest.raises(TypeError, match=r"'As\[0\]' has dtype complex64"):
        jitops.grouped_gemm([torch.ones(2, 3, dtype=torch.complex64)], [torch.ones(3, 2, dtype=torch.complex64)])
    with pytest.raises(TypeError, match=r"'offsets' has dtype float32"):
        jitops.grouped_gemm(torch.randn(6, 4), torch.randn(2, 4, 3), offsets=torch.tensor([2.0, 6.0]))


def test_offsets_that_do_not_add_up_are_rejected():
    x, w = torch.randn(6, 4), torch.randn(2, 4, 3)
    with pytest.raises(ValueError, match=r"'offsets' does not add up.*end at 5.*6"):
        jitops.grouped_gemm(x, w, offsets=torch.tensor([2, 5]))
    with pytest.raises(ValueError, match=r"'sizes' does not add up"):
        jitops.grouped_gemm(x, w, sizes=[2, 3])
    with pytest.raises(ValueError, match=r"'offsets' decreases at group 1"):
        jitops.grouped_gemm(x, w, offsets=[4, 2])
    with pytest.raises(ValueError, match=r"'offsets' has shape \(3,\); expected \(2,\)"):
        jitops.grouped_gemm(x, w, offsets=[2, 4, 6])
    with pytest.raises(ValueError, match=r"'sizes' has a negative"):
        jitops.grouped_gemm(x, w, sizes=[8, -2])
    with pytest.raises(TypeError, match="exactly one of 'offsets'"):
        jitops.grouped_gemm(x, w)
    with pytest.raises(TypeError, match="exactly one of 'offsets'"):
        jitops.grouped_gemm(x, w, offsets=[2, 6], sizes=[2, 4])


def test_list_length_mismatch_and_bad_ranks():
    with pytest.raises(ValueError, match="'As' and 'Bs' have 2 and 1"):
        jitops.grouped_gemm([torch.randn(2, 3)] * 2, [torch.randn(3, 2)])
    with pytest.raises(ValueError, match=r"'As\[0\]' has shape \(2, 3, 1\)"):
        jitops.grouped_gemm([torch.randn(2, 3, 1)], [torch.randn(3, 2)])
    with pytest.raises(ValueError, match="ragged form takes"):
        jitops.grouped_gemm(torch.randn(2, 3, 4), torch.randn(2, 4, 5), sizes=[1, 1])


# ---- kernel classes: layouts from strides, on meta tensors (what a GPU call would compile) ---------------------
def meta(shape, stride=None, dtype=torch.bfloat16):
    return torch.empty_strided(shape, stride, dtype=dtype, device="meta") if stride else \
        torch.empty(shape, dtype=dtype, device="meta")


@pytest.fixture
def cutlass_kernels(monkeypatch):
    """The CUTLASS grouped kernel's route (JITOPS_GROUPED_GEMM_SM90_KERNEL=cutlass; the light kernel is the
    default: tests/test_light_grouped.py)."""
    monkeypatch.setenv("JITOPS_GROUPED_GEMM_SM90_KERNEL", "cutlass")


def test_moe_forward_and_gradients_use_three_layouts_of_the_same_kernel(cutlass_kernels):
    x, w, offsets = meta((9216, 2048)), meta((64, 2048, 1024)), meta((64,), dtype=torch.int32)
    dy = meta((9216, 1024))
    forward = gg.ragged_shape_class(x, w, offsets).kernel
    dx = gg.ragged_shape_class(dy, w.mT, offsets)
    dw = gg.ragged_shape_class(x.mT, dy, offsets)
    assert forward == gg_plan.GemmKernelClass(torch.bfloat16, True, True, gg_plan.DEFAULT)
    assert dx.kernel == gg_plan.GemmKernelClass(torch.bfloat16, True, False, gg_plan.DEFAULT) and dx.copy_b is None
    assert dw.mode == "K" and dw.kernel == gg_plan.GemmKernelClass(torch.bfloat16, False, True, gg_plan.DEFAULT)
    assert dw.copy_a is None and dw.copy_b is None  # no transposed copies in the backward


def test_list_layouts_from_strides(cutlass_kernels):
    As, Bs = [meta((2048, 4096))] * 8, [meta((4096, 4096))] * 8
    forward = gg.list_shape_class(As, Bs)
    assert forward.kernel == gg_plan.GemmKernelClass(torch.bfloat16, True, True, gg_plan.DEFAULT)
    assert not any(forward.copy_a + forward.copy_b)
    dc = [meta((2048, 4096))] * 8
    assert gg.list_shape_class(dc, [b.mT for b in Bs]).kernel.b_row is False
    db = gg.list_shape_class([a.mT for a in As], dc)
    assert db.kernel.a_row is False and not any(db.copy_a + db.copy_b)


def test_unreadable_layouts_are_copied_and_misaligned_sizes_fall_back_to_aten():
    x, w, offsets = meta((100, 64)), meta((4, 64, 32)), meta((4,), dtype=torch.int32)
    assert gg.ragged_shape_class(x.mT.contiguous().mT, w, offsets).copy_a == gg_plan.ROW  # ragged dim contiguous
    strided = meta((100, 64), (128, 2))  # neither dimension contiguous
    assert gg.ragged_shape_class(strided, w, offsets).copy_a == gg_plan.ROW
    assert gg.ragged_shape_class(meta((100, 60)), meta((4, 60, 32)), offsets).kernel.config == gg_plan.ATEN  # K % 8
    assert gg.ragged_shape_class(meta((100, 64)), meta((4, 64, 30)), offsets).kernel.config == gg_plan.ATEN  # N % 8
    # Expanded gradients (stride 0) are copied.
    expanded = meta((100, 32), (0, 0))
    assert gg.ragged_shape_class(expanded, w.mT.contiguous().mT.mT, offsets).copy_a == gg_plan.ROW


def test_no_kernel_for_empty_problems_or_non_hopper_targets(cutlass_kernels):
    empty = gg.ragged_shape_class(meta((0, 64)), meta((4, 64, 32)), meta((4,), dtype=torch.int32))
    assert empty.kernel.config == gg_plan.NOTHING and gg._kernels(empty, SM90) == {}
    cls = gg.ragged_shape_class(meta((100, 64)), meta((4, 64, 32)), meta((4,), dtype=torch.int32))
    assert gg._kernels(cls, Target.parse("sm_80")) == {}
    request = gg._kernels(cls, SM90)["gemm"]
    assert request.arch(SM90) == "sm_90a"
    assert dict(request.defines) == {"JG_A_ROW": "1", "JG_B_ROW": "1", "JG_CONFIG": gg_plan.DEFAULT,
                                     "JG_ELEMENT": "cutlass::bfloat16_t"}


def test_prewarm_manifest_names_the_forward_and_both_gradient_kernels(cutlass_kernels):
    classes = set()
    public = jitops.find_public("grouped_gemm")
    for item in gg.PREWARM:
        for call, shapes in enumerate(item["shapes"]):
            strides = item["strides"][call] if "strides" in item else None
            entry, shapes, kwargs = public.form(shapes, item["kwargs"])
            args = entry.example_args(item["dtypes"][0], shapes, kwargs, strides)
            classes |= {op.shape_class(*a).kernel for op, a in public.calls(entry, args)}
    layouts = {(c.a_row, c.b_row, c.config) for c in classes}
    assert layouts == {(True, True, gg_plan.DEFAULT), (True, False, gg_plan.DEFAULT), (False, True, gg_plan.DEFAULT)}


def test_backward_kernels_are_requested_in_the_background(monkeypatch, cutlass_kernels):
    op_module = importlib.import_module("jitops.op")  # (jitops.op is also the declaring function)

    requested = []
    monkeypatch.setattr(op_module.runtime, "get_kernel", lambda request, *args: requested.append(request))
    monkeypatch.setattr(op_module, "ensure_context", lambda index: None)  # no GPU here
    monkeypatch.setattr(op_module, "_PREFETCHED", set())
    monkeypatch.setitem(gg.grouped_gemm_ragged.op._targets, 0, SM90)
    x = meta((9216, 2048)).requires_grad_()
    w = meta((64, 2048, 1024)).requires_grad_()
    threads = gg.grouped_gemm_ragged.op.prefetch(x, w, meta((64,), dtype=torch.int32))
    for thread in threads:
        thread.join()
    assert {(dict(r.defines)["JG_A_ROW"], dict(r.defines)["JG_B_ROW"]) for r in requested} == {("1", "0"),
                                                                                               ("0", "1")}
    assert not gg.grouped_gemm_ragged.op.prefetch(x, w, meta((64,), dtype=torch.int32))  # once per class


# ---- nvcc builds an sm_90a kernel here (no GPU) ------------------------------------------------------------------
def _build(fresh_cache, kernel_class):
    request = gg._kernels(gg_plan.RaggedClass("M", kernel_class, None, None), SM90)["gemm"]
    assert runtime.prewarm(request, SM90) == "compiled"
    key, _ = runtime.key_for(request, SM90)
    entry = runtime.find_entry(key, any_toolchain=False)
    library = ctypes.CDLL(str(entry.path / "kernel.so"))  # loads without a GPU: cudart is linked statically
    library.jg_workspace_bytes.restype = ctypes.c_int64
    assert library.jg_workspace_bytes(64, 132) > 64 * 48
    library.jg_error_string.restype = ctypes.c_char_p
    assert library.jg_error_string(0) == b"success"
    return entry


@pytest.mark.skipif(toolkit.nvcc_path() is None, reason="needs nvcc")
def test_nvcc_builds_the_moe_forward_kernel_for_sm90a(fresh_cache):
    entry = _build(fresh_cache, gg_plan.GemmKernelClass(torch.bfloat16, True, True, gg_plan.DEFAULT))
    assert entry.meta["compile_seconds"] > 0


SWEEP = [gg_plan.GemmKernelClass(dtype, a_row, b_row, config) for dtype in gg.CUDA_DTYPES for config in gg_plan.CONFIGS
         for a_row in (True, False) for b_row in (True, False)]


@pytest.mark.skipif(not os.environ.get("JITOPS_TEST_GROUPED_SWEEP"), reason="set JITOPS_TEST_GROUPED_SWEEP=1")
@pytest.mark.parametrize("kernel_class", SWEEP, ids=lambda c: f"{gg.ELEMENTS[c.dtype][9:]}-{int(c.a_row)}"
                         f"{int(c.b_row)}-{c.config}")
def test_nvcc_builds_every_configuration(fresh_cache, kernel_class):
    _build(fresh_cache, kernel_class)


def test_every_tile_configuration_is_a_struct_in_the_kernel_source():
    source = (kernels_root() / "grouped_gemm" / "grouped_gemm.cu").read_text()
    for config in gg_plan.CONFIGS:
        assert f"struct {config} :" in source
        tile_m, tile_n, cluster_m, cluster_n = gg_plan._tiling(config)
        assert f"Shape<_{tile_m}, _{tile_n}, _64>" in source and cluster_m * cluster_n in (1, 2)


# ---- what the CUDA path passes to the library (a fake one: no GPU) ---------------------------------------------
class FakeLibrary:
    def __init__(self):
        self.calls = []

    def jg_run_ragged(self, *args):
        self.calls.append(("ragged", args))
        return 0

    def jg_run_list(self, *args):
        self.calls.append(("list", args))
        return 0


@pytest.fixture
def fake_cuda(monkeypatch, cutlass_kernels):
    monkeypatch.setattr(gg_run, "_workspace", lambda lib, groups, device: (torch.empty(0), 4096))
    monkeypatch.setattr(gg_run, "sm_count", lambda device: 132)
    monkeypatch.setattr(gg_run, "current_stream", lambda device: 7)
    library = FakeLibrary()

    def run(runner, shape_class, *args):
        import types
        return runner(types.SimpleNamespace(shape_class=shape_class, gemm=library), *args), library.calls
    return run


RAGGED_ARGS = ("mode", "groups", "offsets", "total", "m", "n", "k", "a", "a_step", "a_ld", "b", "b_step", "b_ld",
               "d", "d_step", "d_ld", "workspace", "workspace_bytes", "sm_count", "fill", "raster", "swizzle",
               "stream")


def test_moe_forward_and_gradients_pass_strides_not_copies(fake_cuda):
    T, G, K, N = 300, 4, 64, 32
    x, w = torch.randn(T, K, dtype=torch.bfloat16), torch.randn(G, K, N, dtype=torch.bfloat16)
    dy = torch.randn(T, N, dtype=torch.bfloat16)
    offsets = offsets_of([100, 0, 150, 50])
    for a, b, expected in (
            (x, w, {"mode": 0, "total": T, "n": N, "k": K, "a_step": K, "a_ld": K, "b_step": K * N, "b_ld": N,
                    "d_step": N, "d_ld": N, "raster": 0, "swizzle": 1}),
            (dy, w.mT, {"mode": 0, "n": K, "k": N, "a_ld": N, "b_step": K * N, "b_ld": N, "d_ld": K}),
            (x.mT, dy, {"mode": 1, "total": T, "m": K, "n": N, "a_step": K, "a_ld": K, "b_step": N, "b_ld": N,
                        "d_step": K * N, "d_ld": N})):
        cls = gg.ragged_shape_class(*(meta(t.shape, t.stride()) for t in (a, b)), meta((G,), dtype=torch.int32))
        assert cls.copy_a is None and cls.copy_b is None
        out, calls = fake_cuda(gg_run.run_ragged_cuda, cls, a, b, offsets)
        args = dict(zip(RAGGED_ARGS, calls[-1][1]))
        assert {key: args[key] for key in expected} == expected
        assert args["a"].data_ptr() == a.data_ptr() and args["b"].data_ptr() == b.data_ptr()  # no copies
        assert args["groups"] == G and args["offsets"].dtype == torch.int32 and args["stream"] == 7
        assert out.shape == ragged_reference(a.double(), b.double(), offsets).shape


def test_ragged_n_runs_as_ragged_m_on_the_transposes(fake_cuda):
    a, b = torch.randn(3, 16, 8, dtype=torch.bfloat16), torch.randn(8, 40, dtype=torch.bfloat16)
    cls = gg.ragged_shape_class(meta(a.shape), meta(b.shape), meta((3,), dtype=torch.int32))
    out, calls = fake_cuda(gg_run.run_ragged_cuda, cls, a, b, offsets_of([10, 20, 10]))
    args = dict(zip(RAGGED_ARGS, calls[-1][1]))
    assert args["mode"] == 0 and args["n"] == 16 and args["k"] == 8 and args["total"] == 40
    assert out.shape == (16, 40) and out.stride() == (1, 16) and args["d"].data_ptr() == out.data_ptr()


def test_list_rows_and_tile_order(fake_cuda):
    As = [torch.randn(2048, 64, dtype=torch.bfloat16) for _ in range(2)]
    Bs = [torch.randn(64, 1024, dtype=torch.bfloat16) for _ in range(2)]
    cls = gg.list_shape_class([meta(t.shape) for t in As], [meta(t.shape) for t in Bs])
    outs, calls = fake_cuda(gg_run.run_list_cuda, cls, As, Bs)
    groups, rows, host, _, _, _, raster, swizzle, stream = calls[-1][1]
    assert groups == 2 and (raster, swizzle) == (0, gg_plan.LIST_SWIZZLE)  # 16 x 4 tiles per group: nothing padded
    assert rows.view(2, 9)[0, :3].tolist() == [2048, 1024, 64]
    assert rows.view(2, 9)[1].tolist() == [2048, 1024, 64, As[1].data_ptr(), 64, Bs[1].data_ptr(), 1024,
                                           outs[1].data_ptr(), 1024]
    small = [torch.randn(100, 64, dtype=torch.bfloat16)], [torch.randn(64, 32, dtype=torch.bfloat16)]
    cls = gg.list_shape_class([meta(t.shape) for t in small[0]], [meta(t.shape) for t in small[1]])
    _, calls = fake_cuda(gg_run.run_list_cuda, cls, *small)
    assert calls[-1][1][6:8] == (0, 1)  # swizzling would pad this group's tiles
