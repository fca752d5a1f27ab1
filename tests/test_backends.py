"""The nvcc (CudaLibrary), cxx (CppLibrary) and load_inline (CppExtension) backends end to end: compile, cache,
load, call."""
from __future__ import annotations

import pytest
import torch

import jitops
from jitops.backends import toolkit
from jitops.runtime import runtime
from jitops.specs import CppExtension, CppLibrary, CudaLibrary, Source, Target

LIBRARY_SOURCE = r"""
#include <cuda_runtime.h>
#define EXPORT extern "C" __attribute__((visibility("default")))

__global__ void fill(float* out, float value, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) out[i] = value * OFFSET;
}

EXPORT int answer(int x) { return x + OFFSET; }

EXPORT int fill_on_stream(float* out, float value, long long n, void* stream) {
  if (n > 0) fill<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(out, value, n);
  return (int)cudaGetLastError();
}
"""
LIBRARY = CudaLibrary("test_library", Source.inline("test_library", LIBRARY_SOURCE),
                      functions={"answer": (("i32",), "i32"), "fill_on_stream": (("ptr", "f32", "i64", "ptr"), "i32")})

needs_nvcc = pytest.mark.skipif(toolkit.nvcc_path() is None, reason="no nvcc on this machine")


@needs_nvcc
def test_nvcc_library_compiles_caches_and_calls_without_a_gpu(fresh_cache):
    request = LIBRARY.bind("fp32", OFFSET=41)
    library = runtime.get_kernel(request, Target.parse("sm_90"), None)
    assert library.answer(1) == 42  # host code runs here; no device needed to load or call it
    [entry] = fresh_cache.glob("v1/sm_90/fp32/test_library-*")
    meta = jitops.runtime.find_entry(runtime.key_for(request, Target.parse("sm_90"))[0], False).meta
    assert meta["toolchain"]["nvcc"].startswith("Build cuda_") and "-gencode=arch=compute_90,code=sm_90" in \
        meta["command"]
    runtime.clear_memory()
    jitops.reset_stats()
    assert runtime.get_kernel(request, Target.parse("sm_90"), None).answer(2) == 43
    assert jitops.stats.disk_hits == 1 and jitops.stats.compiles == 0


@needs_nvcc
def test_nvcc_compile_error_carries_the_log(fresh_cache):
    broken = CudaLibrary("broken_library", Source.inline("broken_library", "int f() { return nope; }\n"),
                         functions={"f": ((), "i32")})
    with pytest.raises(jitops.CompileError) as info:
        runtime.prewarm(broken.bind(), Target.parse("sm_90"))
    assert "nope" in info.value.log and "> 1 | int f() { return nope; }" in str(info.value)


@pytest.mark.gpu
@needs_nvcc
def test_nvcc_library_launches_on_torchs_stream(fresh_cache):
    library = runtime.get_kernel(LIBRARY.bind("fp32", OFFSET=2), Target("cuda", torch.cuda.get_device_capability()), 0)
    out = torch.empty(1000, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        assert library.fill_on_stream(out, 1.5, out.numel(), jitops.launch.current_stream(0)) == 0
    stream.synchronize()
    assert torch.equal(out, torch.full_like(out, 3.0))


CUDA_EXTENSION = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
__global__ void twice(const float* x, float* y, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2.f * x[i];
}
torch::Tensor twice_op(torch::Tensor x) {
  auto y = torch::empty_like(x);
  long long n = x.numel();
  auto stream = at::cuda::getCurrentCUDAStream();
  if (n) twice<<<(n + 255) / 256, 256, 0, stream>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
  return y;
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("twice", &twice_op); }
"""


@pytest.mark.gpu
def test_load_inline_cuda_extension_is_cached_and_imported_directly(fresh_cache):
    spec = CppExtension("test_twice", Source.inline("test_twice", CUDA_EXTENSION, suffix=".cu"), functions=(),
                        cuda=True)
    target = Target("cuda", torch.cuda.get_device_capability())
    module = runtime.get_kernel(spec.bind("fp32"), target, 0)
    x = torch.randn(4097, device="cuda")
    assert torch.equal(module.twice(x), 2 * x)
    [entry] = fresh_cache.glob("v1/sm_*/fp32/test_twice-*")
    assert any(p.suffix == ".so" for p in entry.iterdir())


def test_cpu_library_identity_names_torch_and_the_compiler():
    from jitops.ops.add import ADD_CPU
    key, can_compile = runtime.key_for(ADD_CPU.bind("fp32", SCALAR_T="float"), Target("cpu"))
    assert can_compile and key.toolchain["torch"] == torch.__version__ and key.toolchain["cxx"]
    assert key.request["machine"] and key.arch == "cpu" and key.request["backend"] == "cxx"


CPU_LIBRARY_SOURCE = r"""
#include <ATen/Parallel.h>
#include <atomic>
#include "cpu/export.h"

JITOPS_CPU_EXPORT void scale(const SCALAR_T* x, SCALAR_T* y, int64_t n, double factor) {
  at::parallel_for(0, n, 1024, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) y[i] = x[i] * static_cast<SCALAR_T>(factor);
  });
}

