// jitops grouped GEMM: a CUTLASS 3 ptr-array grouped GEMM for Hopper (sm_90a), D_g = A_g · B_g per group,
// fp32 accumulation, no C operand.  One translation unit is one kernel configuration; the compile-time facts
// arrive as -D macros from jitops/ops/grouped_gemm.py:
//   JG_ELEMENT  cutlass::bfloat16_t or cutlass::half_t (A, B and D share it)
//   JG_A_ROW    1: every A_g is row-major (K contiguous); 0: column-major (M contiguous)
//   JG_B_ROW    1: every B_g is row-major (N contiguous); 0: column-major (K contiguous)
//   JG_CONFIG   a tile configuration below (tile, cluster, schedule)
// D is always row-major.  The run-time facts (per-group sizes, pointers and leading dimensions) live in device
// arrays that a small setup kernel here fills on the GPU, so a ragged call needs no device-to-host copy:
//   jg_run_ragged  sizes from a device tensor of cumulative offsets (mixture of experts);
//   jg_run_list    one row of 9 int64 per group, built on the host and copied to the device by the caller.
// Both take the tile order (raster, swizzle) and return 0 or an error code; jg_error_string explains it.
#include <atomic>
#include <cstdint>
#include <vector>

#include <cuda_runtime.h>

// Only the Hopper pieces: the umbrella headers (collective_builder.hpp, gemm_universal.hpp and the device
// adapter) pull in every architecture's collectives and kernels, 40% more code for the compiler to read.
#include "cute/tensor.hpp"
#include "cutlass/cluster_launch.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/device_kernel.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/builders/sm90_gmma_builder.inl"
#include "cutlass/gemm/collective/collective_builder_decl.hpp"
#include "cutlass/gemm/collective/collective_mma_decl.hpp"
#include "cutlass/gemm/collective/sm90_mma_array_tma_gmma_ss_warpspecialized.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/gemm.h"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal_decl.h"
#include "cutlass/gemm/kernel/sm90_gemm_array_tma_warpspecialized_cooperative.hpp"
#include "cutlass/gemm/kernel/sm90_gemm_array_tma_warpspecialized_pingpong.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "cutlass/kernel_launch.h"

#ifndef JG_ELEMENT
#define JG_ELEMENT cutlass::bfloat16_t
#endif
#ifndef JG_A_ROW
#define JG_A_ROW 1
#endif
#ifndef JG_B_ROW
#define JG_B_ROW 1
#endif
#ifndef JG_CONFIG
#define JG_CONFIG coop_128x256x64_c2x1
#endif

#define JG_EXPORT extern "C" __attribute__((visibility("default")))

