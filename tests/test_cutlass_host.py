"""jitops/cutlass_host.py against CUTLASS's own host code, on the CPU.

tests/cutlass_host/sm90_gemm_fixtures.json holds what CUTLASS's `to_underlying_arguments` and `get_grid_shape`
produced for 17 configurations of jitops.gemm's sm_90a kernel over 9 to 12 problems each (built by nvcc for the
host, cuTensorMapEncodeTiled replaced by a recorder: tests/cutlass_host/make_fixtures.py).  Every byte of Params
that CUTLASS sets, every descriptor's encode arguments and every grid must come out the same from Python."""
from __future__ import annotations

import ctypes
import json
import struct
from pathlib import Path

import pytest
import torch

from jitops import cutlass_host as H
from jitops.ops import gemm_plan as P

from fakes import FakeTmaDriver

FIXTURES = json.loads((Path(__file__).parent / "cutlass_host" / "sm90_gemm_fixtures.json").read_text())
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _config(case) -> tuple[H.GemmConfig, P.Sm90Config]:
    dtype, out, a_kmajor, b_kmajor, fused, bucket = case["class"]
    config = P.SM90_CONFIGS[bucket]
    out_dtype = DTYPES[out]
    facts = H.GemmConfig(DTYPES[dtype].itemsize, out_dtype, a_kmajor, b_kmajor, config.tile, config.cluster, fused,
                         H.epilogue_tile(config.tile, config.pingpong, out_dtype))
    return facts, config


class Recorder:
    """Stands in for cuTensorMapEncodeTiled as the fixtures' harness did: the descriptor holds "JTMA" and the
    call's index."""

    def __init__(self) -> None:
        self.calls: list[tuple[H.TmaArgs, int]] = []

    def __call__(self, buffer, offset: int, args: H.TmaArgs, address: int) -> None:
        ctypes.memmove(ctypes.addressof(buffer) + offset, b"JTMA" + struct.pack("<I", len(self.calls)) + bytes(120),
                       128)
        self.calls.append((args, address))


def _padding(case) -> set[int]:
    """Bytes of Params that CUTLASS's host code left unset ("..": they differed between the fixture's two runs
    over differently dirtied stacks) in any of the configuration's problems: padding is a property of the type,
    and a padding byte can by chance hold the same junk in both runs of one problem."""
    padding = {i for problem in case["problems"] for i in range(case["sizeof_params"])
               if problem["params"][2 * i] == "."}
    if not case["class"][4]:
        # Without a fusion the epilogue's first node is Sm90ScalarBroadcast (beta): {float scalar; pointer; ...}.
        # The 4 bytes between the float and the pointer are padding that CUTLASS's host code fills with the same
        # junk (02 00 00 00) in every run, so the two-run comparison cannot see it.
        thread = case["layout"][H.GEMM_LAYOUT_FIELDS.index("thread")]
        padding |= set(range(thread + 4, thread + 8))
    return padding


def _cases():
    for case in FIXTURES["cases"]:
        for problem in case["problems"]:
            yield pytest.param(case, problem, id=f"{'-'.join(map(str, case['class']))}-{problem['args'][:3]}")


@pytest.mark.parametrize("case,problem", list(_cases()))
def test_params_match_cutlass_host_code(case, problem):
    facts, _ = _config(case)
    layout = H.GemmLayout(*case["layout"])
    m, n, k, lda, ldb, ldd, activation, swizzle, raster, sms, a, b, d, bias = problem["args"]
    recorder = Recorder()
    params, grid = H.pack_params(layout, facts, H.Problem(m, n, k, lda, ldb, ldd, activation, bias != 0, swizzle,
                                                           raster, sms), (a, b, d, bias), recorder)
    assert problem["can_implement"]
    assert list(grid) == problem["grid"]
    expected = problem["params"]
    assert len(params) == len(expected) // 2 == case["sizeof_params"]
    padding = _padding(case)
    wrong = [i for i in range(len(params)) if i not in padding and int(expected[2 * i:2 * i + 2], 16) != params[i]]
    assert not wrong, f"Params bytes differ at {wrong[:16]}: ours {params[wrong[0]:wrong[0] + 16].hex()} vs " \
                      f"CUTLASS's {expected[2 * wrong[0]:2 * wrong[0] + 32]}"
    assert len(recorder.calls) == len(problem["encodes"])
    for (args, address), want in zip(recorder.calls, problem["encodes"]):
        got = {"dtype": args.dtype, "rank": len(args.dims), "interleave": 0, "swizzle": args.swizzle, "l2": args.l2,
               "oob": 0, "address": address, "dims": list(args.dims), "strides": list(args.strides),
               "box": list(args.box), "element_strides": [1] * len(args.dims)}
        assert got == want


def test_fixtures_cover_every_bucket_layout_and_epilogue():
    classes = [tuple(case["class"]) for case in FIXTURES["cases"]]
    # every configuration (the wave buckets run the medium bucket's: gemm_plan.SM90_CONFIGS)
    assert {P.SM90_CONFIGS[c[5]] for c in classes} == set(P.SM90_CONFIGS.values())
    assert {(c[2], c[3]) for c in classes} == {(True, True), (True, False), (False, True), (False, False)}
    assert {c[4] for c in classes} == {True, False} and {c[1] for c in classes} == set(DTYPES)