// How many of torch's intra-op threads one at::parallel_for over n single-element tasks ran on.
JITOPS_CPU_EXPORT int32_t threads_used(int64_t n) {
  std::atomic<int> most{0};
  at::parallel_for(0, n, 1, [&](int64_t, int64_t) {
    int mine = at::get_thread_num() + 1, seen = most.load();
    while (mine > seen && !most.compare_exchange_weak(seen, mine)) {}
  });
  return most.load();
}
"""
CPU_LIBRARY = CppLibrary("test_cpu_library", Source.inline("test_cpu_library.cpp", CPU_LIBRARY_SOURCE),
                         functions={"scale": (("ptr", "ptr", "i64", "f64"), "void"), "threads_used": (("i64",), "i32")})


def test_cpu_library_compiles_caches_and_calls_on_torchs_threads(fresh_cache):
    request = CPU_LIBRARY.bind("fp64", SCALAR_T="double")
    library = runtime.get_kernel(request, Target("cpu"), None)
    x = torch.randn(100_003, dtype=torch.float64)
    y = torch.empty_like(x)
    library.scale(x, y, x.numel(), 2.5)
    assert torch.equal(y, x * 2.5)
    [entry] = fresh_cache.glob("v1/cpu/fp64/test_cpu_library-*")
    assert (entry / "kernel.so").exists()
    # -fopenmp at compile time, torch's own OpenMP runtime at load time: the library follows set_num_threads
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert library.threads_used(64) == 1
        torch.set_num_threads(2)
        assert library.threads_used(64) == 2  # 1 if the build lost -fopenmp: parallel_for then runs serially
    finally:
        torch.set_num_threads(threads)
    runtime.clear_memory()
    jitops.reset_stats()
    again = runtime.get_kernel(request, Target("cpu"), None)
    again.scale(x, y, x.numel(), -1.0)
    assert torch.equal(y, -x) and jitops.stats.disk_hits == 1 and jitops.stats.compiles == 0


def test_cpu_library_builds_with_the_compiler_cxx_names(fresh_cache, tmp_path, monkeypatch):
    """$CXX picks the compiler for the build and for the key's toolchain alike: a build by another compiler is
    another entry."""
    calls = tmp_path / "calls"
    wrapper = tmp_path / "wrapped-c++"
    wrapper.write_text(f'#!/bin/sh\nif [ "$1" = --version ]; then echo "wrapped c++ 1.0"; exit 0; fi\n'
                       f'echo "$@" >> {calls}\nexec c++ "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("CXX", str(wrapper))
    request = CPU_LIBRARY.bind("fp32", SCALAR_T="float")
    key, can_compile = runtime.key_for(request, Target("cpu"))
    assert can_compile and key.toolchain["cxx"] == "wrapped c++ 1.0"
    library = runtime.get_kernel(request, Target("cpu"), None)
    x = torch.arange(5, dtype=torch.float32)
    y = torch.empty_like(x)
    library.scale(x, y, 5, 3.0)
    assert torch.equal(y, 3 * x)
    compile_step, link_step = calls.read_text().splitlines()
    assert "-fopenmp" in compile_step and "-c" in compile_step.split()
    assert "-shared" in link_step and "-ltorch_cpu" in link_step and "gomp" not in link_step


def test_cpu_library_compile_error_carries_the_log(fresh_cache):
    broken = CppLibrary("broken_cpu_library", Source.inline("broken_cpu_library.cpp", "int f() { return nope; }\n"),
                        functions={"f": ((), "i32")})
    with pytest.raises(jitops.CompileError) as info:
        runtime.prewarm(broken.bind(), Target("cpu"))
    assert "nope" in info.value.log and "int f() { return nope; }" in str(info.value)
    assert not list(fresh_cache.glob("v1/cpu/*/broken_cpu_library-*"))


def test_header_macros_are_read_from_define_lines_only(tmp_path):
    """The toolchain identity reads numeric #defines (CUDA_VERSION, CCCL_VERSION) without regexes: only a
    `#define NAME value` line counts, however it is spaced, and a longer name or a comment does not."""
    header = tmp_path / "h.h"
    header.write_text("// CUDA_VERSION 5\n#define CUDA_VERSIONX 7\nint CUDA_VERSION 9;\n"
                      "#  define\tCUDA_VERSION   13020 // comment\n#define CUDA_VERSION 1\n")
    assert toolkit._macro(header, "CUDA_VERSION") == "13020"
    assert toolkit._macro(header, "CCCL_VERSION") is None
    assert toolkit._macro(tmp_path / "missing.h", "CUDA_VERSION") is None


def _c_kind(declaration: str) -> str:
    """ptr / i32 / i64 / f64 / void for one C parameter or return type, as the libraries' functions name them."""
    if "*" in declaration:
        return "ptr"
    if "double" in declaration:
        return "f64"
    if declaration.split() == ["void"]:
        return "void"
    if "long long" in declaration or "int64_t" in declaration:
        return "i64"
    if "int" in declaration:  # int, int32_t
        return "i32"
    raise AssertionError(f"no ctypes kind for C type {declaration!r}")


