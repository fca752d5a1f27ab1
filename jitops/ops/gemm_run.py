"""jitops.gemm's launch code: the CUTLASS 3 sm_90a kernel through its Python host side (jitops/cutlass_host.py),
the light sm_90a kernel (jitops/light_gemm.py), the CUTLASS 2 sm_80 kernels, N-D operands folded into one 2-D
GEMM, and the ATen paths (the CPU reference, cuBLAS for float32 and batched b)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import light_gemm, native
from ..config import config
from ..cutlass_host import GemmConfig, Sm90Gemm, epilogue_tile
from ..launch import CudaFunction, current_stream, ensure_context, sm_count
from .gemm_plan import (ACTIVATIONS, GELU_APPROXIMATE, SM90_CONFIGS, GemmClass, Sm80Config, Sm90Config, _layout,
                        _swizzle, fold_a, fold_b, out_shape, sm80_config)

_FLOAT32, _FLOAT64 = torch.float32, torch.float64


# ---- running on the GPU ---------------------------------------------------------------------------------------
_STATUS = ["success", "misaligned operand", "invalid data type", "invalid layout", "invalid problem",
           "not supported", "workspace null", "internal error", "arch mismatch", "insufficient driver",
           "memory allocation", "invalid"]


def _operand(t: torch.Tensor, rows: int, cols: int) -> tuple[torch.Tensor, bool, int]:
    found = _layout(t, rows, cols)
    if found is None:
        t = t.contiguous()
        return t, True, cols
    return t, found[0], found[1]


def sm90_host(kernel: CudaFunction, cls: GemmClass, config: Sm90Config) -> Sm90Gemm:
    """The Python host side of an NVRTC-built sm_90a kernel (jitops/cutlass_host.py), made once per loaded
    kernel and kept on it."""
    host = kernel.__dict__.get("sm90_host")
    if host is None:
        facts = GemmConfig(cls.dtype.itemsize, cls.out_dtype, cls.a_kmajor, cls.b_kmajor, config.tile,
                           config.cluster, cls.fused, epilogue_tile(config.tile, config.pingpong, cls.out_dtype))
        host = kernel.__dict__.setdefault("sm90_host", Sm90Gemm(kernel, facts))
    return host


def run_sm90(kernel, cls: GemmClass, config: Sm90Config, a, b, out, bias, m, n, k, lda, ldb, activation: int,
             swizzle: int | None = None, raster: int | None = None, decomposition: int | None = None,
             splits: int | None = None) -> None:
    """One sm_90a GEMM: the NVRTC kernel through its Python host side, or (stream-K sweeps, the bit-for-bit
    reference) the nvcc library through CUTLASS's host code."""
    device = out.get_device()
    swizzle = swizzle or _swizzle(config, m, n)
    raster = config.raster if raster is None else raster
    if type(kernel) is CudaFunction:
        host = kernel.__dict__.get("sm90_host") or sm90_host(kernel, cls, config)
        host.run(a.data_ptr(), b.data_ptr(), out.data_ptr(), 0 if bias is None else bias.data_ptr(), m, n, k,
                 lda, ldb, n, activation, swizzle, raster, sm_count(device),
                 current_stream(device))
        return
    run_sm90_reference(kernel, cls, config, a, b, out, bias, m, n, k, lda, ldb, activation, swizzle, raster,
                       decomposition, splits)


