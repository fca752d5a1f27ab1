"""Prebuild, on a machine without a GPU, the gelu and layer_norm kernels that the GPU tests and benchmarks
(tuning sweeps included) load, so that a session on the lent GPU compiles almost nothing:

    JITOPS_CACHE_DIR=$PWD/prebuilt python benchmarks/prebuild_norm.py --arch sm_90
    # on the GPU machine: JITOPS_CACHE_PATH=$PWD/prebuilt (read-only roots accept another NVRTC's build)

Classes are enumerated for 16-byte-aligned tensors (what the tests and benchmarks allocate); the few misaligned
views the tests make compile there, in about a second each.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import jitops  # noqa: E402
from jitops.specs import Target  # noqa: E402

ln = importlib.import_module("jitops.ops.layer_norm")
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
LN_HIDDEN = (1, 7, 10, 16, 40, 64, 96, 128, 200, 300, 512, 768, 1000, 1024, 2048, 4096, 4097, 8192, 16384, 20000,
             65536)
LN_SWEEP = [dict(FORWARD_TILE_BYTES=t, BACKWARD_TILE_BYTES=u) for t, u in ((64, 64), (128, 32))]
LN_SWEEP_SHAPES = ((8192, torch.bfloat16), (8192, torch.float32), (1024, torch.bfloat16), (16384, torch.bfloat16),
                   (4097, torch.bfloat16))


def meta(shape, dtype):
    return torch.empty(shape, dtype=dtype, device="meta")


def layer_norm_requests(target: Target, hidden, dtypes) -> list:
    requests = []
    forward, backward = jitops.find("layer_norm_forward"), jitops.find("layer_norm_backward")
    for dtype in dtypes:
        for n in hidden:
            for rows in (8, 4096, 65536):  # the few-rows bucket and the others
                x, w = meta((rows, n), dtype), meta((n,), dtype)
                requests += forward.requests_for((x, [n], w, w, 1e-5), target).values()
                stats = meta((2, rows), torch.float32)
                requests += backward.requests_for((x, x, stats, w, [n], True, True, True), target).values()
    return requests


def gelu_requests(target: Target, dtypes) -> list:
    requests = []
    for name in ("gelu", "gelu_backward"):
        op = jitops.find(name)
        for dtype in dtypes:
            for approximate in ("none", "tanh"):
                x = meta((1 << 20,), dtype)
                args = (x, approximate) if name == "gelu" else (x, x, approximate)
                requests += op.requests_for(args, target).values()
    return requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--no-sweep", action="store_true")
    args = parser.parse_args()
    target = Target.parse(args.arch)
    requests = layer_norm_requests(target, LN_HIDDEN, DTYPES) + gelu_requests(target, DTYPES)
    if not args.no_sweep:
        saved = {k: getattr(ln, k) for k in LN_SWEEP[0]}
        for values in LN_SWEEP:
            for key, value in values.items():
                setattr(ln, key, value)
            ln.clear_buckets()
            for n, dtype in LN_SWEEP_SHAPES:
                requests += layer_norm_requests(target, (n,), (dtype,))
        for key, value in saved.items():
            setattr(ln, key, value)
        ln.clear_buckets()
    unique = list(dict.fromkeys(requests))
    started, outcomes = time.perf_counter(), {"compiled": 0, "cached": 0}
    for request in unique:
        outcomes[jitops.runtime.prewarm(request, target)] += 1
    print(f"prebuild {args.arch}: {len(unique)} kernels, {outcomes['compiled']} compiled, {outcomes['cached']} "
          f"cached, {time.perf_counter() - started:.0f} s, into {jitops.config.cache_dir}")


if __name__ == "__main__":
    main()