def _exported_signatures(text: str) -> dict[str, tuple[tuple[str, ...], str]]:
    """name -> (argument kinds, return kind) of every extern "C" function a library source exports (through
    its EXPORT-style macro)."""
    import re

    macros = re.findall(r'#define\s+(\w+)\s+extern\s+"C"', text)
    if '#include "export.h"' in text:  # the CPU kernels' shared macro (kernels/cpu/export.h)
        macros.append("JITOPS_CPU_EXPORT")
    found = {}
    for macro in macros:
        for ret, name, params in re.findall(rf"^{macro}\s+([\w\s\*]+?)\s*\b(\w+)\(([^)]*)\)", text, re.M):
            kinds = tuple(_c_kind(p) for p in params.split(",") if p.strip() and p.strip() != "void")
            found[name] = (kinds, _c_kind(ret))
    return found


def test_every_host_library_declares_the_c_signatures_its_source_exports():
    """ctypes cannot check a call against the C function: a Python-side signature that lags the source (an
    argument added in the .cu, say) would pass the wrong stack and crash.  Compare them here."""
    from jitops.ops import add, conv2d, gelu, gemm, grouped_gemm, layer_norm

    libraries = [gemm.SM90_GEMM_REFERENCE, grouped_gemm.GROUPED_GEMM, *conv2d.CONV_SPECS.values(),
                 add.ADD_CPU, gelu.GELU_CPU, layer_norm.LN_CPU]
    for library in libraries:
        exported = _exported_signatures(library.source.read())
        for name, (args, ret) in library.functions.items():
            assert name in exported, f"{library.name}: {name} is not exported by {library.source.name}"
            assert exported[name] == (tuple(args), ret), (
                f"{library.name}: {name} is declared {(tuple(args), ret)} but {library.source.name} has "
                f"{exported[name]}")


