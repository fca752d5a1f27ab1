// jitops conv2d, one kernel configuration per translation unit (built by jitops' nvcc backend).
//
// Defines from the shape class (jitops/ops/conv2d.py):
//   CONV_OP        0 fprop (y = x * w), 1 dgrad (dx from dy and w, unit stride), 2 wgrad (dw from dy and x)
//   SPLIT_K        1: fp32 partial sums over slices of GEMM-K (always for wgrad)
//   ELEMENT        cutlass::half_t or cutlass::bfloat16_t
//   TILE_M, TILE_N tile of the implicit GEMM (TILE_K is 64: one 128-byte swizzle row of fp16/bf16); TILE_M 64
//                  splits the tile between the two consumer warpgroups by columns
//   CLUSTER_M, CLUSTER_N  thread block cluster (TMA multicast of the operand the cluster shares)
//   TILE_TAPS      wgrad: filter taps (consecutive s) per tile, TILE_N / TILE_TAPS channels each (default 1:
//                  a tile covers channels of one tap; conv_sm90.cuh, WgradTapSpanning): only for layers of
//                  exactly that many channels and taps per filter row, stored flat (WGRAD_FLAT)
//
// Tensors are NHWC (activations, gradients) and KRSC (filters), channel-contiguous, 16-byte aligned, channel
// counts multiples of 8 (the Python side pads others).  The filter size, stride, padding and dilation are
// run-time arguments: CUTLASS 3 builds the TMA im2col descriptors from them on the host at every call.
#include "conv_sm90.cuh"

#define EXPORT extern "C" __attribute__((visibility("default")))

