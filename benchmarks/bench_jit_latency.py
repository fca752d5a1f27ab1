"""JIT latency: cold compile, first call in a fresh process on a warm disk cache, and hot per-call overhead,
for one gelu kernel done four ways in the same run on the same GPU: jitops (NVRTC), torch load_inline, a CuPy
RawModule and a Triton kernel.  Also the hot cost of jitops.add against torch.add on 1-element tensors, and
(method layer_norm) the same three figures for jitops.layer_norm's forward + backward kernels.

    python benchmarks/bench_jit_latency.py
    python benchmarks/bench_jit_latency.py --methods jitops,layer_norm     # without the other tools' cold runs
    python benchmarks/bench_jit_latency.py --cold-compile [FAMILY,...]     # no GPU needed
    python benchmarks/bench_jit_latency.py --cpu-add    # jitops.add's hot calls on the CPU, no GPU needed
    python benchmarks/bench_jit_latency.py --cpu-host   # gemm, linear, layer_norm, gelu host time on the CPU
    python benchmarks/bench_jit_latency.py --cpu-host-profile   # where each of those calls spends it (cProfile)

--cold-compile: one kernel of each CUTLASS family compiled for sm_90a (sm_80 for the CUTLASS 2 GEMM), and gelu's
CPU kernel built two ways, into an empty cache, each in a fresh process, timed from the request to the published
entry; the machine's cores are printed with it (compiles use one core each).  Families: COMPILE_FAMILIES below.

Every cold and warm figure is one fresh Python process (torch imported and CUDA initialised before the clock
starts), repeated; the table shows the median.  Hot figures are wall-clock microseconds per call over 20000 calls
on 1-element tensors (CPU-bound: this is the per-call overhead), against the torch op of the row timed in the
same process (harness.host_us).  The record has one row per method; a run without every method of FULL is a
variant (benchmarks/out/).
"""
from __future__ import annotations

import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

GELU_CUDA = r"""
#include <cuda_bf16.h>
extern "C" __global__ void gelu_tanh_bf16(const __nv_bfloat16* x, __nv_bfloat16* y, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) {
    float v = __bfloat162float(x[i]);
    y[i] = __float2bfloat16(0.5f * v * (1.f + tanhf(0.79788456f * (v + 0.044715f * v * v * v))));
  }
}
"""