def run_sm90_reference(lib, cls: GemmClass, config: Sm90Config, a, b, out, bias, m, n, k, lda, ldb,
                       activation: int, swizzle: int | None = None, raster: int | None = None,
                       decomposition: int | None = None, splits: int | None = None) -> None:
    """The nvcc-built library (SM90_GEMM_REFERENCE): CUTLASS's host code makes Params and launches."""
    device = out.get_device()
    ensure_context(device)  # autograd's backward thread may have none; CUTLASS's host code needs one
    swizzle = swizzle or _swizzle(config, m, n)
    raster = config.raster if raster is None else raster
    decomposition = config.decomposition if decomposition is None else decomposition
    splits = config.splits if splits is None else splits
    workspace = None
    sms = sm_count(device)
    if config.streamk:
        size = lib.jitops_gemm_workspace(m, n, k, swizzle, raster, decomposition, splits, sms)
        if size > 0:
            workspace = torch.empty(size, dtype=torch.uint8, device=out.device)
    status = lib.jitops_gemm_run(a, b, out, bias, m, n, k, lda, ldb, n, activation, swizzle, raster,
                                 decomposition, splits, sms, workspace, current_stream(device))
    if status:
        what = _STATUS[status] if status < len(_STATUS) else f"CUDA error {status - 1000}"
        raise RuntimeError(f"jitops.gemm: the sm_90 kernel {config} for {cls} failed on a ({m}, {k}) x ({k}, {n}) "
                           f"problem: {what} (status {status})")


