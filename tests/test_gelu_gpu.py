"""jitops.gelu's tuned CUDA kernels on the GPU: sizes that cross the unrolled tiles and leave a tail, every dtype
and both approximations, forward and backward against a float64 reference."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import jitops
from jitops.testing import check_op

pytestmark = pytest.mark.gpu
# 256 threads x 4 vectors a tile: one tile, one tile plus a tail, several tiles and a tail, large.
SIZES = [(0,), (1,), (7,), (8 * 1024,), (8 * 1024 + 5,), (3, 1024 * 257 + 3), (1 << 22,)]


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_cuda_tiles_and_tails(approximate):
    def samples(dtype, device):
        g = torch.Generator().manual_seed(0)
        return [(torch.randn(s, generator=g, dtype=torch.float64).mul(3).to(device, dtype), approximate)
                for s in SIZES]

    check_op(jitops.gelu, lambda x, a: F.gelu(x, approximate=a), samples=samples,
             dtypes=[torch.float32, torch.float16, torch.bfloat16, torch.float64], device="cuda",
             opcheck=False, gradcheck=False)


def test_gelu_backward_op_matches_torch_in_bf16():
    x = torch.randn(1 << 20, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    for approximate in ("none", "tanh"):
        ours = jitops.gelu_backward(dy, x, approximate)
        theirs = torch.ops.aten.gelu_backward(dy, x, approximate=approximate)
        torch.testing.assert_close(ours, theirs, rtol=1.6e-2, atol=1.6e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_short_path_shape_class_matches_the_checked_one(dtype):
    """gelu's shape class takes a short path for a contiguous CUDA tensor: it must give what the general
    checks give, for every alignment, and leave everything else to them."""
    from jitops.ops import gelu as gelu_module

    base = torch.randn(4096 + 16, device="cuda", dtype=dtype)
    for x in (base[:1], base[:4096], base[1:4001], base[2:], base[3:7], base[:4096].view(64, 64).t(), base[:0]):
        for approximate in ("none", "tanh"):
            assert gelu_module.shape_class(x, approximate) == gelu_module._class_for("gelu", [("x", x)], approximate)
            torch.testing.assert_close(jitops.gelu(x, approximate).float(),
                                       F.gelu(x.float(), approximate=approximate), rtol=2e-2, atol=2e-2)
    with pytest.raises(ValueError, match="approximate"):
        jitops.gelu(base, "fast")