LOAD_INLINE_CPP = "torch::Tensor gelu_tanh(torch::Tensor x);"
LOAD_INLINE_CU = GELU_CUDA + r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
torch::Tensor gelu_tanh(torch::Tensor x) {
  auto y = torch::empty_like(x);
  long long n = x.numel();
  gelu_tanh_bf16<<<(n + 255) / 256, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<const __nv_bfloat16*>(x.data_ptr()), reinterpret_cast<__nv_bfloat16*>(y.data_ptr()), n);
  return y;
}
"""


def child(method: str, cache: str) -> dict:
    """One fresh process: import torch, init CUDA, then time the first call and the hot calls."""
    import torch

    torch.cuda.init()
    x = torch.randn(1 << 20, device="cuda", dtype=torch.bfloat16)
    tiny = torch.randn(1, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    result: dict = {}
    # Imports happen before the clock starts (a program imports its libraries at the top); the clock covers
    # the first call: cache lookup, compile or load, launch, result.
    if method in ("jitops", "jitops-preloaded"):
        os.environ["JITOPS_CACHE_DIR"] = cache
        import jitops

        if method == "jitops-preloaded":  # separates the one-time import of CuPy's driver binding
            loaded = time.perf_counter()
            from cupy_backends.cuda.api import driver  # noqa: F401
            result["driver_import_ms"] = (time.perf_counter() - loaded) * 1e3

        call = lambda t: jitops.gelu(t, "tanh")  # noqa: E731
        started = time.perf_counter()
        y = call(x)
        torch.cuda.synchronize()
        result["first_ms"] = (time.perf_counter() - started) * 1e3
        a = torch.randn(1 << 20, device="cuda")
        second = time.perf_counter()
        jitops.add(a, a)
        torch.cuda.synchronize()
        result["second_kernel_ms"] = (time.perf_counter() - second) * 1e3
        result["stats"] = jitops.stats.as_dict()
    elif method == "load_inline":
        from torch.utils.cpp_extension import load_inline

        started = time.perf_counter()
        module = load_inline("gelu_tanh_ext", [LOAD_INLINE_CPP], cuda_sources=[LOAD_INLINE_CU],
                             functions=["gelu_tanh"], build_directory=cache, verbose=False,
                             extra_cuda_cflags=["-gencode=arch=compute_90,code=sm_90"])
        call = module.gelu_tanh
        y = call(x)
        torch.cuda.synchronize()
        result["first_ms"] = (time.perf_counter() - started) * 1e3
    elif method == "cupy":
        os.environ["CUPY_CACHE_DIR"] = cache
        import cupy

        started = time.perf_counter()
        kernel = cupy.RawModule(code=GELU_CUDA, options=("-std=c++17",)).get_function("gelu_tanh_bf16")
        stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)

        def call(t):
            out = torch.empty_like(t)
            n = t.numel()
            kernel(((n + 255) // 256,), (256,), (t.data_ptr(), out.data_ptr(), n), stream=stream)
            return out

        y = call(x)
        torch.cuda.synchronize()
        result["first_ms"] = (time.perf_counter() - started) * 1e3
    elif method == "triton":
        os.environ["TRITON_CACHE_DIR"] = cache
        import triton
        import triton.language as tl

        @triton.jit
        def gelu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offsets < n
            v = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)
            inner = 0.79788456 * (v + 0.044715 * v * v * v)
            tanh = 2.0 * tl.sigmoid(2.0 * inner) - 1.0
            tl.store(y_ptr + offsets, (0.5 * v * (1.0 + tanh)).to(tl.bfloat16), mask=mask)

        def call(t):
            out = torch.empty_like(t)
            n = t.numel()
            gelu_kernel[(triton.cdiv(n, 1024),)](t, out, n, BLOCK=1024)
            return out

        started = time.perf_counter()
        y = call(x)
        torch.cuda.synchronize()
        result["first_ms"] = (time.perf_counter() - started) * 1e3
    elif method == "layer_norm":
        # jitops only: layer_norm forward + backward through autograd (3 kernels: forward, backward, reduce).
        os.environ["JITOPS_CACHE_DIR"] = cache
        import jitops

        F = torch.nn.functional
        h = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = torch.randn(1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        b = torch.randn(1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        started = time.perf_counter()
        out = jitops.layer_norm(h, [1024], w, b)
        out.sum().backward()
        torch.cuda.synchronize()
        result["first_ms"] = (time.perf_counter() - started) * 1e3
        result["stats"] = jitops.stats.as_dict()
        expected = F.layer_norm(h.detach().float(), [1024], w.detach().float(), b.detach().float())
        result["max_error"] = (out.detach().float() - expected).abs().max().item()
        th = torch.randn(1, 128, device="cuda", dtype=torch.bfloat16)
        tw = torch.randn(128, device="cuda", dtype=torch.bfloat16)
        tb = torch.randn(128, device="cuda", dtype=torch.bfloat16)
        result["hot_us"], result["baseline_hot_us"] = hot_pair(lambda: jitops.layer_norm(th, [128], tw, tb),
                                                                 lambda: F.layer_norm(th, [128], tw, tb))
        return result
    else:
        raise SystemExit(f"unknown method {method}")
    expected = torch.nn.functional.gelu(x.float(), approximate="tanh")
    result["max_error"] = (y.float() - expected).abs().max().item()
    result["hot_us"], result["baseline_hot_us"] = hot_pair(
        lambda: call(tiny), lambda: torch.nn.functional.gelu(tiny, approximate="tanh"))
    if method == "jitops":
        import jitops

        a, b = torch.randn(1, device="cuda"), torch.randn(1, device="cuda")
        result["add_hot_us"], result["torch_add_hot_us"] = hot_pair(lambda: jitops.add(a, b),
                                                                    lambda: torch.add(a, b))
        ag = a.clone().requires_grad_()
        result["add_grad_hot_us"], result["torch_add_grad_hot_us"] = hot_pair(lambda: jitops.add(ag, b),
                                                                              lambda: torch.add(ag, b))
    return result


# One representative kernel per family: the first prewarm manifest item of its op (a large bf16 layer).
# gemm_sm90 is the NVRTC build jitops.gemm runs; gemm_sm90_nvcc the same kernel with CUTLASS's host code, built
# by nvcc (the reference of the bit-for-bit test, and what jitops.gemm compiled before).  gemm_sm90_light is the
# raw-PTX kernel JITOPS_GEMM_SM90_KERNEL=light builds for the same class with b K-major (x @ w.t()), and
# gemm_sm90_light_fused its fused-epilogue build (bias and activation).  grouped_gemm is the light kernel
# jitops.grouped_gemm builds (its ragged M form), grouped_gemm_cutlass CUTLASS's ptr-array kernel, nvcc.
# cpu_cxx is jitops.gelu's fp32 CPU kernel as jitops builds it (CppLibrary: the C++ compiler, a C ABI);
# cpu_load_inline the same kernel code built as before, through load_inline with tensor wrappers (CppExtension).
COMPILE_FAMILIES = ("gemm_sm90", "gemm_sm90_nvcc", "gemm_sm80", "grouped_gemm", "grouped_gemm_cutlass", "conv2d",
                    "conv2d_cutlass",
                    "gemm_sm90_light", "gemm_sm90_light_fused", "cpu_cxx", "cpu_load_inline")
GELU_CPU_WRAPPERS = """
#include <torch/extension.h>
#include "cpu/gelu.cpp"
void gelu_forward_tensors(at::Tensor x, at::Tensor y, int64_t approximate) {
  gelu_forward(x.data_ptr<SCALAR_T>(), y.data_ptr<SCALAR_T>(), x.numel(), static_cast<int32_t>(approximate));
}
"""


def _cpu_family_request(family: str):
    import jitops
    from jitops.ops import gelu

    if family == "cpu_cxx":
        return gelu.GELU_CPU.bind("fp32", SCALAR_T="float")
    spec = jitops.CppExtension("gelu_cpu_load_inline", jitops.Source.inline("gelu_cpu_tensors.cpp", GELU_CPU_WRAPPERS),
                               functions=("gelu_forward_tensors",), cuda=False)
    return spec.bind("fp32", SCALAR_T="float")


def family_request(family: str):
    import jitops
    from jitops.ops import PREWARM, gemm, gemm_plan
    from jitops.specs import Target

    if family.startswith("cpu_"):
        return _cpu_family_request(family), Target("cpu")
    op_name = {"gemm_sm90": "gemm", "gemm_sm90_nvcc": "gemm", "gemm_sm80": "gemm", "gemm_sm90_light": "gemm",
               "gemm_sm90_light_fused": "gemm", "conv2d_cutlass": "conv2d",
               "grouped_gemm_cutlass": "grouped_gemm"}.get(family, family)
    item = next(i for i in PREWARM if i["op"].removeprefix("jitops::") == op_name)
    target = Target.parse("sm_80" if family == "gemm_sm80" else "sm_90a")
    if op_name == "grouped_gemm":  # a public name over two ops (list and ragged forms): the manifest planner
        from cache_tools import manifest as cache_manifest

        kernels = "cutlass" if family == "grouped_gemm_cutlass" else jitops.config.grouped_gemm_sm90_kernel
        with jitops.config.scope(grouped_gemm_sm90_kernel=kernels):  # the light kernel, or CUTLASS's
            plan = cache_manifest.plan(cache_manifest.parse_item(item, (), "PREWARM"), (target.arch(True),))
        return plan.jobs[0].request, plan.jobs[0].target
    op = jitops.find(item["op"])
    args = op.example_args(item["dtypes"][0], item["shapes"][0], item.get("kwargs", {}),
                           (item.get("strides") or [None])[0])
    kernels = "cutlass" if family == "conv2d_cutlass" else jitops.config.conv2d_sm90_kernel
    with jitops.config.scope(conv2d_sm90_kernel=kernels):  # conv2d: the light kernel, or CUTLASS's
        requests = op.requests_for(args, target)
    if family in ("gemm_sm90", "gemm_sm90_nvcc"):  # CUTLASS's kernel (JITOPS_GEMM_SM90_KERNEL=cutlass)
        cls = op.shape_class(*args)
        make = gemm.sm90_request if family == "gemm_sm90" else gemm.sm90_reference_request
        return make(cls, gemm_plan.SM90_CONFIGS[cls.bucket]), target
    if family.startswith("gemm_sm90_light"):
        from jitops import light_gemm

        cls = op.shape_class(*args)._replace(b_kmajor=True, fused=family.endswith("_fused"))
        return light_gemm.request(cls), target
    return next(iter(requests.values())), target


def compile_child(family: str, cache: str) -> dict:
    """One fresh process: build one family's kernel into an empty cache (no GPU needed)."""
    os.environ["JITOPS_CACHE_DIR"] = cache
    import jitops

    request, target = family_request(family)
    started = time.perf_counter()
    outcome = jitops.runtime.prewarm(request, target)
    return {"seconds": time.perf_counter() - started, "outcome": outcome, "backend": request.backend,
            "kernel": request.label()[:120], "arch": request.arch(target)}