def test_nvrtc_cubins_are_whole_elf_images():
    """CuPy's getCUBIN, used before nvrtc_api, dropped the cubin's last byte (a zero): the driver still loaded it,
    cuobjdump and nvdisasm rejected it.  The image ends where its ELF headers say."""
    import struct

    from jitops.backends import toolkit

    if toolkit.nvrtc_identity() is None:
        pytest.skip("NVRTC is not installed")
    with toolkit.nvrtc().program("extern \"C\" __global__ void k(int* p) { p[0] = 1; }", "k.cu") as program:
        assert program.compile(["-arch=sm_90"])
        image = program.cubin()
    phoff, shoff = struct.unpack_from("<QQ", image, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", image, 0x36)
    assert image[:4] == b"\x7fELF" and len(image) == max(phoff + phentsize * phnum, shoff + shentsize * shnum)


def test_nvrtc_loads_the_library_its_identity_names_and_reports_errors():
    """nvrtc_api loads the file whose version is the cache key's identity; a program with errors returns False
    and its log names the error; a failing call (an unknown option) raises NVRTCError with NVRTC's text."""
    import sys

    from jitops.backends import nvrtc_api, toolkit

    if toolkit.nvrtc_identity() is None:
        pytest.skip("NVRTC is not installed")
    before = set(sys.modules)
    nvrtc = toolkit.nvrtc()
    assert not any(name.split(".")[0] in ("cupy", "cupy_backends") for name in set(sys.modules) - before)
    identity = toolkit.nvrtc_identity()
    major, minor = nvrtc.version()
    assert identity.startswith(f"{major}.{minor}"), (identity, major, minor)
    assert 90 in nvrtc.supported_archs()
    with nvrtc.program("__global__ void k() { undeclared(); }", "bad.cu") as program:
        assert not program.compile(["-arch=sm_90"])
        assert "undeclared" in program.log()
    with nvrtc.program("__global__ void k() {}", "k.cu") as program:
        with pytest.raises(nvrtc_api.NVRTCError, match="nvrtcCompileProgram"):
            program.compile(["--no-such-option"])


def test_cutlass_compiles_off_the_main_thread_run_in_a_child_and_keep_their_errors(tmp_path):
    """NVRTC compiles one program at a time per process: a CUTLASS compile from a worker thread runs in a child
    process (jitops.backends.nvrtc_child), and a compile error comes back whole, log and excerpt included."""
    import threading

    from jitops.backends import processes
    from jitops.backends.nvrtc import NvrtcBackend
    from jitops.errors import CompileError
    from jitops.specs import BuildRequest, Source

    source = '#include "cutlass/numeric_types.h"\n__global__ void broken() { this is not C++; }\n'
    request = BuildRequest(backend="nvrtc", kernel="child_broken", source=Source.inline("child_broken", source),
                           entry="broken", signature=(), dtype="fp32", params=())
    started, caught = [], []
    real_run = processes.run

    def run(args, **kwargs):
        started.append(args)
        return real_run(args, **kwargs)

    processes.run = run
    try:
        def work():
            try:
                NvrtcBackend().compile(request, "sm_80", tmp_path, "tag")
            except CompileError as error:
                caught.append(error)

        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
    finally:
        processes.run = real_run
    assert started and started[0][1:] == ["-m", "jitops.backends.nvrtc_child"]
    assert caught and caught[0].kernel == request.label() and "error" in caught[0].log
    assert "this is not C++" in caught[0].excerpt()


# ---- launch.SideStreams: fork and join through the driver, with a stand-in for libcuda (no GPU needed) ----------
class _RecordingDriver:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def cuEventRecord(self, event, stream):  # noqa: N802 - the driver's names
        self.calls.append(("record", event, stream))
        return 0

    def cuStreamWaitEvent(self, stream, event, flags):  # noqa: N802
        self.calls.append(("wait", stream, event))
        return 0


def _side_streams(monkeypatch) -> tuple[jitops.launch.SideStreams, _RecordingDriver]:
    import threading

    monkeypatch.setattr(jitops.launch, "ensure_context", lambda index: None)
    side = object.__new__(jitops.launch.SideStreams)  # the streams and events a GPU would give, as numbers
    driver = _RecordingDriver()
    side.device_index, side.streams, side._events = 0, [101, 102, 103, 104], [900, 901, 902, 903, 904]
    side._lib, side._check, side._lock = driver, lambda call, status: None, threading.Lock()
    return side, driver


def test_side_streams_fork_after_the_callers_work_and_join_back_even_on_errors(monkeypatch):
    side, driver = _side_streams(monkeypatch)
    with side.forked(7, 6) as streams:
        assert streams == [101, 102, 103, 104, 101, 102]  # six pieces of work share the four streams
        forked = list(driver.calls)
    assert forked == [("record", 900, 7)] + [("wait", s, 900) for s in (101, 102, 103, 104)]
    joined = driver.calls[len(forked):]
    assert joined == [c for s, e in zip((101, 102, 103, 104), (901, 902, 903, 904))
                      for c in (("record", e, s), ("wait", 7, e))]
    driver.calls.clear()
    with pytest.raises(RuntimeError, match="launch failed"):
        with side.forked(8, 2):
            raise RuntimeError("launch failed")
    assert driver.calls[-4:] == [("record", 901, 101), ("wait", 8, 901), ("record", 902, 102), ("wait", 8, 902)]


def test_side_streams_let_one_fork_at_a_time_use_the_shared_events(monkeypatch):
    import threading

    side, driver = _side_streams(monkeypatch)
    inside, release = threading.Event(), threading.Event()

    def first():
        with side.forked(1, 2):
            inside.set()
            release.wait(5)

    thread = threading.Thread(target=first)
    thread.start()
    inside.wait(5)
    second = threading.Thread(target=lambda: side.forked(2, 2).__enter__())
    second.start()
    second.join(0.2)
    assert second.is_alive() and all(call[1:] != (900, 2) for call in driver.calls), \
        "a second fork recorded the shared event inside the first one"
    release.set()
    thread.join(5)
    second.join(5)
    first_join = driver.calls.index(("wait", 1, 902))
    assert driver.calls.index(("record", 900, 2)) > first_join
