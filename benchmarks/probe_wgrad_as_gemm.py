"""Is the conv kernel's weight gradient slow on ResNet-50's 1x1, stride-1 layers because of its im2col loads?
For those layers dw = dy^T . x is a plain GEMM (dy (N*P*Q, K) and x (N*H*W, C), both read M/N-major), so
jitops.gemm's CUTLASS 3 kernel (tiled TMA loads) can run the same product.  This times, in CUDA graphs on the
same inputs: conv2d_weight_grad (its plan), cuDNN, and the GEMM kernel in several tile configurations.

    JITOPS_CACHE_DIR=DIR python benchmarks/probe_wgrad_as_gemm.py --prewarm sm_90a [--fprop]  # build, no GPU
    python benchmarks/probe_wgrad_as_gemm.py [--layers 9,15,21]
    python benchmarks/probe_wgrad_as_gemm.py --fprop     # the same for the 1x1 layers' fprop: y = x . w^T

With --fprop the product is the forward pass (x (N*H*W, C) row-major times w^T, w (K, C) row-major: both
K-major), against conv2d and cuDNN's forward.
"""
from __future__ import annotations

import argparse
import functools
import importlib
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jitops  # noqa: E402
from jitops.specs import Target  # noqa: E402

gemm_module = importlib.import_module("jitops.ops.gemm")
conv_module = importlib.import_module("jitops.ops.conv2d")
Config = gemm_module.Sm90Config

# (tile, cluster, ping-pong): M-tiles of 64 need the ping-pong schedule (one consumer warpgroup per tile).
CONFIGS = {
    "128x64 coop 1x2": Config((128, 64, 64), (1, 2), pingpong=False, streamk=False),
    "128x64 coop 2x1": Config((128, 64, 64), (2, 1), pingpong=False, streamk=False),
    "64x128 pong 2x1": Config((64, 128, 64), (2, 1), pingpong=True, streamk=False),
    "64x128 pong 1x1": Config((64, 128, 64), (1, 1), pingpong=True, streamk=False),
    "128x128 coop 2x1": Config((128, 128, 64), (2, 1), pingpong=False, streamk=False),
    "128x128 pong 1x1": Config((128, 128, 64), (1, 1), pingpong=True, streamk=False),
    "128x256 coop 2x1": Config((128, 256, 64), (2, 1), pingpong=False, streamk=False),
}
# dy^T (K x NPQ, K contiguous: M-major) times x (NPQ x C, C contiguous: N-major), fp16 in and out.
WGRAD_CLASS = gemm_module.GemmClass(torch.float16, torch.float16, False, False, 8, "probe", False, "auto")
# x (NPQ x C, C contiguous) times w^T (w is K x C, C contiguous): both K-major.
FPROP_CLASS = gemm_module.GemmClass(torch.float16, torch.float16, True, True, 8, "probe", False, "auto")


def requests(cls=WGRAD_CLASS):
    return {name: gemm_module.sm90_request(cls, config) for name, config in CONFIGS.items()}


def prewarm(arch: str, jobs: int, fprop: bool) -> None:
    target = Target.parse(arch)
    kinds = (("fprop", FPROP_CLASS),) if fprop else (("wgrad", WGRAD_CLASS),)
    both = [(f"{kind} {name}", request) for kind, cls in kinds for name, request in requests(cls).items()]
    with ThreadPoolExecutor(jobs) as pool:
        for (name, _), outcome in zip(both, pool.map(lambda item: jitops.runtime.prewarm(item[1], target), both)):
            print(f"{name}: {outcome}", flush=True)