namespace jg {
using namespace cute;

// ---- tile configurations ----------------------------------------------------------------------------------
// Cooperative: two consumer warpgroups share one tile.  Ping-pong: each consumer warpgroup owns a tile, so one
// warpgroup's epilogue overlaps the other's main loop (short K loops, small tiles).
struct Cooperative {
  using Kernel = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
  using Epilogue = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
};
struct Pingpong {
  using Kernel = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong;
  using Epilogue = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;
};

// Large problems: the dense-GEMM tile that reached ~780 TFLOP/s bf16 on the lent H100.
struct coop_128x256x64_c2x1 : Cooperative {
  using Tile = Shape<_128, _256, _64>;
  using Cluster = Shape<_2, _1, _1>;
};
// Small ragged groups (32-256 rows): 128-row tiles, no cluster, so a group of <= 128 rows wastes no CTA.
struct coop_128x128x64_c1x1 : Cooperative {
  using Tile = Shape<_128, _128, _64>;
  using Cluster = Shape<_1, _1, _1>;
};
// Small ragged groups, 64-row tiles: less padding on groups that are not multiples of 128 rows.
struct pong_64x128x64_c1x1 : Pingpong {
  using Tile = Shape<_64, _128, _64>;
  using Cluster = Shape<_1, _1, _1>;
};
// Small groups, 128-row tiles, a 1x2 cluster: the two CTAs of a cluster share A through multicast.
struct coop_128x128x64_c1x2 : Cooperative {
  using Tile = Shape<_128, _128, _64>;
  using Cluster = Shape<_1, _2, _1>;
};
// Ping-pong with 128-row tiles per warpgroup.
struct pong_128x128x64_c1x1 : Pingpong {
  using Tile = Shape<_128, _128, _64>;
  using Cluster = Shape<_1, _1, _1>;
};
// Groups of up to 256 rows in one M tile: each B panel (an expert's weight columns) is read once, no cluster.
struct coop_256x128x64_c1x1 : Cooperative {
  using Tile = Shape<_256, _128, _64>;
  using Cluster = Shape<_1, _1, _1>;
};
// The same with a 1x2 cluster: A is multicast to the two N tiles of a cluster.
struct coop_256x128x64_c1x2 : Cooperative {
  using Tile = Shape<_256, _128, _64>;
  using Cluster = Shape<_1, _2, _1>;
};
// The large tile without a cluster: no CTA idles on a group with a single M tile.
struct coop_128x256x64_c1x1 : Cooperative {
  using Tile = Shape<_128, _256, _64>;
  using Cluster = Shape<_1, _1, _1>;
};
// Ping-pong, 64-row tiles per warpgroup with wide N: little row padding, B panels of 256 columns.
struct pong_64x256x64_c1x1 : Pingpong {
  using Tile = Shape<_64, _256, _64>;
  using Cluster = Shape<_1, _1, _1>;
};

using Config = JG_CONFIG;
using Element = JG_ELEMENT;
using Accumulator = float;
using LayoutA = cute::conditional_t<JG_A_ROW, cutlass::layout::RowMajor, cutlass::layout::ColumnMajor>;
using LayoutB = cute::conditional_t<JG_B_ROW, cutlass::layout::RowMajor, cutlass::layout::ColumnMajor>;
using LayoutD = cutlass::layout::RowMajor;
constexpr int kAlignment = 16 / sizeof(Element);  // TMA: 16-byte aligned addresses and leading dimensions

using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;  // (M, N, K) per group

using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, typename Config::Tile, typename Config::Cluster,
    cutlass::epilogue::collective::EpilogueTileAuto, Accumulator, Accumulator,
    void, LayoutD*, kAlignment,  // no C operand
    Element, LayoutD*, kAlignment, typename Config::Epilogue,
    cutlass::epilogue::fusion::LinearCombination<Element, Accumulator, void, Accumulator>>::CollectiveOp;

using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA*, kAlignment, Element, LayoutB*,
    kAlignment, Accumulator, typename Config::Tile, typename Config::Cluster,
    cutlass::gemm::collective::StageCountAutoCarveout<
        static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
    typename Config::Kernel>::CollectiveOp;

using GemmKernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
using StrideA = typename GemmKernel::InternalStrideA;
using StrideB = typename GemmKernel::InternalStrideB;
using StrideD = typename GemmKernel::InternalStrideD;
using Shape3 = typename ProblemShape::UnderlyingProblemShape;

// A stride type has one dynamic mode (the leading dimension) and static unit/zero modes.
template <class Stride>
CUTLASS_HOST_DEVICE Stride leading(int64_t ld) {
  Stride s{};
  if constexpr (cute::is_static<cute::remove_cvref_t<decltype(get<0>(s))>>::value) {
    get<1>(s) = ld;
  } else {
    get<0>(s) = ld;
  }
  return s;
}

// ---- per-group arrays, laid out at the front of the caller's workspace ----------------------------------------
struct Arrays {
  Shape3* shapes;
  Element const** a;
  Element const** b;
  Element** d;
  StrideA* sa;
  StrideB* sb;
  StrideD* sd;
  void* cutlass_workspace;
};

constexpr size_t kAlign = 256;
inline size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

inline size_t arrays_bytes(int groups) {
  size_t g = static_cast<size_t>(groups > 0 ? groups : 1);
  return round_up(g * sizeof(Shape3), kAlign) + 3 * round_up(g * sizeof(void*), kAlign) +
         round_up(g * sizeof(StrideA), kAlign) + round_up(g * sizeof(StrideB), kAlign) +
         round_up(g * sizeof(StrideD), kAlign);
}

inline Arrays carve(void* workspace, int groups) {
  size_t g = static_cast<size_t>(groups > 0 ? groups : 1);
  char* p = static_cast<char*>(workspace);
  Arrays r;
  r.shapes = reinterpret_cast<Shape3*>(p);                 p += round_up(g * sizeof(Shape3), kAlign);
  r.a = reinterpret_cast<Element const**>(p);              p += round_up(g * sizeof(void*), kAlign);
  r.b = reinterpret_cast<Element const**>(p);              p += round_up(g * sizeof(void*), kAlign);
  r.d = reinterpret_cast<Element**>(p);                    p += round_up(g * sizeof(void*), kAlign);
  r.sa = reinterpret_cast<StrideA*>(p);                    p += round_up(g * sizeof(StrideA), kAlign);
  r.sb = reinterpret_cast<StrideB*>(p);                    p += round_up(g * sizeof(StrideB), kAlign);
  r.sd = reinterpret_cast<StrideD*>(p);                    p += round_up(g * sizeof(StrideD), kAlign);
  r.cutlass_workspace = p;
  return r;
}

// raster: 0 walks M tiles first within a group (the M tiles of one N tile run side by side and share its B panel
// through L2), 1 walks N first.  swizzle: 1, 2, 4 or 8 tiles along the other dimension before moving on.
typename GemmKernel::Arguments make_arguments(int groups, Arrays const& arrays, Shape3 const* host_shapes,
                                             int sm_count, int raster = 0, int swizzle = 1) {
  typename GemmKernel::Arguments args;
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  args.problem_shape = {groups, arrays.shapes, host_shapes};
  args.mainloop = {arrays.a, arrays.sa, arrays.b, arrays.sb};
  args.epilogue.ptr_C = nullptr;
  args.epilogue.dC = nullptr;
  args.epilogue.ptr_D = arrays.d;
  args.epilogue.dD = arrays.sd;
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = 0.0f;
  args.hw_info.device_id = 0;  // only read when sm_count is 0
  args.hw_info.sm_count = sm_count;
  using Raster = cutlass::gemm::kernel::detail::RasterOrderOptions;
  args.scheduler.raster_order = raster == 1 ? Raster::AlongN : Raster::AlongM;
  args.scheduler.max_swizzle_size = swizzle;
  return args;
}

// ---- setup kernels -------------------------------------------------------------------------------------------
// Ragged modes (which dimension the offsets split):
//   0 M:  A (T, K) ragged rows,  B (G, K, N) per group,  D (T, N) ragged rows
//   1 K:  A (M, T) ragged cols,  B (T, N) ragged rows,   D (G, M, N) per group   (weight gradients)
//   2 N:  A (G, M, K) per group, B (K, T) ragged cols,   D (M, T) ragged cols
// Each operand steps by `step` elements per ragged index (ragged operands) or per group (the others).
struct RaggedParams {
  int mode;
  int groups;
  int const* offsets;  // cumulative end offsets, int32, length groups
  int64_t total;       // extent of the ragged dimension
  int m, n, k;         // the non-ragged extents (the ragged one is ignored)
  Element const* a;
  int64_t a_step, a_ld;
  Element const* b;
  int64_t b_step, b_ld;
  Element* d;
  int64_t d_step, d_ld;
};

__device__ __forceinline__ int64_t clamp_offset(int v, int64_t total) {
  return v < 0 ? 0 : (v > total ? total : static_cast<int64_t>(v));
}

// grid (groups, fill_blocks): block (g, 0) thread 0 writes group g's entry.  In mode K an empty group
// (size 0) is given M = 0, so the GEMM skips it (CUTLASS leaves K = 0 accumulators uninitialized), and all
// blocks (g, *) write its D_g = 0 instead.  Offsets are clamped into [0, total]: bad offsets give wrong
// results, never an out-of-bounds access.
__global__ void ragged_setup(RaggedParams p, Arrays arrays) {
  int g = blockIdx.x;
  int64_t end = clamp_offset(p.offsets[g], p.total);
  int64_t start = g == 0 ? 0 : clamp_offset(p.offsets[g - 1], p.total);
  int64_t size = end > start ? end - start : 0;
  if (blockIdx.y == 0 && threadIdx.x == 0) {
    int m = p.m, n = p.n, k = p.k;
    int64_t ia = g, ib = g, id = g;  // index each operand steps by
    if (p.mode == 0) {
      m = static_cast<int>(size);
      ia = start;
      id = start;
    } else if (p.mode == 1) {
      k = static_cast<int>(size);
      if (size == 0) m = 0;
      ia = start;
      ib = start;
    } else {
      n = static_cast<int>(size);
      ib = start;
      id = start;
    }
    arrays.shapes[g] = Shape3{m, n, k};
    arrays.a[g] = p.a + ia * p.a_step;
    arrays.b[g] = p.b + ib * p.b_step;
    arrays.d[g] = p.d + id * p.d_step;
    arrays.sa[g] = leading<StrideA>(p.a_ld);
    arrays.sb[g] = leading<StrideB>(p.b_ld);
    arrays.sd[g] = leading<StrideD>(p.d_ld);
  }
  if (p.mode == 1 && size == 0) {  // D_g (m x n, row-major, leading dimension d_ld) = 0
    Element* d = p.d + g * p.d_step;
    int64_t count = static_cast<int64_t>(p.m) * p.n;
    int64_t stride = static_cast<int64_t>(gridDim.y) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; i < count; i += stride) {
      d[(i / p.n) * p.d_ld + i % p.n] = Element(0);
    }
  }
}

