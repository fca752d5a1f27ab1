"""jitops: PyTorch ops that carry their own CUDA/CUTLASS sources, compiled on first use per shape class and
cached on disk.

    import jitops
    y = jitops.gelu(x, approximate="tanh")   # first call for this shape class compiles, later calls are free
    jitops.stats                             # memory hits, disk hits, compiles, compile seconds

Declare your own op with jitops.op(...) (see README).  Importing jitops does no file or device I/O.
"""
from __future__ import annotations

from . import shapes
from ._logging import install_handler
from .config import config
from .errors import CacheMissError, CompileError, ConfigError, JitopsError, ToolchainError
from .op import (CallRecorder, Impl, Kernels, Op, Public, find, find_public, op, public, public_names,
                 record_calls, registered)
from .runtime import MissContext, reset_stats, runtime, stats
from .specs import CppExtension, CppLibrary, CudaKernel, CudaLibrary, Source, Target

install_handler()

# Importing jitops.ops registers the built-in ops; jitops.ops.<op> is each op's module, jitops.<name> its function.
from .ops.add import add  # noqa: E402
from .ops.conv2d import conv2d, conv2d_input_grad, conv2d_weight_grad  # noqa: E402
from .ops.gelu import gelu, gelu_backward  # noqa: E402
from .ops.gemm import gemm  # noqa: E402
from .ops.grouped_gemm import grouped_gemm  # noqa: E402
from .ops.layer_norm import (layer_norm, layer_norm_backward, layer_norm_forward,  # noqa: E402
                             layer_norm_inference, rms_norm)
from .ops.linear import linear  # noqa: E402

from .patching import PatchReport, PrefetchReport, patch, prefetch, unpatch  # noqa: E402
from .native import host as _native_host  # noqa: E402

_native_host.runtime = runtime  # jitops.linear's C++ host path builds through the cache like any kernel

__version__ = "0.1.0"


def wait(timeout: float | None = None) -> bool:
    """Block until every kernel compiling in the background (JITOPS_COMPILE=background) is ready or has
    failed; False if `timeout` seconds passed first."""
    return runtime.wait(timeout)


def clear_memory_cache() -> None:
    """Forget every loaded kernel; the next call of each op looks at the disk cache again."""
    runtime.clear_memory()
    for declared in registered().values():
        declared.clear_memory()


def cuda_type(dtype) -> str:
    """The C++ spelling of a torch dtype inside CUDA kernels: torch.bfloat16 -> '__nv_bfloat16'."""
    try:
        return shapes.CUDA_TYPES[dtype]
    except KeyError:
        raise TypeError(f"jitops: no CUDA kernel type for {dtype}") from None


__all__ = [
    "add", "gelu", "gelu_backward", "layer_norm", "layer_norm_forward", "layer_norm_backward",
    "layer_norm_inference", "rms_norm",
    "conv2d", "conv2d_input_grad", "conv2d_weight_grad", "gemm", "grouped_gemm", "linear",
    "patch", "unpatch", "prefetch", "PatchReport", "PrefetchReport",
    "record_calls", "CallRecorder",
    "op", "Impl", "Kernels", "Op", "find", "registered", "public", "Public", "find_public", "public_names",
    "CudaKernel", "CppExtension", "CppLibrary", "CudaLibrary", "Source", "Target",
    "config", "stats", "reset_stats", "wait", "runtime", "MissContext", "clear_memory_cache", "cuda_type", "shapes",
    "JitopsError", "CompileError", "CacheMissError", "ToolchainError", "ConfigError",
]
