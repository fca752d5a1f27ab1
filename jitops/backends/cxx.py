"""C++ CPU kernels -> a shared library with a C ABI, built by the host compiler and called through ctypes.

The built-in CPU kernels take raw pointers and sizes, so they need no torch/extension.h and no pybind11 module:
gelu_cpu compiles in about a second on the 2-core box, where load_inline took 23-26 s (nearly all of it torch's
headers and the Python bindings).  The only torch header a kernel includes is
ATen/Parallel.h, for `at::parallel_for` on torch's own intra-op thread pool.

Two steps, so that the library never names an OpenMP runtime of its own:
  * compile with -fopenmp: torch's CPU build is OpenMP (ATen/Config.h), and `at::parallel_for` is inline code
    that opens `#pragma omp parallel` itself; without the flag it runs on one thread;
  * link against libc10 and libtorch_cpu only, not libgomp: the GOMP_* and omp_* symbols resolve at load time
    to the runtime libtorch_cpu already loaded (a torch wheel may bundle its own under another soname), so a
    kernel shares torch's threads and `torch.set_num_threads` instead of starting a second pool.
No rpath: the libraries are matched by soname to the ones `import torch` loaded, so an entry built in one
environment loads in another with the same torch (the torch version is part of the key).
"""
from __future__ import annotations

import sysconfig
from pathlib import Path
from typing import Any

from ..errors import CompileError, ToolchainError
from ..launch import HostLibrary
from ..specs import BuildRequest, kernels_root
from . import processes, toolkit
from .base import Backend, BuildOutput

LIBRARY = "kernel.so"
FLAGS = ("-std=c++17", "-DNDEBUG", "-fPIC", "-fvisibility=hidden")


def _torch_dirs() -> tuple[Path, Path]:
    """torch's include and library directories (torch/include, torch/lib)."""
    import torch

    root = Path(torch.__file__).resolve().parent
    return root / "include", root / "lib"


class CxxBackend(Backend):
    name = "cxx"

    def toolchain(self, request: BuildRequest) -> dict[str, Any] | None:
        cxx = toolkit.host_compiler_identity()
        if cxx is None:
            return None
        # ATen/Parallel.h's inline code calls into libtorch_cpu: its version and C++ ABI are part of the binary.
        return {"cxx": cxx, **self.load_identity()}

    def load_identity(self) -> dict[str, Any]:
        # A library linked against another torch fails to load here (built under torch 2.13 on the dev box, the
        # host path met "undefined symbol: _ZN5torch8autograd4NodeD2Ev" under 2.11 on the GPU machine); another
        # compiler's build of the same torch, ABI and platform loads.
        return {**toolkit.torch_link_identity(), "platform": sysconfig.get_platform()}

    def unavailable_reason(self, request: BuildRequest) -> str | None:
        if toolkit.host_compiler_identity() is None:
            return "no C++ compiler (c++ or $CXX) on PATH"
        return None

    def commands(self, request: BuildRequest, source: Path, build_dir: Path) -> list[list[str]]:
        compiler = toolkit.host_compiler_path()
        if compiler is None:  # the key's identity found one; it went away since
            raise ToolchainError("jitops: no C++ compiler (c++ or $CXX) on PATH: install g++ or clang++, or set CXX")
        include, lib = _torch_dirs()
        include_dirs = [source.parent, kernels_root(), include]
        obj = build_dir / "kernel.o"
        compile_ = [compiler, *FLAGS, "-fopenmp", *request.options, *[f"-I{d}" for d in include_dirs],
                    *[f"-D{k}={v}" for k, v in request.defines], "-c", str(source), "-o", str(obj)]
        link = [compiler, "-shared", str(obj), "-o", str(build_dir / LIBRARY), f"-L{lib}", "-lc10",
                "-ltorch_cpu"]
        return [compile_, link]

    def compile(self, request: BuildRequest, arch: str, build_dir: Path, tag: str) -> BuildOutput:
        source = request.source.path
        if source is None:
            source = build_dir / request.source.name
            source.write_text(request.source.read())
        logs = []
        for cmd in self.commands(request, source, build_dir):
            # In a process group of its own: an interrupt stops the driver and its cc1plus and ld.
            result = processes.run(cmd, capture_output=True, text=True, cwd=build_dir)
            logs.append((result.stdout + result.stderr).strip())
            if result.returncode != 0:
                raise CompileError(kernel=request.label(), backend=self.name, arch=arch, options=cmd[1:],
                                   log="\n".join(logs).strip(), source=request.source.read(),
                                   source_name=request.source.name)
        return BuildOutput([LIBRARY], {}, log="\n".join(log for log in logs if log))

    def load(self, request: BuildRequest, directory: Path, blobs: dict[str, bytes], meta: dict[str, Any],
             device_index: int | None) -> HostLibrary:
        return HostLibrary(str(directory / LIBRARY), request.c_signatures)
