"""Per-call cost of the ways jitops could launch a cubin and register an op.

Run on a CUDA machine:  python benchmarks/probe_launch_paths.py
It prints the environment facts the runtime depends on, then a table of
microseconds per call (1-element fp32 tensors, CPU-bound), torch.add measured
in the same run as the baseline.  The winner decides jitops/launch.py.
"""
import ctypes
import os
import subprocess
import sys
import time

import numpy as np
import torch

ADD_SRC = r"""
extern "C" __global__ void add_f32(const float* a, const float* b, float* out, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}
"""


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=60).stdout.strip()
    except Exception as e:  # noqa: BLE001 - a probe reports everything it can
        return f"<{e}>"


def facts():
    print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)
    print("device", torch.cuda.get_device_name(), torch.cuda.get_device_capability())
    print("nvcc:", sh("nvcc --version | tail -2 | tr '\\n' ' '"))
    print("which nvcc:", sh("which nvcc"), "CUDA_HOME", os.environ.get("CUDA_HOME"), "CUDA_PATH", os.environ.get("CUDA_PATH"))
    print("pip:", sh("python3 -m pip list 2>/dev/null | grep -iE 'cupy|nvidia-cuda|cuda-|cutlass|platformdirs|filelock|ninja|nbclient|nbformat|matplotlib|zstandard|tqdm|rich|pyyaml|jupyter|ipykernel'"))
    print("cccl dirs:", sh("ls -d /usr/local/cuda/include/cccl /usr/local/cuda/targets/*/include/cccl 2>&1"))
    print("nvrtc libs:", sh("python3 -c 'import nvidia,os;print(nvidia.__path__)'; find / -name 'libnvrtc.so*' 2>/dev/null | head"))
    print("gcc:", sh("gcc --version | head -1"), "| nproc", os.cpu_count())
    print("driver:", sh("nvidia-smi --query-gpu=driver_version,clocks.sm,clocks.max.sm --format=csv,noheader"))


def bench(fn, n=20000):
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t) / n * 1e6)
    return best