// One row of 9 int64 per group: M, N, K, A pointer, A leading dimension, B pointer, ldB, D pointer, ldD.
__global__ void list_setup(int groups, int64_t const* rows, Arrays arrays) {
  int g = blockIdx.x * blockDim.x + threadIdx.x;
  if (g >= groups) return;
  int64_t const* r = rows + 9 * g;
  arrays.shapes[g] = Shape3{static_cast<int>(r[0]), static_cast<int>(r[1]), static_cast<int>(r[2])};
  arrays.a[g] = reinterpret_cast<Element const*>(r[3]);
  arrays.sa[g] = leading<StrideA>(r[4]);
  arrays.b[g] = reinterpret_cast<Element const*>(r[5]);
  arrays.sb[g] = leading<StrideB>(r[6]);
  arrays.d[g] = reinterpret_cast<Element*>(r[7]);
  arrays.sd[g] = leading<StrideD>(r[8]);
}

// ---- errors --------------------------------------------------------------------------------------------------
// 0 ok; 1000 + cudaError_t; 2000 + cutlass::Status.
constexpr int kCudaBase = 1000;
constexpr int kCutlassBase = 2000;
constexpr int kBadArguments = 3000;
constexpr int kMaxDevices = 64;

// What cutlass::gemm::device::GemmUniversalAdapter does for an sm90 kernel: workspace, params, shared
// memory limit, cluster launch.
int run_gemm(int groups, Arrays const& arrays, Shape3 const* host_shapes, size_t workspace_bytes, int sm_count,
             int raster, int swizzle, cudaStream_t stream) {
  if (raster < 0 || raster > 1 || !(swizzle == 1 || swizzle == 2 || swizzle == 4 || swizzle == 8)) {
    return kBadArguments;
  }
  typename GemmKernel::Arguments args = make_arguments(groups, arrays, host_shapes, sm_count, raster, swizzle);
  size_t needed = GemmKernel::get_workspace_size(args);
  size_t used = static_cast<size_t>(static_cast<char*>(arrays.cutlass_workspace) -
                                    reinterpret_cast<char*>(arrays.shapes));
  if (used + needed > workspace_bytes) return kBadArguments;
  if (!GemmKernel::can_implement(args)) return kCutlassBase + static_cast<int>(cutlass::Status::kErrorInvalidProblem);
  cutlass::Status status = GemmKernel::initialize_workspace(args, arrays.cutlass_workspace, stream);
  if (status != cutlass::Status::kSuccess) return kCutlassBase + static_cast<int>(status);
  typename GemmKernel::Params params = GemmKernel::to_underlying_arguments(args, arrays.cutlass_workspace);

  constexpr int smem = GemmKernel::SharedStorageSize;
  static std::atomic<bool> smem_set[kMaxDevices] = {};  // the attribute is per function and device
  int device = 0;
  cudaGetDevice(&device);
  if (device < 0 || device >= kMaxDevices || !smem_set[device].load(std::memory_order_relaxed)) {
    cudaError_t error = cudaFuncSetAttribute(cutlass::device_kernel<GemmKernel>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (error != cudaSuccess) return kCudaBase + static_cast<int>(error);
    if (device >= 0 && device < kMaxDevices) smem_set[device].store(true, std::memory_order_relaxed);
  }
  dim3 grid = GemmKernel::get_grid_shape(params);
  dim3 block = GemmKernel::get_block_shape();
  using Cluster = typename Config::Cluster;
  if constexpr (size(Cluster{}) == 1) {
    status = cutlass::kernel_launch<GemmKernel>(grid, block, smem, stream, params, false);
  } else {
    dim3 cluster(size<0>(Cluster{}), size<1>(Cluster{}), size<2>(Cluster{}));
    void* kernel_params[] = {&params};
    status = cutlass::ClusterLauncher::launch(grid, cluster, block, smem, stream,
                                              reinterpret_cast<void const*>(cutlass::device_kernel<GemmKernel>),
                                              kernel_params);
  }
  cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) return kCudaBase + static_cast<int>(error);
  return status == cutlass::Status::kSuccess ? 0 : kCutlassBase + static_cast<int>(status);
}

}  // namespace jg

