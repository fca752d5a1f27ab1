"""jitops.conv2d against cuDNN (torch conv2d, channels_last) on ResNet-50's conv layers at batch 32, fp16:
fprop, dgrad and wgrad timed separately, in the same run, on the same GPU.

    python benchmarks/bench_conv2d.py                 # every ResNet-50 layer, fprop/dgrad/wgrad, table + JSON
    python benchmarks/bench_conv2d.py --sweep         # also every tile configuration per layer (picks heuristics)
    python benchmarks/bench_conv2d.py --wgrad-splits 1,2,4,8   # also wgrad with every tile at these split counts
    python benchmarks/bench_conv2d.py --prewarm sm_90a [--jobs 2]   # build every configuration, no GPU needed
    python benchmarks/bench_conv2d.py --tiles 128x128c2x1,64x128 --operators wgrad   # candidate tiles too
    python benchmarks/bench_conv2d.py --prewarm sm_90a --tiles 128x128c2x1 --operators wgrad   # build those
    python benchmarks/bench_conv2d.py --report results.json          # markdown tables of a results file
    python benchmarks/bench_conv2d.py --grouped       # depthwise and grouped layers against cuDNN (the ATen route)
    python benchmarks/bench_conv2d.py --cutlass       # also each operator on CUTLASS's kernels (the other family)
    python benchmarks/bench_conv2d.py --light --wgrad-splits 1,8   # the light wgrad at these split counts

Timing needs prebuilt kernels (JITOPS_CACHE_PATH; `benchmarks/gpu_session.sh prebuilt` sets it up) or
JITOPS_CONV2D_COMPILE_HERE=1: compiling all configurations on the GPU machine takes ~15 minutes of nvcc.

cuDNN's dgrad and wgrad are torch.ops.aten.convolution_backward with output_mask (True, False, False) and
(False, True, False): the calls autograd makes, without autograd's overhead.  FLOPs are 2*N*P*Q*K*C*R*S for
each of the three (the stem's padded channels are not counted).  Inputs rotate so that L2 (50 MB) does not
hold them between calls.  Two timings per layer and operator: GPU time (the calls captured in a CUDA graph and
replayed, both sides; no host overhead) and eager (the harness's events around plain calls).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jitops  # noqa: E402
from jitops.specs import Target  # noqa: E402

from jitops.ops import conv2d as conv_module
from jitops.ops import conv2d_plan as conv_plan  # noqa: E402
BATCH = 32
# How often each of conv_plan.RESNET50's layers occurs in the network (torchvision v1.5: 53 conv layers; the
# downsample 1x1 convs share shapes with L3 and L7/L13/L19).
FAMILIES = ("light", "cutlass")  # JITOPS_CONV2D_SM90_KERNEL's kernel families (--light, --cutlass)
OCCURRENCES = (1, 1, 3, 4, 2, 1, 1, 1, 3, 4, 3, 1, 1, 1, 5, 6, 5, 1, 1, 1, 2, 3, 2)
# The baseline shape (not a ResNet-50 layer): 3x3, C=K=256, 56x56.
REFERENCE = (256, 256, 56, 3, 1, 1)


def variants() -> list[tuple[str, str, int | None]]:
    """(operator, tile, forced splits) of every compiled configuration: the tiles of each operator (wgrad's at
    one slice, written directly, and at several), and the split-K variant of fprop and dgrad (forced to 2 and 4
    slices in a sweep)."""
    out = [(name, tile, splits) for name in ("fprop", "dgrad", "wgrad") for tile in conv_plan.OPERATOR_TILES[name]
           for splits in ((1, None) if name == "wgrad" else (1,))]
    return out + [(name, conv_plan.SPLIT_TILE, s) for name in ("fprop", "dgrad") for s in (2, 4)]


def all_requests(target: Target, tiles=(), operators=("fprop", "dgrad", "wgrad")) -> dict[str, object]:
    """Every compiled configuration, fp16 first, then bf16: what the sweep and the GPU tests use.  With `tiles`,
    only those candidate tiles (fp16, what --tiles times) for `operators`."""
    requests = {}
    # wgrad: one slice (the direct variant) and several (fp32 slices) are different builds, and each stores its
    # output flat (what the plans use) or not (layers whose channels no tile width divides; forced tiles); a tile
    # over several filter taps always stores flat
    configs = [(name, tile, s) for tile in tiles for name in operators for s in ((1, 2) if name == "wgrad" else (1,))] \
        if tiles else variants()
    for dtype in (torch.float16,) if tiles else (torch.float16, torch.bfloat16):
        for name, tile, splits in configs:
            for flat in ((True,) if conv_plan.TILES[tile].taps > 1 else (True, False)) if name == "wgrad" \
                    else (False,):
                cls = conv_plan.ConvClass(dtype, (3, 3), (1, 1), (1, 1), (1, 1), True, tile,
                                            splits or (2 if name == "wgrad" else 1), flat=flat)
                for request in conv_module._request(name, cls, target).values():
                    requests[jitops.runtime.key_for(request, target)[0].request_hash] = request
    return requests


def prewarm(arch: str, jobs: int, tiles=(), operators=("fprop", "dgrad", "wgrad")) -> None:
    target = Target.parse(arch)
    requests = list(all_requests(target, tiles, operators).values())
    print(f"prewarming {len(requests)} conv2d configurations for {arch} into {jitops.config.cache_dir}", flush=True)

    def build(request):
        started = time.perf_counter()
        try:
            outcome = jitops.runtime.prewarm(request, target)
        except Exception as exc:  # report it and build the rest
            outcome = f"FAILED ({type(exc).__name__}: {str(exc)[:2000]})"
        return request.label(), outcome, time.perf_counter() - started

    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        for label, outcome, seconds in pool.map(build, requests):
            print(f"  {label}: {outcome} in {seconds:.0f} s", flush=True)


# ---- timing -----------------------------------------------------------------------------------------------------
def layer_tensors(c, k, size, kernel, stride, padding, dtype=torch.float16):
    out = conv_plan.output_size(size, kernel, stride, padding, 1)
    x = torch.randn(BATCH, c, size, size, device="cuda", dtype=dtype).contiguous(memory_format=torch.channels_last)
    w = (torch.randn(k, c, kernel, kernel, device="cuda", dtype=dtype) / (c * kernel * kernel) ** 0.5)
    w = w.contiguous(memory_format=torch.channels_last)
    dy = torch.randn(BATCH, k, out, out, device="cuda", dtype=dtype).contiguous(memory_format=torch.channels_last)
    return x, w, dy


def relative_error(got, want):
    return float((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30))


def cudnn_input_grad(dy, x, w, stride: int, padding: int):
    """cuDNN's dgrad: what torch's conv2d backward calls for grad_input alone."""
    return torch.ops.aten.convolution_backward(dy, x, w, None, [stride] * 2, [padding] * 2, [1, 1], False,
                                               [0, 0], 1, [True, False, False])[0]


def cudnn_weight_grad(dy, x, w, stride: int, padding: int):
    """cuDNN's wgrad: what torch's conv2d backward calls for grad_weight alone."""
    return torch.ops.aten.convolution_backward(dy, x, w, None, [stride] * 2, [padding] * 2, [1, 1], False,
                                               [0, 0], 1, [False, True, False])[1]


REPLAYS = {"graph": 20}


def time_graphed(calls, replays: int | None = None) -> float:
    """GPU milliseconds per call: the calls (one per rotating input set) captured once into a CUDA graph and
    replayed, so host overhead (Python, ctypes, TMA descriptor encoding; torch's dispatcher and cuDNN's plan
    lookup) is excluded for both sides."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for call in calls:  # warm-up outside the capture: cuDNN autotuning, kernel loading, allocator
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays or REPLAYS["graph"]):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        times.append((start, end))
    torch.cuda.synchronize()
    del graph
    return statistics.median(s.elapsed_time(e) for s, e in times) / len(calls)