namespace jitops_conv2d_tu {

using namespace cute;
using Element = ELEMENT;
using cutlass::conv::Operator;
constexpr Operator kOp = CONV_OP == 0 ? Operator::kFprop : CONV_OP == 1 ? Operator::kDgrad : Operator::kWgrad;
#ifndef TILE_TAPS
#define TILE_TAPS 1
#endif
// wgrad's N mode is the filter's (C,S,R), so its tile is nested like it (as in CUTLASS's wgrad tests): channels,
// or channels x taps along s.
using WgradTileN = cute::conditional_t<TILE_TAPS == 1, Shape<Int<TILE_N>>,
                                       Shape<Int<TILE_N / TILE_TAPS>, Int<TILE_TAPS>>>;
using TileShape = cute::conditional_t<kOp == Operator::kWgrad,
    Shape<Int<TILE_M>, WgradTileN, Shape<_64>>, Shape<Int<TILE_M>, Int<TILE_N>, Shape<_64>>>;
using ClusterShape = Shape<Int<CLUSTER_M>, Int<CLUSTER_N>, _1>;

// SPLIT_K (fprop, dgrad; wgrad always splits): the kernel writes fp32 partial sums of `splits` slices of
// GEMM-K, packed [split][M][N] (M = N*P*Q or N*H*W linear, N = channels), and the caller reduces them.
// WGRAD_DIRECT (wgrad, one slice, K and C multiples of 8): the kernel writes dw itself, KRSC in ELEMENT, where
// the fp32 slice and torch's copy into dw cost 2-4 us more on the 7x7 layers (bench_conv2d.py, H100).
#ifndef SPLIT_K
#define SPLIT_K 0
#endif
#ifndef WGRAD_DIRECT
#define WGRAD_DIRECT 0
#endif
// WGRAD_FLAT (wgrad): the epilogue sees dw (or a slice) as the flat row-major matrix K x (R*S*C) it is in memory
// and stores it through TMA.  Only where the mainloop's tiles of the hierarchical N mode (C,S,R) are flat column
// ranges too: C a multiple of TILE_N, a 1x1 filter, or a tile over a whole filter row (TILE_TAPS).  Otherwise
// (a 128-wide tile over 64 channels of a 3x3 filter covers the 64 channels of one tap and 64 empty columns) the
// epilogue follows the hierarchical mode, storing from registers.
#ifndef WGRAD_FLAT
#define WGRAD_FLAT 0
#endif
constexpr bool kSplitK = kOp == Operator::kWgrad || SPLIT_K;
constexpr bool kWgradDirect = kOp == Operator::kWgrad && WGRAD_DIRECT;
constexpr bool kWgradFlat = kOp == Operator::kWgrad && WGRAD_FLAT;
static_assert(TILE_TAPS == 1 || kWgradFlat, "a tile over several taps covers a whole filter row: WGRAD_FLAT");

// Outputs: fprop y (NHWC, + per-channel bias), dgrad dx (NHWC, any strides: a phase of a strided dgrad writes
// every stride-th pixel), split-K fp32 partials: wgrad [splits][K][R][S][C], fprop/dgrad [splits][M][N];
// direct wgrad dw [K][R][S][C] in ELEMENT.
using ElementD = cute::conditional_t<kSplitK && !kWgradDirect, float, Element>;
using StrideWgradD = Stride<int64_t, Stride<_1, int64_t, int64_t>, int64_t>;  // (K, (C,S,R), split)
using StridePartialD = Stride<int64_t, _1, int64_t>;                           // (M, N, split), N contiguous
using LayoutD = cute::conditional_t<kOp == Operator::kWgrad && !kWgradFlat, StrideWgradD,
                cute::conditional_t<kSplitK, StridePartialD, cutlass::layout::TensorNHWC>>;
using FusionOp = cute::conditional_t<kOp == Operator::kFprop && !kSplitK,
    cutlass::epilogue::fusion::LinCombPerColBias<ElementD, float, Element, ElementD, float>,
    cutlass::epilogue::fusion::LinearCombination<ElementD, float, void, float>>;
using EpilogueTileShape = cute::conditional_t<kWgradFlat, Shape<Int<TILE_M>, Int<TILE_N>, _64>, TileShape>;

// Outputs store through TMA: an im2col store of NHWC tiles, or wgrad's flat matrix (whose element-by-element
// stores from registers, 2 or 4 bytes each, had 4x the ideal L2 sectors and stalled the 7x7 layers' short
// kernels: Nsight Compute, H100).  Written straight from registers: fprop/dgrad partial sums (their
// linearized M mode is hierarchical; they are small next to the operands), wgrad's hierarchical output, and
// its 64-row tiles (their two warpgroups split the tile by columns, so an epilogue sub-tile belongs to one of
// them, which the cooperative TMA epilogue's shared-memory copies cannot express).
constexpr bool kRegisterEpilogue = kOp == Operator::kWgrad ? !kWgradFlat || TILE_M == 64 : kSplitK;
using EpilogueSchedule = cute::conditional_t<kRegisterEpilogue,
    cutlass::epilogue::NoSmemWarpSpecialized, cutlass::epilogue::TmaWarpSpecializedCooperative>;
using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, EpilogueTileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float,
    void, LayoutD, 16 / sizeof(ElementD),
    ElementD, LayoutD, 16 / sizeof(ElementD),
    EpilogueSchedule, FusionOp>::CollectiveOp;

using MainloopTypes = jitops::conv::Mainloop<kOp, Element, TileShape, ClusterShape,
                                             int(sizeof(typename CollectiveEpilogue::SharedStorage)), TILE_TAPS>;
using Kernel = jitops::conv::ConvKernelCooperative<typename MainloopTypes::Collective, CollectiveEpilogue, kSplitK,
                                                   kWgradFlat>;
using ProblemShape = typename Kernel::ProblemShape;

}  // namespace jitops_conv2d_tu
using namespace jitops_conv2d_tu;