// ---- C ABI ---------------------------------------------------------------------------------------------------
// Bytes of device workspace a call with `groups` groups needs (per-group arrays + CUTLASS's own workspace).
JG_EXPORT int64_t jg_workspace_bytes(int32_t groups, int32_t sm_count) {
  jg::Arrays arrays = jg::carve(nullptr, groups);
  auto args = jg::make_arguments(groups, arrays, nullptr, sm_count);
  return static_cast<int64_t>(jg::arrays_bytes(groups) + jg::GemmKernel::get_workspace_size(args) + jg::kAlign);
}

JG_EXPORT int32_t jg_run_ragged(int32_t mode, int32_t groups, void const* offsets, int64_t total, int32_t m,
                                int32_t n, int32_t k, void const* a, int64_t a_step, int64_t a_ld, void const* b,
                                int64_t b_step, int64_t b_ld, void* d, int64_t d_step, int64_t d_ld,
                                void* workspace, int64_t workspace_bytes, int32_t sm_count, int32_t fill_blocks,
                                int32_t raster, int32_t swizzle, void* stream_handle) {
  if (groups <= 0 || mode < 0 || mode > 2 || fill_blocks < 1) return jg::kBadArguments;
  cudaStream_t stream = static_cast<cudaStream_t>(stream_handle);
  jg::Arrays arrays = jg::carve(workspace, groups);
  jg::RaggedParams p{mode, groups, static_cast<int const*>(offsets), total, m, n, k,
                     static_cast<jg::Element const*>(a), a_step, a_ld,
                     static_cast<jg::Element const*>(b), b_step, b_ld,
                     static_cast<jg::Element*>(d), d_step, d_ld};
  jg::ragged_setup<<<dim3(groups, mode == 1 ? fill_blocks : 1), 256, 0, stream>>>(p, arrays);
  cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) return jg::kCudaBase + static_cast<int>(error);
  return jg::run_gemm(groups, arrays, nullptr, static_cast<size_t>(workspace_bytes), sm_count, raster, swizzle,
                      stream);
}

