"""CUDA C++ with host code -> a shared library with a C ABI, built by nvcc and called through ctypes.

For kernels whose launch needs host code that Python should not reimplement: the CUTLASS 3 device-level API
builds TMA descriptors and scheduler parameters on the host.  Unlike load_inline it needs no torch headers
(torch/extension.h alone costs ~20 s of compile) and no CUDA build of torch, so a GPU-less build machine with
nvcc can prewarm these kernels for a deployment image.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import CompileError, ToolchainError
from ..launch import HostLibrary
from ..specs import BuildRequest, kernels_root
from . import processes, toolkit
from .base import Backend, BuildOutput

LIBRARY = "kernel.so"


def gencode(arch: str) -> str:
    """sm_90a -> -gencode=arch=compute_90a,code=sm_90a (the -arch=sm_90a shorthand also runs a plain sm_90
    pass on some nvcc versions, which rejects wgmma: HOPPER.md)."""
    digits = arch.removeprefix("sm_")
    return f"-gencode=arch=compute_{digits},code=sm_{digits}"


class NvccBackend(Backend):
    name = "nvcc"
    env_allowlist = ("NVCC_APPEND_FLAGS", "NVCC_PREPEND_FLAGS", "NVCC_CCBIN")

    def toolchain(self, request: BuildRequest) -> dict[str, Any] | None:
        nvcc = toolkit.nvcc_identity()
        if nvcc is None:
            return None
        return {"nvcc": nvcc, "host_cxx": toolkit.host_compiler_identity()}

    def unavailable_reason(self, request: BuildRequest) -> str | None:
        if toolkit.nvcc_path() is None:
            return "nvcc not found (install a CUDA toolkit and set CUDA_HOME, or pip install jitops[nvcc])"
        return None

    def unsupported_arch(self, request: BuildRequest, arch: str) -> str | None:
        return toolkit.unsupported_arch("nvcc", toolkit.nvcc_archs(), arch)

    def command(self, request: BuildRequest, arch: str, source: Path, output: Path) -> list[str]:
        nvcc = toolkit.nvcc_path()
        if nvcc is None:
            raise ToolchainError(f"jitops: cannot build {request.label()}: {self.unavailable_reason(request)}")
        include_dirs = [source.parent, kernels_root()]
        if request.source.includes_external(toolkit.CUTLASS_PREFIXES):
            include_dirs += list(toolkit.cutlass_include_dirs())
        libs = []
        if "-lcuda" in request.options:  # CUTLASS calls cuTensorMapEncodeTiled: link the driver (stub at build time)
            stubs = [p for p in (nvcc.parent.parent / "lib64" / "stubs", nvcc.parent.parent / "lib" / "stubs")
                     if p.is_dir()]
            libs += [f"-L{p}" for p in stubs]
        options = [o for o in request.options]
        return [str(nvcc), "-std=c++17", "-O3", "-DNDEBUG", "-DJITOPS_NVCC=1", gencode(arch),
                "-shared", "-Xcompiler", "-fPIC,-fvisibility=hidden", "--expt-relaxed-constexpr",
                *[f"-I{d}" for d in include_dirs], *[f"-D{k}={v}" for k, v in request.defines],
                *[o for o in options if o != "-lcuda"], "-o", str(output), str(source), *libs,
                *(["-lcuda"] if "-lcuda" in options else [])]

    def compile(self, request: BuildRequest, arch: str, build_dir: Path, tag: str) -> BuildOutput:
        source = request.source.path
        if source is None:
            source = build_dir / request.source.name
            source.write_text(request.source.read())
        cmd = self.command(request, arch, source, build_dir / LIBRARY)
        # In a process group of its own: an interrupt stops nvcc and its cicc, ptxas and host compiler.
        result = processes.run(cmd, capture_output=True, text=True, cwd=build_dir)
        log = (result.stdout + result.stderr).strip()
        if result.returncode != 0:
            raise CompileError(kernel=request.label(), backend=self.name, arch=arch, options=cmd[1:], log=log,
                               source=request.source.read(), source_name=request.source.name)
        return BuildOutput([LIBRARY], {"command": cmd}, log=log)

    def load(self, request: BuildRequest, directory: Path, blobs: dict[str, bytes], meta: dict[str, Any],
             device_index: int | None) -> HostLibrary:
        return HostLibrary(str(directory / LIBRARY), request.c_signatures)