// a, b, d by operator (CUTLASS's naming: "activation" x, "filter" w, "xformed activation" y):
//   fprop: a = x [n,h,w,c], b = w [k,r,s,c], d = y [n,p,q,k], bias [k] or null
//   dgrad: a = dy [n,p,q,k], b = w, d = dx [n,h,w,c] with element strides (d_sn, d_sh, d_sw, 1)
//   wgrad: a = dy, b = x, d = fp32 partials [splits][k][r][s][c] (WGRAD_DIRECT: dw [k][r][s][c], splits 1)
//   SPLIT_K fprop/dgrad: d = fp32 partials [splits][n*p*q][k] / [splits][n*h*w][c]
// (n, h, w, c) always describe x/dx, (k, r, s) the filter; padding is (lower, upper) per dimension.
EXPORT int jitops_conv2d(const void* a, const void* b, void* d, const void* bias,
                         int n, int h, int w, int c, int k, int r, int s,
                         int pad_h, int pad_h_hi, int pad_w, int pad_w_hi,
                         int stride_h, int stride_w, int dil_h, int dil_w,
                         long long d_sn, long long d_sh, long long d_sw,
                         int splits, int device, int sm_count, void* stream) {
  using Extent = typename ProblemShape::TensorExtent;
  using Strides = typename ProblemShape::TensorStride;
  Extent act{n, h, w, c};
  Extent flt{k, r, s, c};
  Strides act_stride{int64_t(h) * w * c, int64_t(w) * c, c, 1};
  if (kOp == Operator::kDgrad && !kSplitK) {
    act_stride = Strides{d_sn, d_sh, d_sw, 1};
  }
  Strides flt_stride{int64_t(r) * s * c, int64_t(s) * c, c, 1};
  ProblemShape problem(cutlass::conv::Mode::kCrossCorrelation, act, act_stride, flt, flt_stride,
                       {pad_h, pad_w}, {pad_h_hi, pad_w_hi}, {stride_h, stride_w}, {dil_h, dil_w}, 1);

  // The epilogue's stride of D, from the problem's C tensor (y for fprop, dx for dgrad, w for wgrad).
  // (Generic lambdas: `if constexpr` discards only inside templates.)
  typename CollectiveEpilogue::StrideD stride_d{};
  [&](auto& sd) {
    if constexpr (kWgradFlat) {  // packed [split][K][R*S*C]
      get<0>(sd) = int64_t(r) * s * c;
      get<2>(sd) = int64_t(k) * r * s * c;
    } else if constexpr (kOp == Operator::kWgrad) {
      get<0>(sd) = problem.stride_C[0];
      get<1, 1>(sd) = problem.stride_C[2];
      get<1, 2>(sd) = problem.stride_C[1];
      get<2>(sd) = int64_t(k) * r * s * c;
    } else if constexpr (kSplitK) {  // packed [split][M][N]
      int64_t m = int64_t(problem.shape_C[0]) * problem.shape_C[1] * problem.shape_C[2];
      int64_t channels = problem.shape_C[3];
      get<0>(sd) = channels;
      get<2>(sd) = m * channels;
    } else {
      get<0, 0>(sd) = problem.stride_C[2];
      get<0, 1>(sd) = problem.stride_C[1];
      get<0, 2>(sd) = problem.stride_C[0];
    }
  }(stride_d);

  typename Kernel::Arguments args;
  args.problem_shape = problem;
  args.mainloop = {static_cast<Element const*>(a), static_cast<Element const*>(b)};
  args.epilogue.dD = stride_d;
  args.epilogue.dC = stride_d;
  args.epilogue.ptr_C = nullptr;
  args.epilogue.ptr_D = static_cast<ElementD*>(d);
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = 0.0f;
  [&](auto& thread) {
    if constexpr (kOp == Operator::kFprop && !kSplitK) {  // split-K adds the bias in the reduction
      thread.bias_ptr = static_cast<Element const*>(bias);
    }
  }(args.epilogue.thread);
  args.hw_info.device_id = device;
  args.hw_info.sm_count = sm_count;
  args.splits = splits;
  if (kWgradDirect && splits != 1) {
    return jitops::conv::kCannotImplement;
  }
  return jitops::conv::launch<Kernel>(args, static_cast<cudaStream_t>(stream));
}

// Introspection for tests and benchmarks: 0 tile M, 1 tile N, 2 pipeline stages, 3 shared memory bytes,
// 4 threads per block, 5 operator, 6 split-K, 7 direct wgrad, 8 flat wgrad output, 9 filter taps per tile.
EXPORT int jitops_conv2d_info(int what) {
  switch (what) {
    case 0: return TILE_M;
    case 1: return TILE_N;
    case 2: return MainloopTypes::Stages;
    case 3: return Kernel::SharedStorageSize;
    case 4: return int(Kernel::MaxThreadsPerBlock);
    case 5: return CONV_OP;
    case 6: return kSplitK ? 1 : 0;
    case 7: return kWgradDirect ? 1 : 0;
    case 8: return kWgradFlat ? 1 : 0;
    case 9: return TILE_TAPS;
    default: return -1;
  }
}
