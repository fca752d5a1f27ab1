// jitops.gemm on sm_90a: the CUTLASS 3 kernel type of one configuration, shared by the NVRTC kernel translation
// unit (sm90_gemm_kernel.cu, the one jitops.gemm runs) and the nvcc-built reference library (sm90_gemm.cu, kept
// for the bit-for-bit test and the stream-K sweeps).
//
// D (M,N, row-major) = act(A (M,K) . B (K,N) + bias (N)), fp32 accumulation.  A CUTLASS 3 warp-specialized
// kernel: TMA loads into a multi-stage shared-memory pipeline, wgmma, a persistent tile scheduler, and a
// TMA-store epilogue.  Python names the configuration with -D macros:
//
//   GEMM_T          cutlass::bfloat16_t | cutlass::half_t        element of A, B and bias
//   GEMM_OUT        element of D: GEMM_T or float
//   GEMM_A_KMAJOR   1: A is row-major (K contiguous); 0: A is column-major (M contiguous)
//   GEMM_B_KMAJOR   1: B is column-major (K contiguous); 0: B is row-major (N contiguous)
//   GEMM_TILE_M/N/K, GEMM_CLUSTER_M/N
//   GEMM_PINGPONG   0: cooperative (two consumer warpgroups share a tile); 1: ping-pong (one tile each)
//   GEMM_STREAMK    0: data-parallel persistent tiles; 1: CUTLASS's stream-K scheduler (cooperative only; the
//                   nvcc reference library only: its host logic is not mirrored in Python)
//   GEMM_FUSED      0: D = A.B;  1: D = act(A.B + bias), the bias optional (null) and act a run-time argument
//
// A transposed operand is a layout, not a copy: the leading dimensions come in at run time and the
// K-major / MN-major choice is the only compile-time layout fact.  16-bit wgmma reads either from shared memory.
#pragma once

#if defined(__CUDACC_RTC__)
#include "jitops/nvrtc_std.cuh"  // NVRTC has no C++ standard library: libcu++'s names where CUTLASS wants std's
#else
#include <cstddef>
#endif

// Only the Hopper pieces: the umbrella headers (gemm/collective/collective_builder.hpp, collective_mma.hpp,
// kernel/gemm_universal.hpp) pull in every architecture's collectives and kernels.  (The epilogue's builder header
// defines its primary template beside every architecture's builders: it stays.)
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/builders/sm90_gmma_builder.inl"
#include "cutlass/gemm/collective/collective_builder_decl.hpp"
#include "cutlass/gemm/collective/collective_mma_decl.hpp"
#include "cutlass/gemm/collective/sm90_mma_tma_gmma_ss_warpspecialized.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal_decl.h"
#include "cutlass/gemm/kernel/sm90_gemm_tma_warpspecialized_cooperative.hpp"
#include "cutlass/gemm/kernel/sm90_gemm_tma_warpspecialized_pingpong.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"

#include "epilogue.cuh"

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
CUTLASS_HOST_DEVICE StrideA stride_a(long long lda) {
  StrideA s{};
#if GEMM_A_KMAJOR
  get<0>(s) = lda;
#else
  get<1>(s) = lda;
#endif
  return s;
}
CUTLASS_HOST_DEVICE StrideB stride_b(long long ldb) {
  StrideB s{};
#if GEMM_B_KMAJOR
  get<0>(s) = ldb;
#else
  get<1>(s) = ldb;
#endif
  return s;
}
CUTLASS_HOST_DEVICE StrideD stride_d(long long ldd) {
  StrideD s{};
  get<0>(s) = ldd;
  return s;
}

// Where the fields of the kernel's Params live, for the host side in Python (jitops/cutlass_host.py), which
// fills a zeroed Params buffer field by field: byte offsets and sizes computed by the compiler that built the
// kernel, in this order (jitops/cutlass_host.py, GEMM_LAYOUT_FIELDS, names them).  A TMA descriptor (128 bytes)
// is the first member of its TiledCopy.
using Params = typename GemmKernel::Params;
using MainloopParams = typename GemmKernel::MainloopParams;
using EpilogueParams = typename GemmKernel::EpilogueParams;
// (offsetof: libcu++'s under NVRTC (nvrtc_std.cuh), the null-pointer form that NVRTC 13.0 folds to a constant
// where it rejects __builtin_offsetof; the host compiler's elsewhere.  Params is not standard-layout, CUTLASS's tuples inherit;
// the compilers still lay it out as one fixed struct, and warn, which the sources silence: NVRTC's 1427.)
#define JITOPS_OFFSET(member) offsetof(Params, member)
#define JITOPS_GEMM_LAYOUT                                                                                 \
  sizeof(Params), alignof(Params), JITOPS_OFFSET(mode), JITOPS_OFFSET(problem_shape),                      \
      JITOPS_OFFSET(mainloop.tma_load_a), JITOPS_OFFSET(mainloop.tma_load_b),                              \
      JITOPS_OFFSET(mainloop.tma_transaction_bytes), CollectiveMainloop::TmaTransactionBytesMK,            \
      CollectiveMainloop::TmaTransactionBytesNK, JITOPS_OFFSET(epilogue.thread),                           \
      sizeof(EpilogueParams::thread), JITOPS_OFFSET(epilogue.tma_store_d),                                 \
      JITOPS_OFFSET(epilogue.tma_transaction_bytes), CollectiveEpilogue::TmaTransactionBytes,              \
      JITOPS_OFFSET(hw_info), JITOPS_OFFSET(scheduler),                                                  \
      GemmKernel::SharedStorageSize, GemmKernel::MaxThreadsPerBlock

#if !defined(__CUDACC_RTC__)
// CUTLASS's host-side arguments (the nvcc reference library and the host-logic fixtures of tests/test_gemm.py).
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

#endif  // !defined(__CUDACC_RTC__)

}  // namespace jitops_gemm
