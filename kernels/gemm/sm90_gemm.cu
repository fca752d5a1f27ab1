// jitops.gemm's sm_90a kernel as a C-ABI library built by nvcc, with CUTLASS's own host code (TMA descriptors,
// scheduler parameters, cluster launch).  jitops.gemm itself runs the NVRTC build of the same kernel
// (sm90_gemm_kernel.cu) with that host logic in Python (jitops/cutlass_host.py); this library is the reference
// the GPU test compares it with bit for bit, and it runs CUTLASS's stream-K scheduler for the sweeps.
#include <cuda_runtime.h>

#include "cutlass/cluster_launch.hpp"
#include "cutlass/device_kernel.h"
#include "sm90_gemm.cuh"

#define JITOPS_EXPORT extern "C" __attribute__((visibility("default")))


using namespace jitops_gemm;

// Workspace bytes the configuration needs for this problem (stream-K partials; 0 for data-parallel tiles).
JITOPS_EXPORT long long jitops_gemm_workspace(int m, int n, int k, int swizzle, int raster, int decomposition,
                                              int splits, int sm_count) {
  auto args = arguments(nullptr, nullptr, nullptr, nullptr, m, n, k, k, k, n, 0, swizzle, raster, decomposition,
                        splits, sm_count);
  return static_cast<long long>(GemmKernel::get_workspace_size(args));
}

// Launches D = act(A.B + bias) on `stream`.  Returns 0, or a cutlass::Status (1-99) when the problem cannot be
// run with this configuration, or 1000 + a cudaError_t when a CUDA call failed.
JITOPS_EXPORT int jitops_gemm_run(const void* a, const void* b, void* d, const void* bias, int m, int n, int k,
                                  long long lda, long long ldb, long long ldd, int activation, int swizzle,
                                  int raster, int decomposition, int splits, int sm_count, void* workspace,
                                  void* stream_ptr) {
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  auto args = arguments(a, b, d, bias, m, n, k, lda, ldb, ldd, activation, swizzle, raster, decomposition, splits,
                        sm_count);
  if (!GemmKernel::can_implement(args)) {
    return static_cast<int>(cutlass::Status::kErrorInvalidProblem);
  }
  cutlass::Status status = GemmKernel::initialize_workspace(args, workspace, stream);
  if (status != cutlass::Status::kSuccess) {
    return static_cast<int>(status);
  }
  typename GemmKernel::Params params = GemmKernel::to_underlying_arguments(args, workspace);

  constexpr int smem = GemmKernel::SharedStorageSize;
  // The dynamic shared-memory limit is a per-function, per-device attribute: set it once per device.
  static bool attribute_set[64] = {};
  int device = 0;
  cudaError_t error = cudaGetDevice(&device);
  if (error != cudaSuccess) return 1000 + static_cast<int>(error);
  if (device < 0 || device >= 64 || !attribute_set[device]) {
    error = cudaFuncSetAttribute(cutlass::device_kernel<GemmKernel>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 smem);
    if (error != cudaSuccess) return 1000 + static_cast<int>(error);
    if (device >= 0 && device < 64) attribute_set[device] = true;
  }
  dim3 const block = GemmKernel::get_block_shape();
  dim3 const grid = GemmKernel::get_grid_shape(params);
  dim3 const cluster(GEMM_CLUSTER_M, GEMM_CLUSTER_N, 1);
  cutlass::ClusterLaunchParams launch{grid, block, cluster, smem, stream};
  status = cutlass::launch_kernel_on_cluster(launch, reinterpret_cast<void const*>(cutlass::device_kernel<GemmKernel>),
                                             params);
  if (status != cutlass::Status::kSuccess) {
    error = cudaGetLastError();
    return error != cudaSuccess ? 1000 + static_cast<int>(error) : static_cast<int>(status);
  }
  error = cudaGetLastError();
  return error != cudaSuccess ? 1000 + static_cast<int>(error) : 0;
}