// rows_device: groups x 9 int64 on the device; rows_host: the same rows in host memory (sizes for CUTLASS's
// checks and its grid), or null.
JG_EXPORT int32_t jg_run_list(int32_t groups, void const* rows_device, void const* rows_host, void* workspace,
                              int64_t workspace_bytes, int32_t sm_count, int32_t raster, int32_t swizzle,
                              void* stream_handle) {
  if (groups <= 0) return jg::kBadArguments;
  cudaStream_t stream = static_cast<cudaStream_t>(stream_handle);
  jg::Arrays arrays = jg::carve(workspace, groups);
  std::vector<jg::Shape3> host_shapes;
  if (rows_host != nullptr) {
    auto rows = static_cast<int64_t const*>(rows_host);
    host_shapes.reserve(groups);
    for (int g = 0; g < groups; ++g) {
      host_shapes.push_back(jg::Shape3{static_cast<int>(rows[9 * g]), static_cast<int>(rows[9 * g + 1]),
                                       static_cast<int>(rows[9 * g + 2])});
    }
  }
  jg::list_setup<<<(groups + 127) / 128, 128, 0, stream>>>(groups, static_cast<int64_t const*>(rows_device), arrays);
  cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) return jg::kCudaBase + static_cast<int>(error);
  return jg::run_gemm(groups, arrays, host_shapes.empty() ? nullptr : host_shapes.data(),
                      static_cast<size_t>(workspace_bytes), sm_count, raster, swizzle, stream);
}

JG_EXPORT char const* jg_error_string(int32_t code) {
  if (code == 0) return "success";
  if (code == jg::kBadArguments) return "bad arguments (groups, mode or workspace size)";
  if (code >= jg::kCutlassBase) return cutlassGetStatusString(static_cast<cutlass::Status>(code - jg::kCutlassBase));
  if (code >= jg::kCudaBase) return cudaGetErrorString(static_cast<cudaError_t>(code - jg::kCudaBase));
  return "unknown error";
}
