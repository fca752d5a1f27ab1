// jitops.gemm on sm_90a: the kernel alone, for NVRTC.  The kernel is CUTLASS's (sm90_gemm.cuh names the
// configuration); its host side (Params: TMA descriptors from cuTensorMapEncodeTiled, the tile scheduler's
// parameters; the cluster launch) is Python's, jitops/cutlass_host.py.  That side reads the Params layout this
// compiler computed from the constant below, found by name in the cubin, so it never assumes one.
//
// NVRTC compiles only device code: CUTLASS's host code (to_underlying_arguments) and the host compiler are
// what made the nvcc build of this kernel take 52-80 s (docs/architecture.md, "CUTLASS 3 kernels without nvcc").
#include "sm90_gemm.cuh"

#include "cutlass/device_kernel.h"

#pragma nv_diag_suppress 1427  // offsetof on a non-standard-layout class (sm90_gemm.cuh says why it holds)
namespace jitops_gemm {
extern "C" __constant__ const unsigned long long jitops_gemm_layout[] = {JITOPS_GEMM_LAYOUT};
}  // namespace jitops_gemm
