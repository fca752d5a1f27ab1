"""Where conv2d's weight gradient spends its time: one call of ours and one of cuDNN's per ResNet-50 layer,
inside a profiler range, for Nsight Compute's hardware counters (DRAM and L2 bytes, L2 hit rate, duration).

    ncu --clock-control none --profile-from-start off --csv --metrics gpu__time_duration.sum,... \\
        python3 benchmarks/probe_conv_wgrad.py --layers 2,9,21 [--tile 128x128c2x1]
    python3 benchmarks/probe_conv_wgrad.py --tiny     # the least a call costs in GPU time, ours and cuDNN's
    python3 benchmarks/probe_conv_wgrad.py --stem     # the 7x7 stem's fprop in parts (im2col, 1x1 conv)
    python3 benchmarks/probe_conv_wgrad.py --stem-folds  # the stem's fprop and wgrad at each fold: time, error
    ncu --clock-control none --profile-from-start off --metrics ... python3 benchmarks/probe_conv_wgrad.py --tiny-range

The order of the calls (layer, side, plan) is printed first; ncu's rows follow it kernel by kernel (ours: the
wgrad kernel, then the reduction or torch's copy; cuDNN: its kernels)."""
from __future__ import annotations

import argparse
import functools
import importlib
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jitops  # noqa: E402
from jitops.specs import Target  # noqa: E402
from bench_conv2d import cudnn_input_grad, cudnn_weight_grad, layer_tensors  # noqa: E402

conv_module = importlib.import_module("jitops.ops.conv2d")


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
                      functools.partial(cudnn_input_grad, dy, x, w, 1, 0)),
            "wgrad": (functools.partial(jitops.conv2d_weight_grad, dy, x, w.shape, 1, 0, 1),
                      functools.partial(cudnn_weight_grad, dy, x, w, 1, 0)),
        }
        for name, (ours, cudnn) in calls.items():
            print(f"tiny {name} n={n} c={c} k={k} {size}x{size}: ours {time_graphed([ours] * 20) * 1e3:6.2f} us, "
                  f"cuDNN {time_graphed([cudnn] * 20) * 1e3:6.2f} us", flush=True)
    one = torch.zeros(1, device="cuda")
    add = functools.partial(one.add_, 1)
    print(f"tiny elementwise kernel: {time_graphed([add] * 20) * 1e3:6.2f} us", flush=True)


def stem_parts() -> None:
    """Where the 7x7 stem's fprop goes (GPU time, graphs): the im2col kernel alone, the 1x1 conv over its
    matrix alone, and the whole call, against cuDNN and a copy of the matrix's bytes."""
    from bench_conv2d import time_graphed
    c, k, size, kernel, stride, padding = conv_module.RESNET50[0]
    x, w, _ = layer_tensors(c, k, size, kernel, stride, padding)
    p = conv_module.output_size(size, kernel, stride, padding, 1)
    cls = jitops.find("conv2d").shape_class(x, w, None, stride, padding, 1)
    target = Target("cuda", torch.cuda.get_device_capability(0))
    kern = SimpleNamespace(im2col=jitops.runtime.get_kernel(conv_module.IM2COL.bind(
        "fp16", T=jitops.shapes.CUDA_TYPES[torch.float16]), target, 0))
    im2col = functools.partial(conv_module._im2col, kern, x, kernel, kernel, (stride,) * 2, (padding,) * 2, (1, 1),
                               p, p)
    columns = im2col().permute(0, 3, 1, 2)
    w_columns = w.permute(0, 2, 3, 1).reshape(k, kernel * kernel * c, 1, 1)
    w_padded = torch.zeros(k, columns.shape[1], 1, 1, device="cuda", dtype=w.dtype)
    w_padded[:, :w_columns.shape[1]].copy_(w_columns)
    w_padded = w_padded.contiguous(memory_format=torch.channels_last)
    copy_target = torch.empty_like(columns)
    parts = {"im2col kernel": im2col,
             "1x1 conv over the matrix": functools.partial(jitops.conv2d, columns, w_padded, None, 1, 0, 1),
             "whole fprop": functools.partial(jitops.conv2d, x, w, None, stride, padding, 1),
             "cuDNN fprop": functools.partial(torch.nn.functional.conv2d, x, w, None, stride, padding),
             "copy of the matrix (read + write)": functools.partial(copy_target.copy_, columns)}
    print(f"stem: plan {cls.tile}/{cls.splits} im2col={cls.im2col}, matrix {tuple(columns.shape)} "
          f"({columns.numel() * 2 / 1e6:.0f} MB)", flush=True)
    # The same product as a plain GEMM (tiled TMA loads instead of the conv kernel's im2col mode).
    matrix = columns.permute(0, 2, 3, 1).reshape(-1, columns.shape[1])
    w_t = w_padded.reshape(k, -1).t()
    started = time.perf_counter()
    torch.cuda.synchronize(), jitops.gemm(matrix, w_t), torch.cuda.synchronize()
    print(f"stem: jitops.gemm's first call (compile or load) {time.perf_counter() - started:.1f} s", flush=True)
    parts["jitops.gemm over the matrix"] = functools.partial(jitops.gemm, matrix, w_t)
    parts["torch.matmul over the matrix"] = functools.partial(torch.matmul, matrix, w_t)
    for name, call in parts.items():
        print(f"stem {name}: {time_graphed([call] * 4) * 1e3:7.1f} us", flush=True)


