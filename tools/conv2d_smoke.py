"""A first look at one conv2d operator on the GPU, meant to run in its own process (a kernel fault or hang then
costs one step, not the session):  python tools/conv2d_smoke.py fprop|dgrad|wgrad
Prints the relative error against torch in fp32 for a few shapes and every tile configuration."""
from __future__ import annotations

import sys
import time

import torch
import torch.nn.functional as F

import jitops

from jitops.ops import conv2d_plan as conv_plan
SHAPES = [((2, 8, 9, 11), (16, 3, 3), 1, 1), ((2, 8, 9, 11), (16, 3, 3), 2, 1), ((4, 64, 28, 28), (128, 1, 1), 1, 0),
          ((4, 3, 32, 32), (8, 7, 7), 2, 3), ((8, 256, 14, 14), (256, 3, 3), 1, 1)]


def main(name: str) -> int:
    worst = 0.0
    for (n, c, h, w), (k, r, s), stride, padding in SHAPES:
        x = torch.randn(n, c, h, w, device="cuda", dtype=torch.float16).contiguous(memory_format=torch.channels_last)
        wt = torch.randn(k, c, r, s, device="cuda", dtype=torch.float16) / (c * r * s) ** 0.5
        xf, wf = x.float().requires_grad_(True), wt.float().requires_grad_(True)
        yf = F.conv2d(xf, wf, None, stride, padding)
        grad = torch.randn_like(yf).half()
        dxf, dwf = torch.autograd.grad(yf, (xf, wf), grad.float())
        configs = [(t, 1 if name != "wgrad" else None) for t in conv_plan.OPERATOR_TILES[name]
                   if name != "wgrad" or conv_plan.wgrad_tile_serves(t, c, (r, s))]
        configs += [(conv_plan.SPLIT_TILE, 3)] if name != "wgrad" else []
        for tile, splits in configs:
            started = time.perf_counter()
            with jitops.config.scope(conv2d_tile={name: tile}, conv2d_splits={name: splits}):
                if name == "fprop":
                    got, want = jitops.conv2d(x, wt, None, stride, padding), yf
                elif name == "dgrad":
                    got, want = jitops.conv2d_input_grad(grad, wt, x.shape, stride, padding), dxf
                else:
                    got, want = jitops.conv2d_weight_grad(grad, x, wt.shape, stride, padding), dwf
            torch.cuda.synchronize()
            error = float((got.double() - want.double()).norm() / want.double().norm())
            worst = max(worst, error if error == error else float("inf"))
            print(f"{name} {tile:8s}/{splits} x{(n, c, h, w)} w{(k, c, r, s)} s{stride} p{padding}: "
                  f"rel err {error:.2e} ({(time.perf_counter() - started) * 1e3:.1f} ms, strides {got.stride()})",
                  flush=True)
    print(f"{name}: worst relative error {worst:.2e}", flush=True)
    return 0 if worst < 5e-3 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
