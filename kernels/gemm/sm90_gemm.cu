// jitops.gemm on sm_90a: D (M,N, row-major) = act(A (M,K) . B (K,N) + bias (N)), fp32 accumulation.
//
// A CUTLASS 3 warp-specialized kernel: TMA loads into a multi-stage shared-memory pipeline, wgmma, a persistent
// tile scheduler, and a TMA-store epilogue.  nvcc builds one configuration per translation unit (a CudaLibrary,
// called through ctypes); Python names the configuration with -D macros:
//
//   GEMM_T          cutlass::bfloat16_t | cutlass::half_t        element of A, B and bias
//   GEMM_OUT        element of D: GEMM_T or float
//   GEMM_A_KMAJOR   1: A is row-major (K contiguous); 0: A is column-major (M contiguous)
//   GEMM_B_KMAJOR   1: B is column-major (K contiguous); 0: B is row-major (N contiguous)
//   GEMM_TILE_M/N/K, GEMM_CLUSTER_M/N
//   GEMM_PINGPONG   0: cooperative (two consumer warpgroups share a tile); 1: ping-pong (one tile each)
//   GEMM_STREAMK    0: data-parallel persistent tiles; 1: CUTLASS's stream-K scheduler (cooperative only), whose
//                   decomposition is a run-time argument: its heuristic, data-parallel, split-K into `splits`
//                   slices of K, or stream-K
//   GEMM_FUSED      0: D = A.B;  1: D = act(A.B + bias), the bias optional (null) and act a run-time argument
//
// A transposed operand is a layout, not a copy: the leading dimensions come in at run time and the
// K-major / MN-major choice is the only compile-time layout fact.  16-bit wgmma reads either from shared memory.
#include <cuda_runtime.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "cutlass/cluster_launch.hpp"
#include "cutlass/device_kernel.h"

#include "epilogue.cuh"

#define JITOPS_EXPORT extern "C" __attribute__((visibility("default")))

namespace jitops_gemm {
using namespace cute;

using Element = GEMM_T;
using ElementOut = GEMM_OUT;
using Accumulator = float;
using LayoutA = cute::conditional_t<GEMM_A_KMAJOR, cutlass::layout::RowMajor, cutlass::layout::ColumnMajor>;
using LayoutB = cute::conditional_t<GEMM_B_KMAJOR, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
using LayoutD = cutlass::layout::RowMajor;
constexpr int kAlignment = 16 / sizeof(Element);  // TMA: 16-byte aligned rows and base addresses
constexpr int kAlignmentOut = 16 / sizeof(ElementOut);

using TileShape = Shape<Int<GEMM_TILE_M>, Int<GEMM_TILE_N>, Int<GEMM_TILE_K>>;
using ClusterShape = Shape<Int<GEMM_CLUSTER_M>, Int<GEMM_CLUSTER_N>, _1>;

#if GEMM_PINGPONG
using MainloopSchedule = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecialized;
#else
using MainloopSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
#endif

#if GEMM_STREAMK
static_assert(!GEMM_PINGPONG, "stream-K needs the cooperative schedule");
using TileScheduler = cutlass::gemm::StreamKScheduler;
#else
using TileScheduler = cutlass::gemm::PersistentScheduler;
#endif

constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;

#if GEMM_FUSED
// act(acc + bias[n]): the bias is a row vector broadcast down the M dimension; a null pointer reads as zeros.
using Bias = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, Element, Accumulator>;
using Fusion = cutlass::epilogue::fusion::Sm90EVT<
    cutlass::epilogue::fusion::Sm90Compute<BiasActivation, ElementOut, Accumulator, kRound>,
    cutlass::epilogue::fusion::Sm90AccFetch, Bias>;
#else
using Fusion = cutlass::epilogue::fusion::LinearCombination<ElementOut, Accumulator, void, Accumulator, kRound>;
#endif

using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, Accumulator, Accumulator,
    void, LayoutD, kAlignmentOut,  // no source C
    ElementOut, LayoutD, kAlignmentOut, EpilogueSchedule, Fusion>::CollectiveOp;

using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA, kAlignment, Element, LayoutB, kAlignment,
    Accumulator, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
        sizeof(typename CollectiveEpilogue::SharedStorage))>,
    MainloopSchedule>::CollectiveOp;

using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                        CollectiveEpilogue, TileScheduler>;

using StrideA = typename GemmKernel::StrideA;
using StrideB = typename GemmKernel::StrideB;
using StrideD = typename GemmKernel::StrideD;

// CUTLASS 3 views B as (N, K): "K-major B" has stride (ldb, 1), "N-major B" has stride (1, ldb).
StrideA stride_a(long long lda) {
  StrideA s{};
#if GEMM_A_KMAJOR
  get<0>(s) = lda;
#else
  get<1>(s) = lda;
#endif
  return s;
}
StrideB stride_b(long long ldb) {
  StrideB s{};
#if GEMM_B_KMAJOR
  get<0>(s) = ldb;
#else
  get<1>(s) = ldb;
#endif
  return s;
}
StrideD stride_d(long long ldd) {
  StrideD s{};
  get<0>(s) = ldd;
  return s;
}

typename GemmKernel::Arguments arguments(const void* a, const void* b, void* d, const void* bias, int m, int n,
                                         int k, long long lda, long long ldb, long long ldd, int activation,
                                         int swizzle, int raster, int decomposition, int splits,
                                         int sm_count) {
  typename GemmKernel::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  args.problem_shape = {m, n, k, 1};
  args.mainloop.ptr_A = static_cast<Element const*>(a);
  args.mainloop.dA = stride_a(lda);
  args.mainloop.ptr_B = static_cast<Element const*>(b);
  args.mainloop.dB = stride_b(ldb);
  args.epilogue.ptr_C = nullptr;
  args.epilogue.dC = stride_d(ldd);
  args.epilogue.ptr_D = static_cast<ElementOut*>(d);
  args.epilogue.dD = stride_d(ldd);
#if GEMM_FUSED
  auto& fusion = args.epilogue.thread;  // op_0: accumulator fetch, op_1: bias, op_2: act(acc + bias)
  fusion.op_1 = typename Bias::Arguments{static_cast<Element const*>(bias), Element(0), {}};
  fusion.op_2 = ActivationArguments{activation};
#else
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = 0.0f;
#endif
  args.hw_info.device_id = 0;  // only sm_count is read by the schedulers
  args.hw_info.sm_count = sm_count;
  args.scheduler.max_swizzle_size = swizzle;
  // 0: CUTLASS's heuristic (along the dimension with fewer tiles), 1: along M, 2: along N.
  args.scheduler.raster_order = static_cast<decltype(args.scheduler.raster_order)>(raster);
#if GEMM_STREAMK
  // 0: CUTLASS's heuristic, 1: data-parallel, 2: split-K (`splits` slices), 3: stream-K.  The partial sums of a
  // split tile are reduced in K order (ReductionMode::Deterministic): the same inputs give the same bits.
  args.scheduler.decomposition_mode = static_cast<decltype(args.scheduler.decomposition_mode)>(decomposition);
  args.scheduler.splits = splits;
#else
  (void)decomposition;
  (void)splits;
#endif
  return args;
}

}  // namespace jitops_gemm

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