def tiny_in_profiler_range() -> None:
    """One call each of our wgrad, fprop and dgrad on 4 x 512 x 7x7 (1x1, 512 -> 512) inside a profiler range,
    for Nsight Compute (benchmarks/results/ncu-tiny-conv-kernels.txt)."""
    x, w, dy = layer_tensors(512, 512, 7, 1, 1, 0)
    x, dy = x[:4], dy[:4]
    calls = [functools.partial(jitops.conv2d_weight_grad, dy, x, w.shape, 1, 0, 1),
             functools.partial(jitops.conv2d, x, w, None, 1, 0, 1),
             functools.partial(jitops.conv2d_input_grad, dy, w, x.shape, 1, 0, 1)]
    for _ in range(3):
        for call in calls:
            call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for call in calls:
        call()
        torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print("profiled, in order: wgrad, fprop, dgrad", flush=True)


def stem_folds() -> None:
    """The stem's fprop and wgrad (batch 32, fp16 and bf16) through the whole im2col matrix (fold 0) and two
    folded filter rows (fold 2), against cuDNN: GPU time (graphs) and each side's relative error against
    float64 on the same inputs (the GPU's float64 convolution)."""
    from bench_conv2d import time_graphed
    for dtype in (torch.float16, torch.bfloat16):
        x, w, dy = layer_tensors(3, 64, 224, 7, 2, 3, dtype)
        want_y = torch.nn.functional.conv2d(x.double(), w.double(), None, 2, 3)
        want_dw = torch.nn.grad.conv2d_weight(x.double(), w.shape, dy.double(), 2, 3)

        def error(got, want):
            return float((got.double() - want).norm() / want.norm())

        calls = {"cuDNN": (functools.partial(torch.nn.functional.conv2d, x, w, None, 2, 3),
                           functools.partial(cudnn_weight_grad, dy, x, w, 2, 3))}
        for fold in (0, 2):
            conv_module.FOLD_OVERRIDE = fold
            try:
                classes = (jitops.find("conv2d").shape_class(x, w, None, 2, 3, 1),
                           jitops.find("conv2d_weight_grad").shape_class(dy, x, w.shape, 2, 3, 1))
                y, dw = jitops.conv2d(x, w, None, 2, 3, 1), jitops.conv2d_weight_grad(dy, x, w.shape, 2, 3, 1)
                times = [time_graphed([functools.partial(jitops.conv2d, x, w, None, 2, 3, 1)]),
                         time_graphed([functools.partial(jitops.conv2d_weight_grad, dy, x, w.shape, 2, 3, 1)])]
            finally:
                conv_module.FOLD_OVERRIDE = None
            print(f"stem {str(dtype)[6:]} fold {fold}: fprop {classes[0].tile}/{classes[0].splits} "
                  f"{times[0] * 1e3:6.1f} us error {error(y, want_y):.1e}; wgrad {classes[1].tile}/"
                  f"{classes[1].splits} {times[1] * 1e3:6.1f} us error {error(dw, want_dw):.1e}", flush=True)
        fprop, wgrad = calls["cuDNN"]
        print(f"stem {str(dtype)[6:]} cuDNN: fprop {time_graphed([fprop]) * 1e3:6.1f} us error "
              f"{error(fprop(), want_y):.1e}; wgrad {time_graphed([wgrad]) * 1e3:6.1f} us error "
              f"{error(wgrad(), want_dw):.1e}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="2,5,9,15,21,22")
    parser.add_argument("--tile", default=None, help="force this wgrad tile (conv_module.TILES)")
    parser.add_argument("--tiny", action="store_true", help="time tiny problems instead (no profiler range)")
    parser.add_argument("--stem", action="store_true", help="time the stem's fprop in parts instead")
    parser.add_argument("--tiny-range", action="store_true", help="one tiny call per operator in a profiler range")
    parser.add_argument("--stem-folds", action="store_true", help="the stem at each fold: time and error")
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = True
    if args.stem_folds:
        stem_folds()
        return 0
    if args.tiny or args.stem or args.tiny_range:
        tiny_problems() if args.tiny else stem_parts() if args.stem else tiny_in_profiler_range()
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
