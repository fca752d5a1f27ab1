"""Where conv2d's weight gradient spends its time: one call of ours and one of cuDNN's per ResNet-50 layer,
inside a profiler range, for Nsight Compute's hardware counters (DRAM and L2 bytes, L2 hit rate, duration).

    ncu --clock-control none --profile-from-start off --csv --metrics gpu__time_duration.sum,... \\
        python3 benchmarks/probe_conv_wgrad.py --layers 2,9,21 [--tile 128x128c2x1]
    python3 benchmarks/probe_conv_wgrad.py --tiny     # the least a call costs in GPU time, ours and cuDNN's

The order of the calls (layer, side, plan) is printed first; ncu's rows follow it kernel by kernel (ours: the
wgrad kernel, then the reduction or torch's copy; cuDNN: its kernels)."""
from __future__ import annotations

import argparse
import functools
import importlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jitops  # noqa: E402
from bench_conv2d import layer_tensors  # noqa: E402

conv_module = importlib.import_module("jitops.ops.conv2d")


def cudnn_weight_grad(dy, x, w, stride, padding):
    return torch.ops.aten.convolution_backward(dy, x, w, None, [stride] * 2, [padding] * 2, [1, 1], False, [0, 0],
                                               1, [False, True, False])[1]


def tiny_problems() -> None:
    """GPU time (CUDA graphs of 20 calls) of problems too small to take time: what a call costs at the least,
    ours and cuDNN's, per operator, against one tiny elementwise kernel.  (A graph of one call has a floor of
    about 10.5 us on the lent H100: its launch.)"""
    from bench_conv2d import time_graphed
    for n, c, k, size in ((1, 64, 64, 8), (1, 256, 256, 8), (4, 512, 512, 7)):
        x, w, dy = layer_tensors(c, k, size, 1, 1, 0)
        x, w, dy = x[:n], w, dy[:n]
        calls = {
            "fprop": (functools.partial(jitops.conv2d, x, w, None, 1, 0, 1),
                      functools.partial(torch.nn.functional.conv2d, x, w, None, 1, 0)),
            "dgrad": (functools.partial(jitops.conv2d_input_grad, dy, w, x.shape, 1, 0, 1),
                      functools.partial(cudnn_input_grad, dy, x, w)),
            "wgrad": (functools.partial(jitops.conv2d_weight_grad, dy, x, w.shape, 1, 0, 1),
                      functools.partial(cudnn_weight_grad, dy, x, w, 1, 0)),
        }
        for name, (ours, cudnn) in calls.items():
            print(f"tiny {name} n={n} c={c} k={k} {size}x{size}: ours {time_graphed([ours] * 20) * 1e3:6.2f} us, "
                  f"cuDNN {time_graphed([cudnn] * 20) * 1e3:6.2f} us", flush=True)
    one = torch.zeros(1, device="cuda")
    add = functools.partial(one.add_, 1)
    print(f"tiny elementwise kernel: {time_graphed([add] * 20) * 1e3:6.2f} us", flush=True)


def cudnn_input_grad(dy, x, w):
    return torch.ops.aten.convolution_backward(dy, x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
                                               [True, False, False])[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="2,5,9,15,21,22")
    parser.add_argument("--tile", default=None, help="force this wgrad tile (conv_module.TILES)")
    parser.add_argument("--tiny", action="store_true", help="time tiny problems instead (no profiler range)")
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = True
    if args.tiny:
        tiny_problems()
        return 0
    conv_module.TILE_OVERRIDE["wgrad"] = args.tile
    calls = []
    for index in args.layers.split(","):
        c, k, size, kernel, stride, padding = conv_module.RESNET50[int(index)]
        x, w, dy = layer_tensors(c, k, size, kernel, stride, padding)
        geometry = ((stride, stride), (padding, padding), (1, 1))
        cls = jitops.find("conv2d_weight_grad").shape_class(dy, x, w.shape, *geometry)
        ours = functools.partial(jitops.conv2d_weight_grad, dy, x, w.shape, *geometry)
        cudnn = functools.partial(cudnn_weight_grad, dy, x, w, stride, padding)
        for _ in range(3):  # compile/load, cuDNN's algorithm search, allocator
            ours(), cudnn()
        calls += [(f"L{index} {c}->{k} {size}x{size} k{kernel}s{stride}", f"ours {cls.tile}/{cls.splits}", ours),
                  (f"L{index} {c}->{k} {size}x{size} k{kernel}s{stride}", "cuDNN", cudnn)]
    torch.cuda.synchronize()
    for layer, side, _ in calls:
        print(f"call: {layer} | {side}", flush=True)
    torch.cuda.profiler.start()
    for _, _, call in calls:
        call()
        torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
