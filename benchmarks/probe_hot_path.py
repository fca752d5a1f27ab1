"""Where jitops' per-call and first-call time goes, piece by piece (a diagnostic, not a benchmark).

    python benchmarks/probe_hot_path.py            # needs a GPU; prints microseconds per piece

First call: fresh processes on a warm disk cache (made by a first, cold child), each timing jitops.gelu's first
call with the runtime's steps wrapped in timers; one more child profiles it.  Hot path: microseconds per call of
jitops.add and jitops.layer_norm and of their pieces, next to the torch ops, on tiny tensors.
"""
from __future__ import annotations

import cProfile
import io
import os
import pstats
import statistics
import subprocess
import sys
import tempfile

FIRST_CALL = r"""
import json, sys, time
T = time.perf_counter
import torch, jitops
from jitops import launch
R = sys.modules["jitops.runtime"]
from jitops.backends import nvrtc
from jitops.cache import disk
torch.cuda.init(); x = torch.randn(1 << 20, device="cuda", dtype=torch.bfloat16); torch.cuda.synchronize()
spent = {}

def timed(owner, name, label):
    original = getattr(owner, name)
    def wrapper(*args, **kwargs):
        started = T()
        try:
            return original(*args, **kwargs)
        finally:
            spent[label] = spent.get(label, 0.0) + (T() - started) * 1e3
    setattr(owner, name, wrapper)

if sys.argv[1] == "timers":
    timed(R.runtime, "key_for", "key (toolchain, closure, digests)")
    timed(R.runtime, "_load_from_disk", "disk lookup + verify + load")
    timed(nvrtc.NvrtcBackend, "load", "  of which module load")
    timed(launch._Driver, "get", "  driver handle")
    timed(jitops.gelu.op, "_load", "op._load (all of the above)")
    timed(sys.modules["jitops.ops.gelu"], "_grid", "grid")
    timed(jitops.gelu.op, "shape_class", "shape class")
if sys.argv[1] == "profile":
    import cProfile, io, pstats
    profile = cProfile.Profile(); profile.enable()
started = T()
y = jitops.gelu(x, "tanh")
launched = T()
torch.cuda.synchronize()
done = T()
spent["first call, to return"] = (launched - started) * 1e3
spent["first call, to synchronized"] = (done - started) * 1e3
if sys.argv[1] == "profile":
    profile.disable()
    out = io.StringIO(); pstats.Stats(profile, stream=out).sort_stats("cumtime").print_stats(30); print(out.getvalue())
a = torch.randn(1 << 20, device="cuda")
started = T(); jitops.add(a, a); torch.cuda.synchronize()
spent["second kernel (add)"] = (T() - started) * 1e3
print(json.dumps(spent))
"""


def per_call(fn) -> float:
    """Microseconds per call (harness.host_us: the timing every benchmark's host figures use)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from harness import host_us

    return host_us(fn, rounds=5, warmup=500)[0]


def first_call(runs: int = 7) -> None:
    import json

    cache = tempfile.mkdtemp(prefix="probe-first-")
    env = dict(os.environ, JITOPS_CACHE_DIR=cache)

    def child(mode: str) -> str:
        done = subprocess.run([sys.executable, "-c", FIRST_CALL, mode], env=env, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(done.stderr)
        return done.stdout

    child("plain")  # cold: compiles
    samples = [json.loads(child("timers").strip().splitlines()[-1]) for _ in range(runs)]
    plain = [json.loads(child("plain").strip().splitlines()[-1]) for _ in range(runs)]
    print(f"first call on a warm disk cache, ms, median of {runs} fresh processes")
    print(f"{'piece':40s} {'timed':>8s} {'untimed':>8s}")
    for label in samples[0]:
        timed = statistics.median(s.get(label, 0.0) for s in samples)
        untimed = statistics.median(s[label] for s in plain) if label in plain[0] else float("nan")
        print(f"{label:40s} {timed:8.3f} {untimed:8.3f}")
    print(child("profile"))


def hot_path() -> None:
    import torch

    import jitops

    F = torch.nn.functional
    add_module = sys.modules["jitops.ops.add"]
    norm_module = sys.modules["jitops.ops.layer_norm"]
    a, b = torch.randn(1, device="cuda"), torch.randn(1, device="cuda")
    jitops.add(a, b)
    op = jitops.add.op
    cls = op.shape_class(a, b)
    kernels = op._memo[(0, cls)]
    out = torch.empty_like(a)
    h = torch.randn(1, 128, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(128, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(128, device="cuda", dtype=torch.bfloat16)
    jitops.layer_norm(h, [128], w, bias)
    norm_op = jitops.layer_norm_inference.op  # jitops.layer_norm without grad
    norm_args = (h, [128], w, bias, 1e-5)
    norm_cls = norm_op.shape_class(*norm_args)
    norm_kernels = norm_op._memo[(0, norm_cls)]
    device = h.device
    rows = [
        ("torch.add", lambda: torch.add(a, b)),
        ("jitops.add", lambda: jitops.add(a, b)),
        ("torch.ops.jitops.add.default", lambda: torch.ops.jitops.add.default(a, b)),
        ("add shape_class", lambda: op.shape_class(a, b)),
        ("memo lookup", lambda: op._memo.get((0, cls))),
        ("add run_cuda (alloc + grid + launch)", lambda: add_module.run_cuda(kernels, a, b)),
        ("launcher alone", lambda: kernels.forward.launch(1, 256, a, b, out, 1)),  # the current tier
        ("torch.empty_like", lambda: torch.empty_like(a)),
        ("x.new_empty((2, 1), dtype=f32)", lambda: h.new_empty((2, 1), dtype=torch.float32)),
        ("torch.empty((2, 1), dtype, device)", lambda: torch.empty((2, 1), dtype=torch.float32, device=device)),
        ("torch.empty(2, dtype, device)", lambda: torch.empty(2, dtype=torch.float32, device=device)),
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
        ("F.layer_norm (1, 128) bf16", lambda: F.layer_norm(h, [128], w, bias)),
        ("jitops.layer_norm", lambda: jitops.layer_norm(h, [128], w, bias)),
        ("jitops.layer_norm_forward (stats too)", lambda: jitops.layer_norm_forward(h, [128], w, bias)),
        ("F.gelu (1,) fp32 tanh", lambda: F.gelu(a, approximate="tanh")),
        ("jitops.gelu", lambda: jitops.gelu(a, "tanh")),
        ("gelu shape_class", lambda: jitops.gelu.op.shape_class(a, "tanh")),
        ("layer_norm shape_class", lambda: norm_op.shape_class(*norm_args)),
        ("layer_norm run (inference)", lambda: norm_module.run_inference_cuda(norm_kernels, *norm_args)),
        ("lambda: None", lambda: None),
    ]
    print(f"{'piece':40s} {'us/call':>8s}")
    for name, fn in rows:
        print(f"{name:40s} {per_call(fn):8.2f}")
    for label, fn in (("jitops.add", lambda: jitops.add(a, b)), ("jitops.gelu", lambda: jitops.gelu(a, "tanh")),
                      ("jitops.layer_norm", lambda: jitops.layer_norm(h, [128], w, bias))):
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(20000):
            fn()
        profile.disable()
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(15)
        print(f"--- profile of 20000 calls of {label}\n{text.getvalue()}")


if __name__ == "__main__":
    which = sys.argv[1:] or ["first", "hot"]
    if "first" in which:
        first_call()
    if "hot" in which:
        os.environ.setdefault("JITOPS_CACHE_DIR", tempfile.mkdtemp(prefix="probe-hot-"))
        hot_path()
