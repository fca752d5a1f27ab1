"""C++ (CPU kernels) or CUDA C++ with torch-aware host code, through torch.utils.cpp_extension.load_inline.

The build goes into the runtime's build directory and the resulting Python extension module is stored in the
cache entry.  A warm hit imports that .so directly (importlib, 2 ms on the H100 machine): ninja and the
compiler never run again, where load_inline's own warm path (ninja's check, then import) took 21 ms.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import sysconfig
from pathlib import Path
from typing import Any

from ..errors import CompileError, ToolchainError
from ..specs import BuildRequest, kernels_root
from . import processes, toolkit
from .base import Backend, BuildOutput
from .nvcc import gencode


def _module_name(request: BuildRequest, tag: str) -> str:
    return f"jitops_{request.kernel}_{tag[:16]}"


class LoadInlineBackend(Backend):
    name = "load_inline"
    env_allowlist = ("NVCC_APPEND_FLAGS", "NVCC_PREPEND_FLAGS")

    def toolchain(self, request: BuildRequest) -> dict[str, Any] | None:
        import torch

        cxx = toolkit.host_compiler_identity()
        if cxx is None:
            return None
        identity: dict[str, Any] = {**self.load_identity(), "cxx": cxx}
        if request.cuda:
            nvcc = toolkit.nvcc_identity()
            if nvcc is None or torch.version.cuda is None:
                return None
            identity["nvcc"] = nvcc
        return identity

    def load_identity(self) -> dict[str, Any]:
        # A CPython extension linked against torch (and CUDA's runtime): another torch's or Python's will not load.
        import torch

        return {**toolkit.torch_link_identity(), "torch_cuda": torch.version.cuda,
                "python_ext": sysconfig.get_config_var("EXT_SUFFIX")}

    def unavailable_reason(self, request: BuildRequest) -> str | None:
        import torch

        if toolkit.host_compiler_identity() is None:
            return "no C++ compiler (c++ or $CXX) on PATH"
        if request.cuda and torch.version.cuda is None:
            return "load_inline CUDA kernels need a CUDA build of torch (this torch is CPU-only)"
        if request.cuda and toolkit.nvcc_identity() is None:
            return "load_inline CUDA kernels need nvcc (set CUDA_HOME)"
        return None

    def unsupported_arch(self, request: BuildRequest, arch: str) -> str | None:
        return toolkit.unsupported_arch("nvcc", toolkit.nvcc_archs(), arch) if request.cuda else None

    def compile(self, request: BuildRequest, arch: str, build_dir: Path, tag: str) -> BuildOutput:
        from torch.utils import cpp_extension

        reason = self.unavailable_reason(request)
        if reason:
            raise ToolchainError(f"jitops: cannot build {request.label()}: {reason}")
        module = _module_name(request, tag)
        source = request.source.read()
        defines = [f"-D{k}={v}" for k, v in request.defines]
        include_paths = [str(kernels_root())]
        if request.source.path is not None:
            include_paths.insert(0, str(request.source.path.parent))
        if request.source.includes_external(toolkit.CUTLASS_PREFIXES):
            include_paths += [str(d) for d in toolkit.cutlass_include_dirs()]
        cflags = ["-DNDEBUG", *defines, *request.options]
        # ninja, c++ and cc1plus in a process group of their own, stopped as a whole on an interrupt.
        processes.track_cpp_extension()
        try:
            if request.cuda:
                # CUDA sources declare their own PYBIND11_MODULE(TORCH_EXTENSION_NAME, m).  The arch goes in as
                # a flag: torch then ignores TORCH_CUDA_ARCH_LIST, and nothing in os.environ changes, so builds
                # in several threads at once cannot compile for each other's arch.
                loaded = cpp_extension.load_inline(
                    name=module, cpp_sources=[""], cuda_sources=[source], functions=None,
                    extra_cflags=cflags,
                    extra_cuda_cflags=["-O3", "-std=c++17", gencode(arch), *defines, *request.options],
                    extra_include_paths=include_paths, build_directory=str(build_dir), verbose=False,
                    with_cuda=True)
            else:
                loaded = cpp_extension.load_inline(
                    name=module, cpp_sources=[source], functions=list(request.functions) or None,
                    extra_cflags=cflags, extra_include_paths=include_paths, build_directory=str(build_dir),
                    verbose=False, with_cuda=False)
        except Exception as exc:  # load_inline raises RuntimeError with the ninja/compiler output
            main = build_dir / ("cuda.cu" if request.cuda else "main.cpp")
            compiled = main.read_text() if main.exists() else source
            raise CompileError(kernel=request.label(), backend=self.name, arch=arch, options=cflags, log=str(exc),
                               source=compiled, source_name=main.name) from None
        library = Path(loaded.__file__)
        return BuildOutput([library.name], {"module": module})

    def load(self, request: BuildRequest, directory: Path, blobs: dict[str, bytes], meta: dict[str, Any],
             device_index: int | None) -> Any:
        module = meta["module"]
        if module in sys.modules:  # built (and imported by load_inline) earlier in this process
            return sys.modules[module]
        library = next(name for name in blobs if name.endswith(".so") or name.endswith(".pyd"))
        loader = importlib.machinery.ExtensionFileLoader(module, str(directory / library))
        spec = importlib.util.spec_from_file_location(module, directory / library, loader=loader)
        assert spec is not None
        loaded = importlib.util.module_from_spec(spec)
        loader.exec_module(loaded)
        sys.modules[module] = loaded
        return loaded
