"""Where jitops' per-call and first-call time goes, piece by piece (a diagnostic, not a benchmark).

    python benchmarks/probe_hot_path.py            # needs a GPU; prints microseconds per piece

Run in a fresh process after a warm cache exists (it prewarms itself first, in a child process).
"""
from __future__ import annotations

import cProfile
import io
import os
import pstats
import subprocess
import sys
import tempfile
import time

FIRST_CALL = r"""
import cProfile, io, pstats, time, torch, jitops
torch.cuda.init(); x = torch.randn(1 << 20, device="cuda", dtype=torch.bfloat16); torch.cuda.synchronize()
profile = cProfile.Profile()
t0 = time.perf_counter(); profile.enable()
y = jitops.gelu(x, "tanh"); torch.cuda.synchronize()
profile.disable(); print(f"first warm call {1e3 * (time.perf_counter() - t0):.2f} ms", jitops.stats.as_dict())
out = io.StringIO(); pstats.Stats(profile, stream=out).sort_stats("cumtime").print_stats(25); print(out.getvalue())
"""


def per_call(fn, calls: int = 20000) -> float:
    import torch

    for _ in range(500):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - started) / calls * 1e6)
    return best


def main() -> None:
    cache = tempfile.mkdtemp(prefix="probe-hot-")
    env = dict(os.environ, JITOPS_CACHE_DIR=cache)
    for _ in range(2):  # cold (compiles), then the profiled warm first call
        print(subprocess.run([sys.executable, "-c", FIRST_CALL], env=env, capture_output=True, text=True).stdout)
    os.environ["JITOPS_CACHE_DIR"] = cache
    import torch

    import jitops

    add_module = sys.modules["jitops.ops.add"]
    a, b = torch.randn(1, device="cuda"), torch.randn(1, device="cuda")
    jitops.add(a, b)
    op = jitops.add.op
    cls = op.shape_class(a, b)
    kernels = op._memo[(0, cls)]
    out = torch.empty_like(a)
    launch = kernels.forward.launch
    rows = [
        ("torch.add", lambda: torch.add(a, b)),
        ("jitops.add", lambda: jitops.add(a, b)),
        ("torch.ops.jitops.add.default", lambda: torch.ops.jitops.add.default(a, b)),
        ("shape_class", lambda: op.shape_class(a, b)),
        ("memo lookup", lambda: op._memo.get((0, cls))),
        ("run_cuda (alloc + grid + launch)", lambda: add_module.run_cuda(kernels, a, b)),
        ("launcher alone", lambda: launch(1, 256, a, b, out, 1)),
        ("torch.empty_like", lambda: torch.empty_like(a)),
        ("elementwise_grid", lambda: jitops.launch.elementwise_grid(1, 256, 0)),
        ("is_compiling", torch.compiler.is_compiling),
        ("modes", lambda: torch._C._is_torch_function_mode_enabled() or torch._C._len_torch_dispatch_stack()
         or torch.autograd._profiler_enabled()),
        ("_cuda_getDevice", torch._C._cuda_getDevice),
        ("_cuda_getCurrentRawStream", lambda: torch._C._cuda_getCurrentRawStream(0)),
        ("data_ptr", a.data_ptr),
        ("driver.launch (CuPy or ctypes)", lambda: jitops.launch._Driver.get().launch(
            kernels.forward.handle, 1, 1, 1, 256, 1, 1, 0, torch._C._cuda_getCurrentRawStream(0),
            kernels.forward._pointers_address, 0)),
        ("lambda: None", lambda: None),
    ]
    print(f"{'piece':36s} {'us/call':>8s}")
    for name, fn in rows:
        print(f"{name:36s} {per_call(fn):8.2f}")
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(20000):
        jitops.add(a, b)
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(15)
    print(text.getvalue())


if __name__ == "__main__":
    main()
