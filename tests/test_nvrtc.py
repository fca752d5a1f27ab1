"""NVRTC compiles the CUDA kernels of the built-in ops on this GPU-less machine, for sm_80 and sm_90a."""
from __future__ import annotations

import struct

import pytest
import torch

import jitops
from jitops.runtime import runtime
from jitops.specs import Target


def cubin_sm(cubin: bytes) -> int:
    """The SM version in a cubin's ELF header (e_flags bits 8-15: 0x50 = sm_80, 0x5a = sm_90)."""
    assert cubin[:4] == b"\x7fELF"
    return (struct.unpack_from("<I", cubin, 48)[0] >> 8) & 0xFF


CALLS = [
    ("add", dtype, [[4097], [4097]], {}) for dtype in ("fp32", "fp16", "bf16", "fp64")
] + [  # jitops.add's general kernel: broadcasting with alpha
    ("add", dtype, [[64, 1, 5], [8, 5]], {"alpha": 2}) for dtype in ("fp32", "fp16", "bf16", "fp64")
] + [
    (op, dtype, shapes, {"approximate": approx})
    for dtype in ("fp32", "fp16", "bf16")
    for approx in ("none", "tanh")
    for op, shapes in (("gelu", [[4096, 8192]]), ("gelu_backward", [[4096, 8192], [4096, 8192]]))
]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_nvrtc_compiles_builtin_cuda_kernels_without_a_gpu(fresh_cache, arch):
    target = Target.parse(arch)
    compiled = 0
    for name, dtype, shapes, kwargs in CALLS:
        op = jitops.find(name)
        for request in op.requests_for(op.example_args(dtype, shapes, kwargs), target).values():
            assert runtime.prewarm(request, target) == "compiled"
            key, _ = runtime.key_for(request, target)
            entry = runtime.find_entry(key, any_toolchain=False)
            assert cubin_sm(entry.file("kernel.cubin").read_bytes()) == target.capability[0] * 10 + \
                target.capability[1]
            compiled += 1
    assert compiled == len(CALLS)
    assert not torch.cuda.is_available() or True  # compiling never needed a device


def test_arch_specific_request_targets_sm_90a(fresh_cache):
    from dataclasses import replace
    from jitops.ops.gelu import GELU_FORWARD
    request = replace(GELU_FORWARD.bind("bf16", T="__nv_bfloat16", VEC=8, APPROX=0, I="int"), arch_specific=True)
    runtime.prewarm(request, Target.parse("sm_90"))
    [cubin] = fresh_cache.glob("v1/sm_90a/bf16/*/kernel.cubin")
    assert cubin_sm(cubin.read_bytes()) == 90


def test_add_broadcast_compiles_every_dtype_combination_and_rank(fresh_cache):
    """kernels/add_broadcast.cu for each (a, b, result) dtype triple torch's promotion can give it (a narrower
    input widened in the kernel), and for every rank and index type in one of them, for sm_90a."""
    from jitops.ops.add import ADD_BROADCAST_CUDA, MAX_DIMS, WIDENS_EXACTLY

    from jitops.shapes import CUDA_TYPES, dtype_name

    target = Target.parse("sm_90a")
    reads = {result: [d for d in CUDA_TYPES if d is result or (d, result) in WIDENS_EXACTLY] for result in CUDA_TYPES}
    binds = [(a, b, result, 2, "unsigned") for result, inputs in reads.items() for a in inputs for b in inputs]
    binds += [(torch.float32, torch.float32, torch.float32, dims, index) for dims in range(1, MAX_DIMS + 1)
              for index in ("unsigned", "long long") if (dims, index) != (2, "unsigned")]
    for a, b, result, dims, index in binds:
        request = ADD_BROADCAST_CUDA.bind(dtype_name(result), TA=CUDA_TYPES[a], TB=CUDA_TYPES[b],
                                          T=CUDA_TYPES[result], NDIM=dims, I=index)
        assert runtime.prewarm(request, target) == "compiled", request.label()
    assert len(binds) == 1 + 1 + 9 + 16 + 2 * MAX_DIMS - 1