def sm80_grid(m: int, n: int, config: Sm80Config) -> tuple[int, int, int]:
    """GemmIdentityThreadblockSwizzle<8>::get_grid_shape: tiles along M, interleaved by 2**log_tile along N."""
    tiles_m, tiles_n = -(-m // config.tile[0]), -(-n // config.tile[1])
    log_tile = 3 if tiles_n >= 6 else 2 if tiles_n >= 3 else 1 if tiles_n >= 2 else 0
    return tiles_m << log_tile, (tiles_n + (1 << log_tile) - 1) >> log_tile, 1


def run_sm80(kernel, cls: GemmClass, config: Sm80Config, a, b, out, bias, m, n, k, lda, ldb,
             activation: int) -> None:
    if bias is not None and bias.dtype != out.dtype:
        bias = bias.to(out.dtype)  # the bias is the epilogue's source operand, which has the output's type
    kernel.launch(sm80_grid(m, n, config), config.threads, a, b, out, bias, m, n, k, lda, ldb, n, activation,
                  shared_mem=config.smem_bytes())


def epilogue_only(out: torch.Tensor, bias, activation) -> torch.Tensor:
    """K = 0: the product is zero and only the epilogue remains."""
    z = torch.zeros(out.shape, dtype=torch.float32, device=out.device)
    if bias is not None:
        z = z + bias.float()
    out.copy_(activate(z, activation))
    return out


def run_cuda(kernels, a, b, bias, activation, out_dtype) -> torch.Tensor:
    cls = kernels.shape_class
    if cls.family == "aten":  # float32, or a batched product: cuBLAS (cuda_route)
        return torch_gemm(kernels, a, b, bias, activation, out_dtype)
    try:
        (m, k), (_, n) = a.shape, b.shape
    except ValueError:  # N-D or 1-D operands that fold into one 2-D GEMM
        return _run_folded(kernels, a, b, bias, activation)
    return _run_2d(cls, kernels, a, b, bias, activation, m, n, k)


def _run_2d(cls: GemmClass, kernels, a, b, bias, activation, m: int, n: int, k: int) -> torch.Tensor:
    out = torch.empty((m, n), dtype=cls.out_dtype, device=a.device)
    if m == 0 or n == 0:
        return out
    if k == 0:
        return epilogue_only(out, bias, activation)
    a, _, lda = _operand(a, m, k)
    b, _, ldb = _operand(b, k, n)
    launch(kernels, a, b, out, bias, m, n, k, lda, ldb, ACTIVATIONS[activation])
    return out


def _run_folded(kernels, a, b, bias, activation) -> torch.Tensor:
    """A call whose b is 2-D (or 1-D, or with batch dimensions all 1) as the 2-D GEMM (M, K) x (K, N), M the
    product of a's leading sizes; the (M, N) result viewed as torch.matmul's output shape."""
    k = a.shape[-1]
    a2, b2 = fold_a(a, k), fold_b(b)
    out = _run_2d(kernels.shape_class, kernels, a2, b2, bias, activation, a2.shape[0], b2.shape[1], k)
    return out.view(out_shape(a, b))


def reads_short_b(kernels) -> bool:
    """Whether the class's kernel can read a b stored shorter than the problem (launch's b_rows): the light
    kernel, whose TMA loads read zeros past an operand's rows.  CUTLASS's kernels need b padded."""
    return "sm90_light" in kernels.__dict__ and "sm90" not in kernels.__dict__


def launch(kernels, a, b, out, bias, m: int, n: int, k: int, lda: int, ldb: int, activation: int,
           b_rows: int = 0) -> None:
    """out (M, N) = act(a . b + bias) with the loaded kernels of the class; a and b are read in place with the
    given leading dimensions (their layouts are the class's).  b_rows: b's stored rows where it is shorter than
    the problem (light_gemm.Problem.b_rows), only where reads_short_b(kernels)."""
    cls = kernels.shape_class
    if bias is not None and bias.stride(0) != 1:
        bias = bias.contiguous()
    if b_rows and not reads_short_b(kernels):
        raise ValueError(f"jitops.gemm: b stored with {b_rows} rows is shorter than the problem, and the kernel of "
                         f"{cls} cannot read past it; pass b zero-padded")
    lib = kernels.__dict__.get("sm90")
    if lib is not None:
        run_sm90(lib, cls, SM90_CONFIGS[cls.bucket], a, b, out, bias, m, n, k, lda, ldb, activation)
    elif "sm90_light" in kernels.__dict__:
        device = out.get_device()
        packed = light_gemm.run(kernels.sm90_light, a, b, out, bias, m, n, k, lda, ldb, activation,
                                sm_count(device), current_stream(device), b_rows)
        if packed.offered != config.generation:  # jitops.linear's C++ host path runs it from now on
            native.offer_light(cls, packed, device)
    else:
        run_sm80(kernels.sm80, cls, sm80_config(cls), a, b, out, bias, m, n, k, lda, ldb, activation)


# ---- CPU (ATen) -----------------------------------------------------------------------------------------------
def activate(z: torch.Tensor, activation) -> torch.Tensor:
    if activation == "relu":
        return torch.relu(z)
    if activation in GELU_APPROXIMATE:
        return F.gelu(z, approximate=GELU_APPROXIMATE[activation])
    return z


def run_cpu(kernels, a, b, bias, activation, out_dtype) -> torch.Tensor:
    """The reference semantics through ATen: fp32 accumulation (fp64 for fp64), one rounding at the end."""
    cls = kernels.shape_class
    dtype = a.dtype
    if (dtype is _FLOAT32 or dtype is _FLOAT64) and cls.out_dtype is dtype and a.dim() == 2 and b.dim() == 2:
        # Already the accumulation type: one mm/addmm, no no-op .to() calls (0.9 us each on the dev box; a tiny
        # CPU gemm 8.1 -> 4.6 us, with a bias 13.8 -> 7.4: bench_jit_latency.py --cpu-host).
        z = torch.mm(a, b) if bias is None else torch.addmm(bias, a, b)
        return z if activation is None else activate(z, activation)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    z = torch.matmul(a.to(acc), b.to(acc))
    if bias is not None:
        z = z + bias.to(acc)
    return activate(z, activation).to(cls.out_dtype).contiguous()


def torch_gemm(kernels, a, b, bias, activation, out_dtype) -> torch.Tensor:
    """torch's matmul (cuBLAS on CUDA, which honours torch.backends.cuda.matmul.allow_tf32 for float32): the
    float32 and batched routes (cuda_route), and background mode's fallback.  fp32 outputs of 16-bit operands
    multiply in fp32."""
    if out_dtype is not None and out_dtype != a.dtype:
        z = torch.matmul(a.to(out_dtype), b.to(out_dtype))
        z = z + bias.to(out_dtype) if bias is not None else z
    elif a.dim() == 2 and b.dim() == 2:
        z = torch.addmm(bias, a, b) if bias is not None else torch.mm(a, b)
    else:
        z = torch.matmul(a, b)
        z = z + bias if bias is not None else z
    return activate(z, activation).contiguous()