def main():
    facts()
    t0 = time.perf_counter()
    import cupy  # noqa: F401
    from cupy.cuda import function as cpf
    from cupy.cuda import nvrtc
    from cupy_backends.cuda.api import driver as cdrv
    print(f"import cupy: {(time.perf_counter() - t0) * 1e3:.1f} ms  nvrtc {nvrtc.getVersion()}  cupy {cupy.__version__}")

    t0 = time.perf_counter()
    prog = nvrtc.createProgram(ADD_SRC, "add.cu", [], [])
    nvrtc.compileProgram(prog, ["-arch=sm_90"])
    cubin = nvrtc.getCUBIN(prog)
    print(f"nvrtc compile trivial kernel: {(time.perf_counter() - t0) * 1e3:.1f} ms")

    a = torch.randn(1, device="cuda")
    b = torch.randn(1, device="cuda")
    t0 = time.perf_counter()
    mod = cpf.Module()
    mod.load(cubin)
    fn = mod.get_function("add_f32")
    dev = torch.cuda.current_device()
    raw = torch._C._cuda_getCurrentRawStream(dev)
    ext = cupy.cuda.ExternalStream(raw)
    out = torch.empty_like(a)
    fn((1,), (32,), (np.uint64(a.data_ptr()), np.uint64(b.data_ptr()), np.uint64(out.data_ptr()), np.int64(1)), stream=ext)
    torch.cuda.synchronize()
    print(f"module load + first launch: {(time.perf_counter() - t0) * 1e3:.2f} ms; correct={torch.allclose(out, a + b)}")

    streams = {}

    def cupy_launch():
        o = torch.empty_like(a)
        s = torch._C._cuda_getCurrentRawStream(dev)
        st = streams.get(s)
        if st is None:
            st = streams[s] = cupy.cuda.ExternalStream(s)
        fn((1,), (32,), (np.uint64(a.data_ptr()), np.uint64(b.data_ptr()), np.uint64(o.data_ptr()), np.int64(1)), stream=st)
        return o

    def cupy_launch_pyint():
        o = torch.empty_like(a)
        s = torch._C._cuda_getCurrentRawStream(dev)
        st = streams.get(s)
        if st is None:
            st = streams[s] = cupy.cuda.ExternalStream(s)
        fn((1,), (32,), (a.data_ptr(), b.data_ptr(), o.data_ptr(), 1), stream=st)
        return o

    # cupy's raw driver binding with a ctypes-packed parameter array
    slots = (ctypes.c_uint64 * 4)()
    ptrs = (ctypes.c_void_p * 4)(*[ctypes.addressof(slots) + 8 * i for i in range(4)])
    ptrs_addr = ctypes.addressof(ptrs)

    def driver_launch():
        o = torch.empty_like(a)
        slots[0] = a.data_ptr()
        slots[1] = b.data_ptr()
        slots[2] = o.data_ptr()
        slots[3] = 1
        cdrv.launchKernel(fn.ptr, 1, 1, 1, 32, 1, 1, 0, torch._C._cuda_getCurrentRawStream(dev), ptrs_addr, 0)
        return o

    libcuda = ctypes.CDLL("libcuda.so.1")
    cu_launch = libcuda.cuLaunchKernel
    cu_launch.restype = ctypes.c_int
    cu_launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3

    def ctypes_launch():
        o = torch.empty_like(a)
        slots[0] = a.data_ptr()
        slots[1] = b.data_ptr()
        slots[2] = o.data_ptr()
        slots[3] = 1
        rc = cu_launch(fn.ptr, 1, 1, 1, 32, 1, 1, 0, torch._C._cuda_getCurrentRawStream(dev), ptrs_addr, None)
        if rc:
            raise RuntimeError(rc)
        return o

    for f in (cupy_launch, cupy_launch_pyint, driver_launch, ctypes_launch):
        torch.cuda.synchronize()
        o = f()
        torch.cuda.synchronize()
        assert torch.allclose(o, a + b), f.__name__

    with open("/tmp/probe_add.cubin", "wb") as fh:
        fh.write(cubin)
    fresh = r"""
import time, torch
torch.cuda.init(); a = torch.ones(1, device="cuda"); torch.cuda.synchronize()
t0 = time.perf_counter()
from cupy.cuda import function as cpf
t1 = time.perf_counter()
from cupy_backends.cuda.api import driver as cdrv
import ctypes
m = cpf.Module(); m.load(open("/tmp/probe_add.cubin", "rb").read()); f = m.get_function("add_f32")
o = torch.empty_like(a)
slots = (ctypes.c_uint64 * 4)(a.data_ptr(), a.data_ptr(), o.data_ptr(), 1)
ptrs = (ctypes.c_void_p * 4)(*[ctypes.addressof(slots) + 8 * i for i in range(4)])
cdrv.launchKernel(f.ptr, 1, 1, 1, 32, 1, 1, 0, torch._C._cuda_getCurrentRawStream(0), ctypes.addressof(ptrs), 0)
torch.cuda.synchronize()
t2 = time.perf_counter()
print(f"fresh process: import cupy.cuda.function {1e3*(t1-t0):.1f} ms, load cubin + launch + sync {1e3*(t2-t1):.2f} ms, ok={o.item()==2}")
"""
    for _ in range(2):
        print(sh(f"{sys.executable} -c '{fresh}'"))

    for arch in ("sm_90", "sm_90a"):  # cubins built by NVRTC 13.5 on a GPU-less box, if carried
        path = f".probe/add_{arch}.cubin"
        if os.path.exists(path):
            m = cpf.Module()
            m.load(open(path, "rb").read())
            g = m.get_function("add_f32")
            o = torch.empty_like(a)
            g((1,), (32,), (np.uint64(a.data_ptr()), np.uint64(b.data_ptr()), np.uint64(o.data_ptr()), np.int64(1)), stream=ext)
            torch.cuda.synchronize()
            print(f"carried {path}: correct={torch.allclose(o, a + b)}")

    launch = driver_launch
    lib = torch.library.Library("probe", "DEF")
    lib.define("add(Tensor a, Tensor b) -> Tensor")
    lib.define("add2(Tensor a, Tensor b) -> Tensor")
    lib.impl("add", lambda x, y: launch(), "CUDA")
    lib.impl("add2", lambda x, y: launch(), "CUDA")
    torch.library.register_autograd("probe::add2", lambda ctx, g: (g, g), setup_context=lambda ctx, inputs, output: None)

    class AddFn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            return launch()

        @staticmethod
        def backward(ctx, g):
            return g, g

    @torch.library.custom_op("probe::add3", mutates_args=())
    def add3(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return launch()

    op = torch.ops.probe.add.default
    op2 = torch.ops.probe.add2.default

    def guarded_direct():
        if torch.compiler.is_compiling():
            return op(a, b)
        if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
            return op(a, b)
        if type(a) is not torch.Tensor or type(b) is not torch.Tensor:
            return op(a, b)
        if torch._C._is_torch_function_mode_enabled() or torch._C._len_torch_dispatch_stack():
            return op(a, b)
        if torch.autograd._profiler_enabled():
            return op(a, b)
        return launch()

    rows = [
        ("torch.add", lambda: torch.add(a, b)),
        ("torch.empty_like", lambda: torch.empty_like(a)),
        ("_cuda_getCurrentRawStream", lambda: torch._C._cuda_getCurrentRawStream(dev)),
        ("cupy Function() np scalars", cupy_launch),
        ("cupy Function() python ints", cupy_launch_pyint),
        ("cupy driver.launchKernel packed", driver_launch),
        ("ctypes cuLaunchKernel packed", ctypes_launch),
        ("guarded direct -> launchKernel", guarded_direct),
        ("Library.impl via .default", lambda: op(a, b)),
        ("Library.impl + register_autograd", lambda: op2(a, b)),
        ("autograd.Function", lambda: AddFn.apply(a, b)),
        ("custom_op", lambda: add3(a, b)),
    ]
    base = None
    print(f"\n{'call':40s} {'us/call':>8s} {'x torch.add':>11s}")
    for name, f in rows:
        us = bench(f)
        base = base or us
        print(f"{name:40s} {us:8.2f} {us / base:11.2f}")


if __name__ == "__main__":
    main()