def bench_layer(bench, harness, c, k, size, kernel, stride, padding, label, sweep=False, eager=True,
                wgrad_splits=None, tiles=None, operators=("fprop", "dgrad", "wgrad"), family=None):
    out = conv_plan.output_size(size, kernel, stride, padding, 1)
    geometry = ((stride, stride), (padding, padding), (1, 1))
    flops = 2.0 * BATCH * out * out * k * c * kernel * kernel
    x, w, dy = layer_tensors(c, k, size, kernel, stride, padding)
    set_bytes = (x.numel() + w.numel() + dy.numel()) * 2
    count = max(1, min(16, (3 * 50 * 2**20) // set_bytes + 1))
    sets = [(x, w, dy)] + [layer_tensors(c, k, size, kernel, stride, padding) for _ in range(count - 1)]
    rotation = {"i": 0}

    def next_set():
        rotation["i"] = (rotation["i"] + 1) % len(sets)
        return sets[rotation["i"]]

    ops = {
        "fprop": (lambda s: jitops.conv2d(s[0], s[1], None, *geometry),
                  lambda s: torch.nn.functional.conv2d(s[0], s[1], None, stride, padding)),
        "dgrad": (lambda s: jitops.conv2d_input_grad(s[2], s[1], s[0].shape, *geometry),
                  lambda s: cudnn_input_grad(s[2], s[0], s[1], stride, padding)),
        "wgrad": (lambda s: jitops.conv2d_weight_grad(s[2], s[0], s[1].shape, *geometry),
                  lambda s: cudnn_weight_grad(s[2], s[0], s[1], stride, padding)),
    }
    classes = {"fprop": lambda s: jitops.find("conv2d").shape_class(s[0], s[1], None, *geometry),
               "dgrad": lambda s: jitops.find("conv2d_input_grad").shape_class(s[2], s[1], s[0].shape, *geometry),
               "wgrad": lambda s: jitops.find("conv2d_weight_grad").shape_class(s[2], s[0], s[1].shape, *geometry)}
    shape = f"{label} {c}->{k} {size}x{size} k{kernel}s{stride}"
    for name, (ours, base) in ops.items():
        if name not in operators:
            continue
        base_ms = None
        configs = [(t, s) for op, t, s in variants() if op == name] if sweep else [(None, None)]
        if wgrad_splits:  # wgrad only: every tile (or those of --tiles; or a kernel family) at these split counts
            if name != "wgrad":
                continue
            configs = [(t, s) for t in ([family] if family else tiles or conv_plan.OPERATOR_TILES["wgrad"])
                       for s in wgrad_splits]
        elif tiles:  # candidate tiles (conv_plan.TILES), the plan's split count for each
            configs = [(t, None) for t in tiles]
        elif name == "wgrad" and not sweep:
            configs.append(("torch-reduce", None))  # the plan with torch's sum and copy: an A/B of the reduction
        if family and not (sweep or tiles or wgrad_splits):
            configs.append((family, None))  # the same class on the other kernel family (JITOPS_CONV2D_SM90_KERNEL)
        if name == "wgrad":  # a tile over several filter taps runs only layers of its channels and filter width
            wgrad_c, wgrad_rs = ((conv_plan.round_up(c * kernel * kernel), (1, 1))
                                 if conv_plan._uses_im2col(c, kernel, kernel) else (c, (kernel, kernel)))
            configs = [(t, s) for t, s in configs if t not in conv_plan.TILES or
                       conv_plan.wgrad_tile_serves(t, wgrad_c, wgrad_rs)]
        for tile, splits in configs:
            if tile == "torch-reduce":  # the fp32 slices summed and copied by torch, as before the kernels
                knobs = dict(conv2d_wgrad_reduce_kernel=False, conv2d_wgrad_direct=False)  # a class of its own
            elif tile in FAMILIES:  # the same classes: the kernels loaded for the other setting must not answer
                knobs = dict(conv2d_sm90_kernel=tile, conv2d_splits={name: splits} if splits else {})
                jitops.clear_memory_cache()
            else:
                knobs = dict(conv2d_tile={name: tile}, conv2d_splits={name: splits})
            try:
                with jitops.config.scope(**knobs):
                    error = relative_error(ours(sets[0]), base(sets[0]))
                    cls = classes[name](sets[0])
                    chosen = f"{cls.tile}/{cls.splits}"
                    if base_ms is None:
                        base_ms = time_graphed([lambda s=s: base(s) for s in sets])
                    ours_ms = time_graphed([lambda s=s: ours(s) for s in sets])
                    family_name = f"{name} ({tile}{f', {splits} slices' if splits else ''})"
                    operator = f"{name} (torch reduce)" if tile == "torch-reduce" else \
                        family_name if tile in FAMILIES else name
                    label_tile = "" if tile is None else f" {tile} {chosen}" if tile in FAMILIES else f" {chosen}"
                    row = harness.Row(f"{name} gpu{label_tile}", shape, "fp16", ours_ms,
                                      base_ms, "cuDNN", "TFLOP/s", flops / ours_ms / 1e9, flops / base_ms / 1e9,
                                      base_ms / ours_ms, dict(rel_error=error, layer=label, operator=operator,
                                                              tile=chosen, timing="graph"))
                    bench.rows.append(row)
                    print(f"  {row.op:18s} {shape:34s} ours {ours_ms * 1e3:8.1f} us  cuDNN {base_ms * 1e3:8.1f} us  "
                          f"x{row.speedup:.2f}  {row.ours_rate:6.1f} TFLOP/s  err {error:.1e}", flush=True)
                    if tile is None and eager:
                        bench.compare(op=f"{name} eager", shape=shape, dtype="fp16", ours=lambda: ours(next_set()),
                                      baseline=lambda: base(next_set()), baseline_name="cuDNN", flops=flops,
                                      rel_error=error, layer=label, operator=name, tile="auto", timing="eager")
            except Exception as exc:  # a configuration that fails is reported, the sweep goes on
                print(f"  {name} {tile} {shape}: FAILED {type(exc).__name__}: {exc}", flush=True)
            if tile in FAMILIES:
                jitops.clear_memory_cache()


def weighted_totals(rows) -> dict[str, str]:
    """GPU time over the network's 53 conv layers (each layer's row times its OCCURRENCES), per operator, with
    and without the stem (L0), against cuDNN's: the issue's goal is stated over the ResNet-50 layers."""
    totals: dict[tuple[str, bool], list[float]] = {}
    for row in rows:
        extra = row.extra
        layer = extra.get("layer", "")
        automatic = row.op.endswith("gpu") or extra.get("operator", "").endswith(
            ("(torch reduce)", "(light)", "(cutlass)", " slices)"))
        if extra.get("timing") != "graph" or not automatic or not layer.startswith("L"):
            continue
        weight = OCCURRENCES[int(layer[1:])]
        for with_stem in (True, False):
            if with_stem or layer != "L0":
                sums = totals.setdefault((extra["operator"], with_stem), [0.0, 0.0])
                sums[0] += weight * row.ours_ms
                sums[1] += weight * row.baseline_ms
    return {f"ResNet-50 {op} weighted by occurrence ({'with' if stem else 'without'} the stem)":
            f"ours {ours:.3f} ms, cuDNN {base:.3f} ms, cuDNN time / ours {base / ours:.3f}"
            for (op, stem), (ours, base) in totals.items()}


def host_overhead_us(calls: int = 2000) -> dict[str, float]:
    """Wall microseconds per eager call on a tiny layer (GPU work negligible): Python, ctypes, CUTLASS's host
    side (TMA descriptors) and the launch for ours; the dispatcher and cuDNN's plan cache for torch."""
    x = torch.randn(1, 64, 8, 8, device="cuda", dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    w = torch.randn(64, 64, 3, 3, device="cuda", dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    paths = {"jitops.conv2d": lambda: jitops.conv2d(x, w, None, 1, 1),
             "torch conv2d (cuDNN)": lambda: torch.nn.functional.conv2d(x, w, None, 1, 1)}
    from harness import host_us

    times = host_us(*paths.values(), calls=calls, rounds=3, warmup=50)
    return {name: round(us, 1) for name, us in zip(paths, times)}


def cold_compile_seconds() -> dict[str, float]:
    """Compile seconds per conv configuration, CUTLASS's (nvcc) and the light kernel's (NVRTC, LIGHT_CONV), from
    the entries' meta.json (compile_seconds) of the caches in use (where a cache came from a pack, its builder's)."""
    import json

    seconds = {}
    roots = [Path(p) for p in os.environ.get("JITOPS_CACHE_PATH", "").split(os.pathsep) if p]
    roots.append(Path(jitops.config.cache_dir))
    operators = {"1": "fprop", "2": "dgrad", "3": "wgrad"}
    for root in roots:
        for meta in (*root.glob("v1/sm_90a/*/conv2d_*/meta.json"),
                     *root.glob("v1/sm_90a/*/gemm_sm90_light*/meta.json")):
            data = json.loads(meta.read_text())
            request = data.get("request", {})
            params = dict(request.get("params") or request.get("defines") or [])
            if request.get("kernel", "").startswith("conv2d_"):
                name = f"{request['kernel']} {request['dtype']} {params.get('TILE_M')}x{params.get('TILE_N')}"
            elif params.get("LIGHT_CONV", "0") != "0":
                name = (f"light {operators[params['LIGHT_CONV']]} {request['dtype']} 128x{params['LIGHT_TILE_N']}"
                        f"{' rows' if params.get('LIGHT_D_ROWS') == '1' else ''}")
            else:
                continue
            if "compile_seconds" in data:
                seconds[name] = round(float(data["compile_seconds"]), 1)
    return seconds


def report(path: str) -> str:
    """Markdown tables (GPU time and eager time per layer and operator, totals) from a results JSON."""
    import json

    data = json.loads(Path(path).read_text())
    rows = data["rows"]
    lines = [f"{data['device']['name']}, driver {data['device']['driver']}, torch {data['device']['torch']}, "
             f"{data['date']}: `{data['command']}`", ""]
    lines += ["| layer | operator | plan (tile/splits) | ours us (graph) | cuDNN us (graph) | cuDNN/ours | "
              "ours TFLOP/s | ours us (eager) | cuDNN us (eager) | cuDNN/ours (eager) |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    eager = {(r["extra"]["layer"], r["extra"]["operator"]): r for r in rows if r["extra"].get("timing") == "eager"}
    for r in rows:
        extra = r["extra"]
        if extra.get("timing") != "graph" or not r["op"].endswith("gpu"):
            continue
        e = eager.get((extra["layer"], extra["operator"]))
        tail = (f"{e['ours_ms'] * 1e3:.1f} | {e['baseline_ms'] * 1e3:.1f} | {e['speedup']:.2f}" if e else "- | - | -")
        lines.append(f"| {r['shape']} | {extra['operator']} | {extra['tile']} | {r['ours_ms'] * 1e3:.1f} | "
                     f"{r['baseline_ms'] * 1e3:.1f} | {r['speedup']:.2f} | {r['ours_rate']:.0f} | {tail} |")
    lines.append("")
    for key, value in data["summary"].items():
        lines.append(f"- {key}: {value}")
    return "\n".join(lines)


# --grouped (issue 19: depthwise and grouped conv2d at least x0.9 of cuDNN): layers of depthwise-separable and
# grouped networks at batch 32, channels_last, K = C.  jitops.conv2d runs groups != 1 through ATen (cuDNN), so
# the GPU rows time the same kernel on both sides and the eager rows the route's own cost around it.
GROUPED_LAYERS = [  # (network, C, input size, kernel, stride, padding, groups)
    ("MobileNetV2", 32, 112, 3, 1, 1, 32), ("MobileNetV2", 96, 112, 3, 2, 1, 96),
    ("MobileNetV2", 144, 56, 3, 1, 1, 144), ("MobileNetV2", 192, 28, 3, 2, 1, 192),
    ("MobileNetV2", 576, 14, 3, 1, 1, 576), ("MobileNetV2", 960, 7, 3, 1, 1, 960),
    ("ConvNeXt-T", 96, 56, 7, 1, 3, 96), ("ConvNeXt-T", 192, 28, 7, 1, 3, 192),
    ("ConvNeXt-T", 384, 14, 7, 1, 3, 384), ("ConvNeXt-T", 768, 7, 7, 1, 3, 768),
    ("ResNeXt-50 32x4d", 128, 56, 3, 1, 1, 32), ("ResNeXt-50 32x4d", 256, 28, 3, 1, 1, 32),
    ("ResNeXt-50 32x4d", 512, 14, 3, 1, 1, 32), ("ResNeXt-50 32x4d", 1024, 7, 3, 1, 1, 32),
]


def grouped(bench) -> list[float]:
    """jitops.conv2d against F.conv2d on GROUPED_LAYERS, forward, fp16, bf16 and fp32: GPU time (CUDA graph
    replays) and eager time (events around plain calls); returns the GPU rows' speeds."""
    speeds = []
    for dtype_name, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16), ("fp32", torch.float32)):
        for network, c, size, kernel, stride, padding, groups in GROUPED_LAYERS:
            x = torch.randn(BATCH, c, size, size, device="cuda", dtype=dtype)
            x = x.contiguous(memory_format=torch.channels_last)
            w = torch.randn(c, c // groups, kernel, kernel, device="cuda", dtype=dtype)
            w = w / (c // groups * kernel ** 2) ** 0.5
            w = w.contiguous(memory_format=torch.channels_last)
            out = conv_plan.output_size(size, kernel, stride, padding, 1)
            flops = 2.0 * BATCH * out * out * c * (c // groups) * kernel * kernel

            def ours(x=x, w=w, stride=stride, padding=padding, groups=groups):
                return jitops.conv2d(x, w, None, stride, padding, 1, groups)

            def theirs(x=x, w=w, stride=stride, padding=padding, groups=groups):
                return torch.nn.functional.conv2d(x, w, None, stride, padding, 1, groups)

            error = relative_error(ours(), theirs())
            if not error < 1e-2:
                raise SystemExit(f"bench_conv2d --grouped: {network} C={c} {dtype_name} differs by {error:.2e}")
            shape = f"{network} C{c} {size}x{size} k{kernel}s{stride} g{groups}"
            for timing, label in (("graph", "gpu"), ("events", "eager")):
                row = bench.compare(op=f"conv2d grouped fprop ({label})", shape=shape, dtype=dtype_name, ours=ours,
                                    baseline=theirs, baseline_name="F.conv2d (cuDNN)", flops=flops, timing=timing)
                if timing == "graph":
                    speeds.append(row.speedup)
    return speeds


def variant_of(args) -> str | None:
    """A sweep or a partial run names its variant, so its record does not replace the full run's
    (harness.save_record).  --light and --cutlass only add the other kernel family's rows to a full run."""
    parts = [part for part, on in (("sweep", args.sweep), ("tiles", args.tiles), ("splits", args.wgrad_splits),
                                   ("layers", args.layers), ("serial-dgrad-phases", args.serial_dgrad_phases)) if on]
    if args.operators != "fprop,dgrad,wgrad":
        parts.append(args.operators.replace(",", "-"))
    return "-".join(parts) or None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prewarm", metavar="ARCH", help="build every configuration for ARCH and exit (no GPU)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--sweep", action="store_true", help="time every tile configuration too")
    parser.add_argument("--wgrad-splits", default="", help="comma-separated split counts: time wgrad alone with "
                        "every tile at each (plan tuning), after the layer's automatic rows")
    parser.add_argument("--tiles", default="", help="comma-separated tile names (conv_plan.TILES, e.g. "
                        "128x128c2x1): time each for every operator, after the layer's automatic rows")
    parser.add_argument("--operators", default="fprop,dgrad,wgrad", help="comma-separated operators to time")
    parser.add_argument("--layers", default="", help="comma-separated layer indices (default: all)")
    parser.add_argument("--no-eager", action="store_true", help="GPU-time (graph) measurements only")
    parser.add_argument("--serial-dgrad-phases", action="store_true",
                        help="run a strided dgrad's phases one after another on the caller's stream (an A/B of "
                             "config.conv2d_dgrad_phase_streams)")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a sweep inside a short lease)")
    parser.add_argument("--report", metavar="JSON", help="print markdown tables of a results file and exit")
    parser.add_argument("--light", action="store_true", help="also time each operator on the light kernels "
                        "(JITOPS_CONV2D_SM90_KERNEL=light) with each layer's plan")
    parser.add_argument("--cutlass", action="store_true", help="also time each operator on CUTLASS's kernels "
                        "(JITOPS_CONV2D_SM90_KERNEL=cutlass) with each layer's plan")
    parser.add_argument("--grouped", action="store_true", help="depthwise and grouped layers (MobileNetV2, "
                        "ConvNeXt-T, ResNeXt-50) against cuDNN alone; needs no prebuilt kernels")
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
        return 0
    if args.prewarm:
        prewarm(args.prewarm, args.jobs, [t for t in args.tiles.split(",") if t], tuple(args.operators.split(",")))
        return 0

    if args.grouped:
        import harness

        torch.backends.cudnn.benchmark = True
        bench = harness.Bench("conv2d", baseline="cuDNN (F.conv2d, cudnn.benchmark on)", variant="grouped")
        speeds = grouped(bench)
        bench.summarize(grouped_gpu_min=round(min(speeds), 3), grouped_gpu_geomean=round(
            statistics.geometric_mean(speeds), 3), batch=BATCH)
        bench.finish()
        return 0
    if not (os.environ.get("JITOPS_CACHE_PATH") or os.environ.get("JITOPS_CONV2D_COMPILE_HERE")):
        # benchmarks/gpu_session.sh runs every benchmark: without prebuilt kernels this one would spend ~15
        # minutes of the GPU lease in nvcc.
        print("bench_conv2d: skipped: no prebuilt kernels (JITOPS_CACHE_PATH); build them with --prewarm sm_90a "
              "on any machine with nvcc (benchmarks/gpu_session.sh prebuilt), or set JITOPS_CONV2D_COMPILE_HERE=1")
        return 0

    import functools

    import harness

    if args.quick:
        REPLAYS["graph"] = 10
        harness.time_cuda = functools.partial(harness.time_cuda, warmup=3, reps=20, min_ms=40.0)
    torch.backends.cudnn.benchmark = True  # cuDNN's best algorithm per shape, as a tuned model would run it
    # Held for the rest of the run (this process runs one benchmark).
    contextlib.ExitStack().enter_context(jitops.config.scope(conv2d_dgrad_phase_streams=not args.serial_dgrad_phases))
    bench = harness.Bench("conv2d", baseline="cuDNN (torch conv2d and aten.convolution_backward, "
                          "cudnn.benchmark on)", variant=variant_of(args))
    layers = [("ref", *REFERENCE)] + [(f"L{i}", *layer) for i, layer in enumerate(conv_plan.RESNET50)]
    if args.layers:
        wanted = set(args.layers.split(","))
        layers = [layer for layer in layers if layer[0] in wanted or layer[0].removeprefix("L") in wanted]
    operators = tuple(args.operators.split(","))
    family = "light" if args.light else "cutlass" if args.cutlass else None
    for label, c, k, size, kernel, stride, padding in layers:
        bench_layer(bench, harness, c, k, size, kernel, stride, padding, label, eager=not args.no_eager,
                    operators=operators, family=family)
        if args.tiles and not args.wgrad_splits:
            bench_layer(bench, harness, c, k, size, kernel, stride, padding, label, eager=False,
                        tiles=args.tiles.split(","), operators=operators)
        if args.sweep:
            bench_layer(bench, harness, c, k, size, kernel, stride, padding, label, sweep=True, eager=False,
                        operators=operators)
        if args.wgrad_splits:
            splits = [int(v) for v in args.wgrad_splits.split(",")]
            bench_layer(bench, harness, c, k, size, kernel, stride, padding, label, eager=False, family=family,
                        wgrad_splits=splits, tiles=[t for t in args.tiles.split(",") if t], operators=operators)
    for timing in ("graph", "eager"):
        totals = {}
        for row in bench.rows:
            extra = row.extra
            if extra.get("timing") == timing and row.op.endswith(("gpu", "eager")) and \
                    extra.get("layer", "").startswith("L"):
                ours, base = totals.get(extra["operator"], (0.0, 0.0))
                totals[extra["operator"]] = (ours + row.ours_ms, base + row.baseline_ms)
        for name, (ours, base) in totals.items():
            bench.summarize(**{f"ResNet-50 {name} total ({timing})": f"ours {ours:.3f} ms, cuDNN {base:.3f} ms, "
                                                                 f"cuDNN time / ours {base / ours:.3f}"})
    for name, value in weighted_totals(bench.rows).items():
        bench.summarize(**{name: value})
    bench.summarize(host_overhead_us_per_call=host_overhead_us(), cold_compile_seconds=cold_compile_seconds(),
               cudnn_benchmark=True, batch=BATCH, dgrad_phase_streams=jitops.config.conv2d_dgrad_phase_streams)
    bench.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