def test_fast_divmod_matches_cutlass_definition():
    """FastDivmodU64: quotient = (n * multiplier) >> 64 >> shift, with the rounding fix-up, for every n."""
    for divisor in (1, 2, 3, 7, 12, 132, 1000, 2**20 + 1):
        d, multiplier, shift, round_up = H.fast_divmod_u64(divisor)
        assert d == divisor
        for n in (0, 1, divisor - 1, divisor, 12345, 2**31 - 1, 2**40 + 17):
            if multiplier == 0:
                quotient = n >> shift
            else:
                quotient = (((n + round_up) * multiplier) >> 64) >> shift
            assert quotient == n // divisor, (divisor, n)


def test_elf_symbol_reads_initial_bytes_and_rejects_non_elf():
    with pytest.raises(ValueError):
        H.elf_symbol(b"not an elf image", "x")


class FakeDriver(FakeTmaDriver):
    """The driver calls of Sm90Gemm, recorded: a launch keeps a copy of the Params it was given."""

    def __init__(self, address_field):
        super().__init__(address_field, Recorder())

    def launch(self, config_address, function, kernel_params, extra):
        config = H._LaunchConfig.from_address(config_address)
        params = ctypes.cast(kernel_params, ctypes.POINTER(ctypes.c_void_p))[0]
        size = self.layout.size
        self.launches.append({"grid": tuple(config.grid), "block": tuple(config.block), "smem": config.shared_mem,
                              "stream": config.stream, "cluster": tuple(config.attrs[0].value[0:3]),
                              "params": ctypes.string_at(params, size), "function": function})
        return 0


class FakeFunction:
    handle, device_index = 0x1234, 0


@pytest.mark.parametrize("address_field", [0, None], ids=["patched in place", "through the driver"])
def test_repeated_problems_reuse_params_and_patch_only_addresses(address_field):
    """The hot path: a repeated problem encodes nothing again and launches its cached Params with the new
    operands' addresses (written into each descriptor's address field, or moved by cuTensorMapReplaceAddress)
    and the new bias pointer; another size packs afresh."""
    case = next(c for c in FIXTURES["cases"] if c["class"][4] and c["class"][5] == "large")
    facts, _ = _config(case)
    layout = H.GemmLayout(*case["layout"])
    driver = FakeDriver(address_field)
    driver.layout = layout
    host = H.Sm90Gemm(FakeFunction(), facts, layout, driver)
    first = (0x10000, 0x20000, 0x30000, 0x40000)
    host.run(*first, 1000, 1000, 1008, 1016, 1024, 1000, 2, 1, 0, 132, stream=7)
    host.run(0x50000, 0x60000, 0x70000, 0x80000, 1000, 1000, 1008, 1016, 1024, 1000, 2, 1, 0, 132, stream=9)
    assert len(driver.encode_into.calls) == 3 and driver.shared == [layout.smem]
    assert driver.contexts == [0]  # a context before the first encode (autograd's threads start without one)
    one, two = driver.launches
    assert one["stream"] == 7 and two["stream"] == 9 and one["cluster"] == (2, 1, 1)
    assert one["grid"] == two["grid"] and one["block"] == (layout.threads, 1, 1) and one["smem"] == layout.smem
    bias_at = layout.thread + H.FUSED_BIAS
    assert struct.unpack_from("<Q", two["params"], bias_at)[0] == 0x80000
    if address_field is None:
        assert [address for _, address in driver.replaced] == [0x50000, 0x60000, 0x70000]
        assert len({descriptor for descriptor, _ in driver.replaced}) == 3
        changed = {i for i in range(layout.size) if one["params"][i] != two["params"][i]}
        assert changed <= set(range(bias_at, bias_at + 8))
    else:
        for offset, address in ((layout.tma_a, 0x50000), (layout.tma_b, 0x60000), (layout.tma_d, 0x70000)):
            assert struct.unpack_from("<Q", two["params"], offset + address_field)[0] == address
        changed = {i for i in range(layout.size) if one["params"][i] != two["params"][i]}
        fields = {layout.tma_a, layout.tma_b, layout.tma_d, bias_at}
        assert changed <= {f + j for f in fields for j in range(8)}
    host.run(*first, 1000, 1000, 1008, 1016, 1024, 1000, 2, 1, 0, 132, stream=7)  # back: patched again
    assert struct.unpack_from("<Q", driver.launches[-1]["params"], bias_at)[0] == 0x40000
    host.run(*first, 2000, 1000, 1008, 1016, 1024, 1000, 2, 1, 0, 132, stream=7)  # a new size: packed afresh
    assert len(driver.encode_into.calls) == 6
    assert struct.unpack_from("<iiii", driver.launches[-1]["params"], layout.problem_shape) == (2000, 1000, 1008, 1)