def cold_compile(families: list[str]) -> None:
    """Cold compile seconds per kernel family, one fresh process and one empty cache each."""
    cores = os.cpu_count()
    rows = {}
    for family in families:
        with tempfile.TemporaryDirectory(prefix=f"cold-{family}-") as cache:
            out = subprocess.run([sys.executable, __file__, "--compile-child", family, cache], capture_output=True,
                                 text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        if out.returncode != 0:
            raise SystemExit(f"{family} compile failed:\n{out.stderr[-4000:]}")
        rows[family] = json.loads(out.stdout.strip().splitlines()[-1])
        print(family, json.dumps(rows[family]), flush=True)
    print(f"\n| family | backend | arch | cold compile (s), {cores} cores |")
    print("| --- | --- | --- | --- |")
    for family, r in rows.items():
        print(f"| {family} | {r['backend']} | {r['arch']} | {r['seconds']:.1f} |")
    out_dir = os.environ.get("JITOPS_BENCH_OUT")
    if out_dir:
        Path(out_dir, "cold_compile.json").write_text(json.dumps({"cores": cores, "families": rows}, indent=1))


def cpu_add() -> None:
    """jitops.add's hot calls on CPU tensors against torch.add on the same inputs (the host's per-call cost of
    jitops' Python and the load_inline kernel, which the CPU path shares with the GPU's up to the launch): the
    common call (one shape, one dtype), with requires_grad, and the general path's calls (broadcast, alpha, a
    Python number).  Variant record in benchmarks/out/ (the full record is the GPU run's)."""
    import torch

    import jitops
    from harness import host_us, save_record

    started = datetime.datetime.now(datetime.timezone.utc)
    a, b = torch.randn(1), torch.randn(1)
    ag = a.clone().requires_grad_()
    row, col = torch.randn(8, 8), torch.randn(8)
    calls = {"same shape": ((a, b), {}), "same shape, requires_grad": ((ag, b), {}),
             "(8, 8) + (8,) broadcast": ((row, col), {}), "alpha=2": ((a, b), {"alpha": 2}),
             "tensor + 2.0": ((a, 2.0), {})}
    rows = []
    print("| jitops.add call (CPU) | jitops (us) | torch.add (us) | ratio |\n| --- | --- | --- | --- |")
    for name, (args, kwargs) in calls.items():
        ours, theirs = host_us(lambda: jitops.add(*args, **kwargs), lambda: torch.add(*args, **kwargs))
        rows.append({"op": "add", "call": name, "ours_us": round(ours, 3), "baseline_us": round(theirs, 3),
                     "ratio": round(ours / theirs, 3)})
        print(f"| {name} | {ours:.2f} | {theirs:.2f} | {ours / theirs:.2f} |")
    path, _ = save_record("jit_latency", baseline="torch.add on the same CPU tensors", rows=rows,
                          summary={"same-shape ratio": rows[0]["ratio"]}, variant="cpu-add", started=started)
    print(f"\nJSON: {path}")


def cpu_host_calls():
    """The calls of --cpu-host: (name, jitops call, torch call, calls a round), on tiny fp32 tensors, so that the
    figure is the host's per-call cost (Python, dispatch, autograd), which the CUDA path shares up to the launch.
    Forward + backward rows run y.backward(dy) with a fixed dy, gradients accumulating (never read)."""
    import torch
    import torch.nn.functional as F

    import jitops

    torch.manual_seed(0)
    m, k, n = 4, 16, 16
    x, w, w_nk, b = torch.randn(m, k), torch.randn(k, n), torch.randn(n, k), torch.randn(n)
    xg, wg, w_nkg, bg = (t.clone().requires_grad_() for t in (x, w, w_nk, b))
    h, hw, hb = torch.randn(m, n), torch.randn(n), torch.randn(n)
    hg, hwg, hbg = (t.clone().requires_grad_() for t in (h, hw, hb))
    dy = torch.ones(m, n)

    def backward(call):
        return lambda: call().backward(dy)

    return [
        ("gemm(x, w) vs torch.mm", lambda: jitops.gemm(x, w), lambda: torch.mm(x, w), 5000),
        ("gemm, x requires_grad vs torch.mm", lambda: jitops.gemm(xg, w), lambda: torch.mm(xg, w), 5000),
        ("gemm(x, w.t(), bias=b) vs F.linear", lambda: jitops.gemm(x, w_nk.t(), bias=b),
         lambda: F.linear(x, w_nk, b), 5000),
        ("linear(x, w, b) vs F.linear", lambda: jitops.linear(x, w_nk, b), lambda: F.linear(x, w_nk, b), 5000),
        ("linear, requires_grad vs F.linear", lambda: jitops.linear(xg, w_nkg, bg),
         lambda: F.linear(xg, w_nkg, bg), 5000),
        ("layer_norm vs F.layer_norm", lambda: jitops.layer_norm(h, [n], hw, hb),
         lambda: F.layer_norm(h, [n], hw, hb), 5000),
        ("layer_norm, requires_grad vs F.layer_norm", lambda: jitops.layer_norm(hg, [n], hwg, hbg),
         lambda: F.layer_norm(hg, [n], hwg, hbg), 5000),
        ("gelu vs F.gelu", lambda: jitops.gelu(h), lambda: F.gelu(h), 5000),
        ("gelu, requires_grad vs F.gelu", lambda: jitops.gelu(hg), lambda: F.gelu(hg), 5000),
        ("gemm forward + backward vs torch.mm", backward(lambda: jitops.gemm(xg, wg)),
         backward(lambda: torch.mm(xg, wg)), 1000),
        ("linear forward + backward vs F.linear", backward(lambda: jitops.linear(xg, w_nkg, bg)),
         backward(lambda: F.linear(xg, w_nkg, bg)), 1000),
        ("layer_norm forward + backward vs F.layer_norm", backward(lambda: jitops.layer_norm(hg, [n], hwg, hbg)),
         backward(lambda: F.layer_norm(hg, [n], hwg, hbg)), 1000),
        ("gelu forward + backward vs F.gelu", backward(lambda: jitops.gelu(hg)), backward(lambda: F.gelu(hg)), 1000),
    ]


def cpu_dispatch_calls():
    """jitops' own dispatch on the CPU: an op whose shape class and run function do nothing (a constant class; x,
    or a detached x with a gradient), against a plain Python function and an autograd.Function that does the
    same, so the difference is the generated function's guards, the memo lookup and the route (with a gradient:
    the C apply, the slot and the generated backward)."""
    import torch

    import jitops

    def nothing(k, x, alpha, z):
        return x

    def detached(k, x, alpha, z):
        return x.detach()  # a new tensor, as a kernel's output is

    nothing_op = jitops.op("benchprobe::nothing(Tensor x, float alpha, Tensor? z=None) -> Tensor",
                           shape_class=lambda x, alpha, z: 1, fake=lambda x, alpha, z: torch.empty_like(x),
                           cpu=jitops.Impl(lambda cls, target: {}, nothing))
    grad_op = jitops.op("benchprobe::nothing_grad(Tensor x, float alpha, Tensor? z=None) -> Tensor",
                        shape_class=lambda x, alpha, z: 1, fake=lambda x, alpha, z: torch.empty_like(x),
                        cpu=jitops.Impl(lambda cls, target: {}, detached),
                        setup_context=lambda ctx, inputs, output: None, backward=lambda ctx, grad: (grad, None))

    class Nothing(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, alpha, z):
            return x.detach()

        @staticmethod
        def backward(ctx, grad):
            return grad, None, None

    def python(x, alpha, z=None):
        return x

    x = torch.randn(4)
    xg = x.clone().requires_grad_()
    dy = torch.ones(4)
    return [
        ("dispatch alone vs a Python function", lambda: nothing_op(x, 1.0), lambda: python(x, 1.0), 20000),
        ("dispatch alone, requires_grad vs autograd.Function.apply", lambda: grad_op(xg, 1.0),
         lambda: Nothing.apply(xg, 1.0, None), 20000),
        ("dispatch alone, forward + backward vs the same", lambda: grad_op(xg, 1.0).backward(dy),
         lambda: Nothing.apply(xg, 1.0, None).backward(dy), 3000),
    ]


def cpu_host_profile(top: int = 8) -> None:
    """Where each --cpu-host row's jitops call spends its time: cProfile's top functions by own time (the
    profiler inflates every Python call alike; the ranking is what counts)."""
    import cProfile
    import io
    import pstats

    import torch

    torch.set_num_threads(1)
    for name, ours, _, count in cpu_host_calls():
        for _ in range(200):
            ours()
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(count):
            ours()
        profile.disable()
        stats = pstats.Stats(profile, stream=io.StringIO())
        print(f"\n## {name}: {stats.total_tt / count * 1e6:.1f} us a call under cProfile ({count} calls)")
        for (path, line, function), (_, calls, own, _, _) in sorted(stats.stats.items(), key=lambda i: -i[1][2])[:top]:
            where = f"{Path(path).name}:{line}({function})" if line else function
            print(f"  {own / count * 1e6:6.2f} us  {calls / count:4.1f}x  {where}")


def cpu_host() -> None:
    """Issue 17's CPU table: the host time of jitops.gemm, linear, layer_norm and gelu against the torch op each
    replaces, alternating in one process (harness.host_us), one thread, kernels already cached.  Variant
    record in benchmarks/out/."""
    import torch

    from harness import host_us, save_record

    torch.set_num_threads(1)
    started = datetime.datetime.now(datetime.timezone.utc)
    calls = cpu_host_calls()
    for _, ours, theirs, _ in calls:  # the first call of each loads (or compiles) its kernels
        ours(), theirs()
    rows = []
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    print("| call (CPU, fp32, one thread) | jitops (us) | torch (us) | ratio |\n| --- | --- | --- | --- |")
    for name, ours, theirs, count in calls + cpu_dispatch_calls():
        mine, base = host_us(ours, theirs, calls=count, rounds=5, warmup=max(count // 10, 100))
        rows.append({"call": name, "ours_us": round(mine, 2), "baseline_us": round(base, 2),
                     "ratio": round(mine / base, 2)})
        print(f"| {name} | {mine:.1f} | {base:.1f} | {mine / base:.2f} |", flush=True)
    load = os.getloadavg()
    print(f"load average after: {' '.join(f'{v:.2f}' for v in load)}")
    path, _ = save_record("jit_latency", baseline="the torch op each call replaces, alternating in one process",
                          rows=rows, summary={"load average": [round(v, 2) for v in load]}, variant="cpu-host",
                          started=started)
    print(f"\nJSON: {path}")


def hot_pair(fn, baseline) -> tuple[float, float]:
    from harness import host_us

    return tuple(host_us(fn, baseline))  # type: ignore[return-value]


def run_child(method: str, cache: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", method, cache], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONUNBUFFERED="1"))
    if out.returncode != 0:
        raise SystemExit(f"{method} child failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# The methods of a full run (jitops-preloaded is a diagnostic of the first call), and what each row times.
FULL = ("jitops", "cupy", "triton", "load_inline", "layer_norm")
OPS = {"layer_norm": ("layer_norm fwd+bwd (4096, 1024) bf16, 3 kernels; hot: (1, 128) bf16, no grad",
                      "F.layer_norm")}
GELU = ("gelu tanh bf16; hot: 1 element", "F.gelu")


def main() -> None:
    from harness import save_record

    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    every = "jitops,jitops-preloaded,cupy,triton,load_inline,layer_norm"
    parser.add_argument("--methods", default=os.environ.get("JITOPS_LATENCY_METHODS", every),
                        help="comma-separated subset of jitops, jitops-preloaded, cupy, triton, load_inline, "
                             "layer_norm (default: $JITOPS_LATENCY_METHODS or all)")
    methods = parser.parse_args().methods.split(",")
    repeats = int(os.environ.get("JITOPS_LATENCY_REPEATS", "3"))
    started = datetime.datetime.now(datetime.timezone.utc)
    rows = {}
    for method in methods:
        cold, warm = [], []
        for _ in range(1 if method == "load_inline" else repeats):  # load_inline cold is ~40 s
            cache = tempfile.mkdtemp(prefix=f"latency-{method}-")
            cold.append(run_child(method, cache))
        for _ in range(repeats):
            warm.append(run_child(method, cache))
        rows[method] = {
            "cold_first_ms": statistics.median(r["first_ms"] for r in cold),
            "warm_first_ms": statistics.median(r["first_ms"] for r in warm),
            "hot_us": statistics.median(r["hot_us"] for r in warm),
            "baseline_hot_us": statistics.median(r["baseline_hot_us"] for r in warm),
            "max_error": max(r["max_error"] for r in cold + warm),
        }
        if method == "jitops-preloaded":
            rows[method]["driver_import_ms"] = statistics.median(r["driver_import_ms"] for r in warm)
        if method.startswith("jitops"):
            rows[method]["warm_second_kernel_ms"] = statistics.median(r["second_kernel_ms"] for r in warm)
        if method == "jitops":
            rows[method]["warm_stats"] = warm[-1]["stats"]
            for key in ("add_hot_us", "torch_add_hot_us", "add_grad_hot_us", "torch_add_grad_hot_us"):
                rows[method][key] = statistics.median(r[key] for r in warm)
        print(method, json.dumps(rows[method]), flush=True)
    print("\n| method | cold first call (ms) | warm first call, fresh process (ms) | hot call (us) | "
          "hot / torch op (gelu; layer_norm for its row) |")
    print("| --- | --- | --- | --- | --- |")
    for method, r in rows.items():
        print(f"| {method} | {r['cold_first_ms']:.1f} | {r['warm_first_ms']:.2f} | {r['hot_us']:.2f} | "
              f"{r['hot_us'] / r['baseline_hot_us']:.2f} |")
    if "layer_norm" in rows:
        print("\nlayer_norm row: forward + backward through autograd, (4096, 1024) bf16 (3 kernels); hot call: "
              "jitops.layer_norm vs F.layer_norm on (1, 128) bf16, no grad")
    summary = {}
    if "jitops" in rows:
        summary = report_jitops(rows)
    record = [{"op": OPS.get(method, GELU)[0], "method": method, "baseline": OPS.get(method, GELU)[1], **r}
              for method, r in rows.items()]
    variant = None if set(FULL) <= set(methods) else "methods-" + "-".join(methods)
    path, _ = save_record("jit_latency", baseline="torch's own op on the same input, hot calls only (F.gelu; "
                          "F.layer_norm for the layer_norm row; torch.add for jitops.add)", rows=record,
                          summary=summary, variant=variant, started=started)
    print(f"\nJSON: {path}")


def report_jitops(rows: dict) -> dict:
    """Print jitops' second-kernel and jitops.add figures; return them as the record's summary."""
    j = rows["jitops"]
    print(f"\njitops warm, second kernel in the same process: {j['warm_second_kernel_ms']:.2f} ms (goal <= 5 ms)")
    if "jitops-preloaded" in rows:
        p = rows["jitops-preloaded"]
        print(f"jitops warm first call with CuPy's driver binding already imported: {p['warm_first_ms']:.2f} ms "
              f"(the import itself: {p['driver_import_ms']:.1f} ms, once per process)")
    print(f"hot jitops.add {j['add_hot_us']:.2f} us vs torch.add {j['torch_add_hot_us']:.2f} us: "
          f"x{j['add_hot_us'] / j['torch_add_hot_us']:.2f} (goal <= 1.5)")
    print(f"hot jitops.add with requires_grad {j['add_grad_hot_us']:.2f} us vs torch.add "
          f"{j['torch_add_grad_hot_us']:.2f} us: x{j['add_grad_hot_us'] / j['torch_add_grad_hot_us']:.2f}")
    return {"jitops warm second kernel ms": round(j["warm_second_kernel_ms"], 2),
            "jitops.add hot / torch.add": round(j["add_hot_us"] / j["torch_add_hot_us"], 2),
            "jitops.add hot / torch.add, requires_grad": round(j["add_grad_hot_us"] / j["torch_add_grad_hot_us"], 2)}


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], sys.argv[3])))
    elif len(sys.argv) > 1 and sys.argv[1] == "--compile-child":
        print(json.dumps(compile_child(sys.argv[2], sys.argv[3])))
    elif len(sys.argv) > 1 and sys.argv[1] == "--cold-compile":
        cold_compile(sys.argv[2].split(",") if len(sys.argv) > 2 else list(COMPILE_FAMILIES))
    elif sys.argv[1:] == ["--cpu-add"]:
        cpu_add()
    elif sys.argv[1:] == ["--cpu-host"]:
        cpu_host()
    elif sys.argv[1:] == ["--cpu-host-profile"]:
        cpu_host_profile()
    else:
        main()
