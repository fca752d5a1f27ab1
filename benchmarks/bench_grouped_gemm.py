"""jitops.grouped_gemm against torch._grouped_mm (and a Python loop of matmuls, and CUTLASS's grouped kernel that the
light kernels replaced) in the same run, bf16:

  - mixture of experts: 64 experts of 32 to 256 rows (uniform, fixed seed), K = 2048, N = 1024, device offsets;
    goal: 1.2 x torch._grouped_mm (which measured 245 TFLOP/s on the lent H100);
  - 8 uniform groups of 2048 x 4096 x 4096 (list form); goal: at least torch._grouped_mm (733 TFLOP/s);
  - the mixture of experts forward + backward (dx and dW), for information.

    python benchmarks/bench_grouped_gemm.py [--sweep]        # on the GPU; --sweep also times every tile config
    python benchmarks/bench_grouped_gemm.py --cold-compile   # on the GPU, fresh cache: first forward/backward
    python benchmarks/bench_grouped_gemm.py --prebuild DIR   # anywhere with nvcc: build every kernel the
                                                             # benchmark and the GPU tests use, for sm_90a

Cold compile seconds per kernel come from the cache entries' meta.json (the machine that built them) and, with
--cold-compile, from a fresh process on the GPU machine.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import torch  # noqa: E402

import jitops  # noqa: E402
from jitops.runtime import runtime  # noqa: E402
from jitops.specs import Target  # noqa: E402

from jitops.ops import grouped_gemm as gg
from jitops.ops import grouped_gemm_plan as gg_plan  # noqa: E402
SM90 = Target.parse("sm_90a")
BASELINE = "torch._grouped_mm; a Python loop of torch.mm (second row)"
MOE = {"experts": 64, "rows": (32, 256), "K": 2048, "N": 1024}
UNIFORM = {"groups": 8, "M": 2048, "K": 4096, "N": 4096}


def kernel_classes() -> list:
    """Every kernel class the benchmark and tests/test_grouped_gemm_gpu.py use (with JITOPS_GROUPED_PREBUILD=sweep:
    the forward kernel of each tile configuration, for --sweep and --sweep-only)."""
    if os.environ.get("JITOPS_GROUPED_PREBUILD") == "sweep":  # only the forward kernels the sweep times
        return [gg_plan.GemmKernelClass(torch.bfloat16, True, True, config) for config in gg_plan.CONFIGS]
    C = gg_plan.GemmKernelClass
    bf16, fp16 = torch.bfloat16, torch.float16
    layouts = [(True, True), (True, False), (False, True)]
    classes = [C(bf16, a, b, gg_plan.DEFAULT) for a, b in layouts + [(False, False)]]
    classes += [C(fp16, a, b, gg_plan.DEFAULT) for a, b in layouts]
    return classes


def request_for(kernel_class):
    return gg._kernels(gg_plan.RaggedClass("M", kernel_class, None, None), SM90)["gemm"]


def prebuild(workers: int) -> None:
    """Compile kernel_classes() for sm_90a into JITOPS_CACHE_DIR (no GPU needed)."""
    def build(kernel_class):
        request = request_for(kernel_class)
        started = time.perf_counter()
        outcome = runtime.prewarm(request, SM90)
        return kernel_class, outcome, time.perf_counter() - started

    started = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        for kernel_class, outcome, seconds in pool.map(build, kernel_classes()):
            print(f"  {outcome:8s} {seconds:6.1f} s  {describe(kernel_class)}", flush=True)
    print(f"prebuild: {time.perf_counter() - started:.0f} s with {workers} workers into {jitops.config.cache_dir}")


def describe(kernel_class) -> str:
    layout = ("N" if kernel_class.a_row else "T") + ("N" if kernel_class.b_row else "T")
    return f"{gg.shapes.dtype_name(kernel_class.dtype)} {layout} {kernel_class.config}"


def compile_seconds() -> dict[str, float]:
    """Compile seconds recorded in the cache entries of every kernel class (where it was built)."""
    seconds = {}
    for kernel_class in kernel_classes():
        request = request_for(kernel_class)
        key, _ = runtime.key_for(request, SM90)
        entry = runtime.find_entry(key, any_toolchain=True)
        if entry is not None:
            seconds[describe(kernel_class)] = entry.meta.get("compile_seconds")
    return seconds


# ---- inputs --------------------------------------------------------------------------------------------------
def moe_inputs(requires_grad: bool = False):
    g = torch.Generator().manual_seed(2024)
    lo, hi = MOE["rows"]
    sizes = torch.randint(lo, hi + 1, (MOE["experts"],), generator=g)
    total = int(sizes.sum())
    x = torch.randn(total, MOE["K"], generator=g).to("cuda", torch.bfloat16).requires_grad_(requires_grad)
    w = (torch.randn(MOE["experts"], MOE["K"], MOE["N"], generator=g) / MOE["K"] ** 0.5).to(
        "cuda", torch.bfloat16).requires_grad_(requires_grad)
    offsets = sizes.cumsum(0).to("cuda", torch.int32)
    return x, w, offsets, sizes.tolist()


def uniform_inputs():
    g = torch.Generator(device="cuda").manual_seed(7)
    shape = (UNIFORM["groups"], UNIFORM["M"], UNIFORM["K"])
    a = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn((UNIFORM["groups"], UNIFORM["K"], UNIFORM["N"]), device="cuda", dtype=torch.bfloat16,
                    generator=g) / UNIFORM["K"] ** 0.5
    return a, b


def relative_error(got, want) -> float:
    got, want = got.float(), want.float()
    return float((got - want).norm() / want.norm())


# ---- the benchmark -------------------------------------------------------------------------------------------
def sweep_only() -> None:
    x, w, offsets, _ = moe_inputs()
    a3, b3 = uniform_inputs()
    flops = 2 * x.shape[0] * MOE["K"] * MOE["N"]
    flops_uniform = 2 * UNIFORM["groups"] * UNIFORM["M"] * UNIFORM["K"] * UNIFORM["N"]
    results = run_sweep(x, w, offsets, list(a3.unbind(0)), list(b3.unbind(0)), flops, flops_uniform)
    from harness import save_record

    save_record("grouped_gemm", baseline=BASELINE, rows=[], variant="sweep",
                summary={"T": x.shape[0], "TFLOP/s by case and tile configuration": results})


def run(sweep: bool) -> None:
    from harness import Bench

    bench = Bench("grouped_gemm", baseline=BASELINE, rounds=5)  # ours and torch in 5 alternating rounds
    bench.summarize(prebuilt_compile_seconds=compile_seconds())

    # Mixture of experts, forward.
    x, w, offsets, sizes = moe_inputs()
    total = x.shape[0]
    flops = 2 * total * MOE["K"] * MOE["N"]
    bounds = [(int(e) - s, int(e)) for s, e in zip(sizes, torch.tensor(sizes).cumsum(0).tolist())]
    loop_out = torch.empty(total, MOE["N"], device="cuda", dtype=torch.bfloat16)

    def python_loop():
        for g, (s, e) in enumerate(bounds):
            torch.mm(x[s:e], w[g], out=loop_out[s:e])

    def check_moe():
        want = torch._grouped_mm(x, w, offs=offsets)
        error = relative_error(jitops.grouped_gemm(x, w, offsets=offsets), want)
        print(f"  moe: relative error vs torch._grouped_mm {error:.1e} (T = {total})")
        assert error < 1e-2, error

    shape = f"{MOE['experts']}x[{MOE['rows'][0]}-{MOE['rows'][1]}]x{MOE['K']}x{MOE['N']} T={total}"
    bench.compare(op="grouped_gemm moe fwd", shape=shape, dtype="bf16",
                  ours=lambda: jitops.grouped_gemm(x, w, offsets=offsets),
                  baseline=lambda: torch._grouped_mm(x, w, offs=offsets), baseline_name="torch._grouped_mm",
                  flops=flops, check=check_moe, config=gg.ragged_shape_class(x, w, offsets).kernel.config)
    bench.compare(op="grouped_gemm moe fwd", shape=shape, dtype="bf16",
                  ours=lambda: jitops.grouped_gemm(x, w, offsets=offsets), baseline=python_loop,
                  baseline_name="python loop of mm", flops=flops)

    # 8 uniform groups, list form.
    a3, b3 = uniform_inputs()
    As, Bs = list(a3.unbind(0)), list(b3.unbind(0))
    flops_uniform = 2 * UNIFORM["groups"] * UNIFORM["M"] * UNIFORM["K"] * UNIFORM["N"]

    def check_uniform():
        want = torch._grouped_mm(a3, b3)
        got = torch.stack(jitops.grouped_gemm(As, Bs))
        error = relative_error(got, want)
        print(f"  uniform: relative error vs torch._grouped_mm {error:.1e}")
        assert error < 1e-2, error

    shape_uniform = f"{UNIFORM['groups']}x{UNIFORM['M']}x{UNIFORM['K']}x{UNIFORM['N']}"
    bench.compare(op="grouped_gemm list fwd", shape=shape_uniform, dtype="bf16",
                  ours=lambda: jitops.grouped_gemm(As, Bs), baseline=lambda: torch._grouped_mm(a3, b3),
                  baseline_name="torch._grouped_mm", flops=flops_uniform, check=check_uniform,
                  config=gg.list_shape_class(As, Bs).kernel.config)

    # Mixture of experts, forward and backward (dx and dW): 3 x the forward's flops.
    xg, wg, offsets_g, _ = moe_inputs(requires_grad=True)
    grad = torch.randn(total, MOE["N"], device="cuda", dtype=torch.bfloat16)

    def ours_train():
        jitops.grouped_gemm(xg, wg, offsets=offsets_g).backward(grad)

    def torch_train():
        torch._grouped_mm(xg, wg, offs=offsets_g).backward(grad)

    try:
        torch_train()
        bench.compare(op="grouped_gemm moe fwd+bwd", shape=shape, dtype="bf16", ours=ours_train,
                      baseline=torch_train, baseline_name="torch._grouped_mm", flops=3 * flops)
    except RuntimeError as exc:  # an older torch without _grouped_mm's backward
        print(f"  moe fwd+bwd: torch._grouped_mm backward unavailable ({exc})")

    # The light kernels (the default) against CUTLASS's ptr-array grouped kernel (nvcc) on the same inputs: the light
    # kernels replaced it to compile in under a second, and must not be slower (issue 18: by 2% at most).
    def cutlass(fn):
        def call():
            with jitops.config.scope(grouped_gemm_config=gg_plan.DEFAULT):
                return fn()
        return call

    cutlass_name = f"jitops, CUTLASS's grouped kernel ({gg_plan.DEFAULT})"
    moe_forward = lambda: jitops.grouped_gemm(x, w, offsets=offsets)  # noqa: E731
    list_forward = lambda: jitops.grouped_gemm(As, Bs)  # noqa: E731
    bench.compare(op="grouped_gemm moe fwd", shape=shape, dtype="bf16", ours=moe_forward,
                  baseline=cutlass(moe_forward), baseline_name=cutlass_name, flops=flops)
    bench.compare(op="grouped_gemm list fwd", shape=shape_uniform, dtype="bf16", ours=list_forward,
                  baseline=cutlass(list_forward), baseline_name=cutlass_name, flops=flops_uniform)
    bench.compare(op="grouped_gemm moe fwd+bwd", shape=shape, dtype="bf16", ours=ours_train,
                  baseline=cutlass(ours_train), baseline_name=cutlass_name, flops=3 * flops)

    # The rows above time ours first, then the baseline; the GPU's clock can drift between the two.  Again with
    # the baseline first:
    from harness import copy_bandwidth, time_cuda
    reverse = {}
    for name, ours, baseline, f in (
            ("moe", lambda: jitops.grouped_gemm(x, w, offsets=offsets), lambda: torch._grouped_mm(x, w, offs=offsets),
             flops),
            ("uniform", lambda: jitops.grouped_gemm(As, Bs), lambda: torch._grouped_mm(a3, b3), flops_uniform)):
        base_ms = time_cuda(baseline)
        ours_ms = time_cuda(ours)
        reverse[name] = {"torch._grouped_mm TFLOP/s": round(f / base_ms / 1e9, 1),
                         "ours TFLOP/s": round(f / ours_ms / 1e9, 1), "ours/torch speed": round(base_ms / ours_ms, 3)}
        print(f"  {name} (baseline timed first): {reverse[name]}")
    bench.summarize(baseline_first=reverse, copy_bandwidth_TBps=round(copy_bandwidth(), 3))
    if sweep:
        bench.summarize(sweep=run_sweep(x, w, offsets, As, Bs, flops, flops_uniform))
    bench.finish()


def run_sweep(x, w, offsets, As, Bs, flops, flops_uniform) -> dict:
    """TFLOP/s of each tile configuration and tile order on both cases, with torch._grouped_mm timed alongside
    (kernels that are not cached are skipped)."""
    from harness import copy_bandwidth, time_cuda

    a3, b3 = torch.stack(As), torch.stack(Bs)
    results = {"copy TB/s": round(copy_bandwidth(), 3)}
    cases = (("moe", lambda: jitops.grouped_gemm(x, w, offsets=offsets), flops,
              lambda: torch._grouped_mm(x, w, offs=offsets), [(0, 1), (1, 1)]),
             ("uniform", lambda: jitops.grouped_gemm(As, Bs), flops_uniform, lambda: torch._grouped_mm(a3, b3),
              [(r, s) for s in (1, 2, 4, 8) for r in (0, 1)]))
    for name, fn, f, baseline, schedules in cases:
        ms = time_cuda(baseline, min_ms=100.0)
        results[f"{name} torch._grouped_mm"] = round(f / (ms * 1e-3) / 1e12, 1)
        print(f"  sweep {name:8s} {'torch._grouped_mm':32s} {results[f'{name} torch._grouped_mm']:6.1f} TFLOP/s")
        for config in gg_plan.LIGHT_CONFIGS + gg_plan.CONFIGS:
            for schedule in schedules[:1] if gg_plan.is_light(config) else schedules:  # light: one tile order
                with jitops.config.scope(grouped_gemm_config=config, grouped_gemm_schedule=schedule):
                    try:
                        with jitops.config.scope(offline=True):
                            fn()
                    except jitops.CacheMissError:
                        break
                    ms = time_cuda(fn, min_ms=60.0)
                label = f"{name} {config} r{schedule[0]}s{schedule[1]}"
                results[label] = round(f / (ms * 1e-3) / 1e12, 1)
                print(f"  sweep {label:41s} {results[label]:6.1f} TFLOP/s", flush=True)
    return results


# ---- cold compile on this machine ----------------------------------------------------------------------------
COLD_CHILD = r"""
import sys, time, torch
sys.path.insert(0, {repo!r})
import jitops
x = torch.randn(4000, 2048, device="cuda", dtype=torch.bfloat16, requires_grad=True)
w = torch.randn(32, 2048, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
sizes = torch.full((32,), 125, device="cuda")
torch.cuda.synchronize()
t0 = time.perf_counter()
y = jitops.grouped_gemm(x, w, sizes=sizes)
torch.cuda.synchronize()
t1 = time.perf_counter()
y.backward(torch.ones_like(y))
torch.cuda.synchronize()
t2 = time.perf_counter()
print("COLD", {{"first_forward_s": round(t1 - t0, 1), "first_backward_s": round(t2 - t1, 1),
               "compiles": jitops.stats.compiles, "compile_seconds_total": round(jitops.stats.compile_seconds, 1)}})
"""


def cold_compile() -> None:
    """A fresh process with an empty cache: the first forward compiles its kernel while the two backward kernels
    compile in background threads; the first backward then waits only for what is left."""
    with tempfile.TemporaryDirectory() as cache:
        env = {k: v for k, v in os.environ.items() if k not in ("JITOPS_CACHE_PATH", "JITOPS_OFFLINE")}
        env["JITOPS_CACHE_DIR"] = cache
        started = time.perf_counter()
        result = subprocess.run([sys.executable, "-c", COLD_CHILD.format(repo=str(HERE.parent))], env=env,
                                capture_output=True, text=True)
        print(result.stdout[-2000:], result.stderr[-3000:])
        print(f"cold-compile child: {time.perf_counter() - started:.1f} s wall, {os.cpu_count()} CPUs")
        for line in result.stdout.splitlines():
            if line.startswith("COLD"):
                from harness import save_record

                save_record("grouped_gemm", baseline="none (compile time)", rows=[], variant="cold",
                            summary={"cpus": os.cpu_count(), "cold compile": line[5:]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="also time every cached tile configuration")
    parser.add_argument("--sweep-only", action="store_true", help="only the tile configuration sweep")
    parser.add_argument("--prebuild", metavar="DIR", help="compile the kernels for sm_90a into DIR (no GPU)")
    parser.add_argument("--workers", type=int, default=2, help="parallel nvcc processes for --prebuild")
    parser.add_argument("--cold-compile", action="store_true", help="first call in a fresh process, empty cache")
    args = parser.parse_args()
    if args.prebuild:
        with jitops.config.scope(cache_dir=Path(args.prebuild), cache_path=()):
            prebuild(args.workers)
        return
    if args.cold_compile:
        cold_compile()
        return
    if args.sweep_only:
        sweep_only()
        return
    run(args.sweep)


if __name__ == "__main__":
    main()
