"""CUDA source -> cubin through NVRTC (its C API through ctypes: nvrtc_api.py), with explicit include paths.

Needs no GPU: the arch comes from the request, never from a device query (CuPy's RawModule queries the
device, and its bundled CCCL include paths clash with CUDA 13's when compiling CUTLASS: DESIGN.md).
"""
from __future__ import annotations

import pickle
import sys
import threading
from pathlib import Path
from typing import Any

from ..errors import CompileError
from ..launch import CudaFunction
from ..specs import BuildRequest, kernels_root
from . import toolkit
from .base import Backend, BuildOutput

CUBIN = "kernel.cubin"


class NvrtcBackend(Backend):
    name = "nvrtc"

    def toolchain(self, request: BuildRequest) -> dict[str, Any] | None:
        version = toolkit.nvrtc_identity()
        if version is None:
            return None
        try:
            headers = toolkit.cuda_headers().identity
        except Exception:  # noqa: BLE001 - no headers: cannot compile here, which is what None says
            return None
        return {"nvrtc": version, "cuda_headers": headers}

    def unavailable_reason(self, request: BuildRequest) -> str | None:
        if toolkit.nvrtc_identity() is None:
            return "NVRTC is not installed (pip install nvidia-cuda-nvrtc, or set CUDA_HOME)"
        try:
            toolkit.cuda_headers()
        except Exception as exc:  # noqa: BLE001
            return str(exc)
        return None

    def unsupported_arch(self, request: BuildRequest, arch: str) -> str | None:
        return toolkit.unsupported_arch("NVRTC", toolkit.nvrtc_archs(), arch)

    def options(self, request: BuildRequest, arch: str) -> list[str]:
        uses_cutlass = request.source.includes_external(toolkit.CUTLASS_PREFIXES)
        include_dirs = [kernels_root()]
        if request.source.path is not None:
            include_dirs.insert(0, request.source.path.parent)
        if uses_cutlass:
            include_dirs += list(toolkit.cutlass_include_dirs())
        include_dirs += list(toolkit.cuda_headers().dirs)
        # -DNDEBUG: device asserts cost registers, and in CUTLASS 3 kernels they serialize wgmma (ptxas C7510).
        options = [f"-arch={arch}", "-std=c++17", "-DNDEBUG", "-DJITOPS_NVRTC=1"]
        if uses_cutlass:
            options.append("-default-device")  # CUTLASS's unannotated helpers must compile as device code
        options += [f"-I{d}" for d in include_dirs]
        options += [f"-D{k}={v}" for k, v in request.defines]
        return options + list(request.options)

    def compile(self, request: BuildRequest, arch: str, build_dir: Path, tag: str) -> BuildOutput:
        # NVRTC runs one compile at a time per process (16 threads' CUTLASS 3 compiles finished about 25 s apart
        # on the H100), so a CUTLASS compile off the main thread (the background pool, prefetches) runs in
        # a child process of its own: they then build side by side.  The child's start (importing jitops, about
        # 2 s) is small against such a compile (40-50 s) and large against a plain kernel's (0.2 s), which
        # compiles here.
        if threading.current_thread() is not threading.main_thread() and \
                request.source.includes_external(toolkit.CUTLASS_PREFIXES):
            return self._compile_in_child(request, arch, build_dir, tag)
        return self.compile_here(request, arch, build_dir, tag)

    def _compile_in_child(self, request: BuildRequest, arch: str, build_dir: Path, tag: str) -> BuildOutput:
        from . import processes

        done = processes.run([sys.executable, "-m", "jitops.backends.nvrtc_child"],
                             input=pickle.dumps((request, arch, str(build_dir), tag)), capture_output=True)
        if done.returncode != 0:
            raise RuntimeError(f"jitops: the NVRTC compile of {request.label()} for {arch} in a child process "
                               f"exited with {done.returncode}: {done.stderr.decode(errors='replace')[-2000:]}")
        kind, payload = pickle.loads(done.stdout)  # from our own child, over a pipe: trusted
        if kind == "error":
            raise CompileError(**payload)
        return payload

    def compile_here(self, request: BuildRequest, arch: str, build_dir: Path, tag: str) -> BuildOutput:
        nvrtc = toolkit.nvrtc()
        source = request.source.read()
        options = self.options(request, arch)
        with nvrtc.program(source, request.source.name) as program:
            program.add_name_expression(request.entry)
            if not program.compile(options):
                raise CompileError(kernel=request.label(), backend=self.name, arch=arch, options=options,
                                   log=program.log(), source=source, source_name=request.source.name)
            log = program.log()
            lowered = program.lowered_name(request.entry)
            cubin = program.cubin()
        (build_dir / CUBIN).write_bytes(cubin)
        major, minor = nvrtc.version()
        return BuildOutput([CUBIN], {"lowered_name": lowered, "nvrtc_version": f"{major}.{minor}",
                                     "options": options}, log=log)

    def load(self, request: BuildRequest, directory: Path, blobs: dict[str, bytes], meta: dict[str, Any],
             device_index: int | None) -> CudaFunction:
        assert device_index is not None, "NVRTC kernels run on CUDA devices"
        return CudaFunction(blobs[CUBIN], meta["lowered_name"], request.signature, device_index, request.label())