def probe_fprop(layers: str) -> None:
    from bench_conv2d import layer_tensors, relative_error, time_graphed
    target = Target("cuda", torch.cuda.get_device_capability(0))
    libs = {name: jitops.runtime.get_kernel(r, target, 0) for name, r in requests(FPROP_CLASS).items()}
    for index in layers.split(","):
        c, k, size, kernel, stride, padding = conv_module.RESNET50[int(index)]
        assert kernel == 1 and stride == 1, f"L{index} is not a 1x1 stride-1 layer"
        sets = [layer_tensors(c, k, size, kernel, stride, padding) for _ in range(4)]
        cls = jitops.find("conv2d").shape_class(sets[0][0], sets[0][1], None, 1, 0, 1)
        row = {"cuDNN": [functools.partial(torch.nn.functional.conv2d, x, w, None, 1, 0) for x, w, _ in sets],
               f"conv plan {cls.tile}": [functools.partial(jitops.conv2d, x, w, None, 1, 0, 1) for x, w, _ in sets]}
        want = torch.nn.functional.conv2d(sets[0][0].float(), sets[0][1].float())
        pixels = sets[0][0].shape[0] * size * size
        for name, lib in libs.items():
            calls = []
            for x, w, _ in sets:
                a = x.permute(0, 2, 3, 1).reshape(pixels, c)           # (NPQ, C) row-major
                b = w.permute(0, 2, 3, 1).reshape(k, c).t()            # (C, K), C contiguous
                out = torch.empty(pixels, k, device="cuda", dtype=torch.float16)
                calls.append(functools.partial(gemm_module.run_sm90, lib, FPROP_CLASS, CONFIGS[name], a, b, out,
                                               None, pixels, k, c, c, c, 0))
                if len(calls) == 1:
                    calls[0]()
                    got = out.float().reshape(x.shape[0], size, size, k).permute(0, 3, 1, 2)
                    err = relative_error(got, want)
            row[f"gemm {name} (err {err:.1e})"] = calls
        times = {name: time_graphed(calls) * 1e3 for name, calls in row.items()}
        print(f"L{index} {c}->{k} {size}x{size} (GEMM {pixels}x{k}x{c}): " +
              ", ".join(f"{name} {us:.1f} us" for name, us in times.items()), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prewarm", metavar="ARCH")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--layers", default="9,10,11,15,16,17,21,22")
    parser.add_argument("--no-conv", action="store_true", help="leave out conv2d_weight_grad (cuDNN and GEMMs only)")
    parser.add_argument("--fprop", action="store_true", help="the 1x1 layers' forward pass instead")
    args = parser.parse_args()
    if args.prewarm:
        prewarm(args.prewarm, args.jobs, args.fprop)
        return 0
    if args.fprop:
        torch.backends.cudnn.benchmark = True
        probe_fprop(args.layers if args.layers != "9,10,11,15,16,17,21,22" else "1,4,5,9,10,11,15,16,17,21,22")
        return 0
    from bench_conv2d import cudnn_weight_grad, layer_tensors, relative_error, time_graphed
    torch.backends.cudnn.benchmark = True
    target = Target("cuda", torch.cuda.get_device_capability(0))
    libs = {name: jitops.runtime.get_kernel(r, target, 0) for name, r in requests().items()}
    for index in args.layers.split(","):
        c, k, size, kernel, stride, padding = conv_module.RESNET50[int(index)]
        assert kernel == 1 and stride == 1, f"L{index} is not a 1x1 stride-1 layer"
        sets = [layer_tensors(c, k, size, kernel, stride, padding) for _ in range(4)]
        geometry = ((1, 1), (0, 0), (1, 1))
        cls = jitops.find("conv2d_weight_grad").shape_class(sets[0][2], sets[0][0], sets[0][1].shape, *geometry)
        row = {"cuDNN": [functools.partial(cudnn_weight_grad, dy, x, w, 1, 0) for x, w, dy in sets]}
        if not args.no_conv:
            row["conv plan " + f"{cls.tile}/{cls.splits}"] = [
                functools.partial(jitops.conv2d_weight_grad, dy, x, w.shape, *geometry) for x, w, dy in sets]
        want = cudnn_weight_grad(sets[0][2], sets[0][0], sets[0][1], 1, 0).float()
        pixels = sets[0][0].shape[0] * size * size
        for name, lib in libs.items():
            calls = []
            for x, w, dy in sets:
                a = dy.permute(0, 2, 3, 1).reshape(pixels, k).t()       # (K, NPQ), stride (1, K): M-major
                b = x.permute(0, 2, 3, 1).reshape(pixels, c)            # (NPQ, C), row-major: N-major
                out = torch.empty(k, c, device="cuda", dtype=torch.float16)
                calls.append(functools.partial(gemm_module.run_sm90, lib, WGRAD_CLASS, CONFIGS[name], a, b, out,
                                               None, k, c, pixels, k, c, 0))
                if len(calls) == 1:
                    calls[0]()
                    err = relative_error(out.float().reshape(want.shape[0], -1), want.reshape(want.shape[0], -1))
            row[f"gemm {name} (err {err:.1e})"] = calls
        times = {name: time_graphed(calls) * 1e3 for name, calls in row.items()}
        print(f"L{index} {c}->{k} {size}x{size} (GEMM {k}x{c}x{pixels}): " +
              ", ".join(f"{name} {us:.1f} us" for name, us in times.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
