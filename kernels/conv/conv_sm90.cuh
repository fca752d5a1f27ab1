// jitops conv2d on Hopper (sm_90a): implicit GEMM with TMA im2col loads and wgmma, NHWC / KRSC layouts.
//
// The mainloop and epilogue are CUTLASS 3's sm90 conv collectives (CollectiveConv with TMA im2col, the sm90
// TMA warp-specialized epilogue).  The kernel around them is ours: CUTLASS 4.2 runs sm90 conv collectives only
// inside its non-persistent kernel with ONE consumer warpgroup (dispatch_policy.hpp: "Persistent schedules not
// support for conv yet"), whose 128xN tile and serial epilogue cap it well below what a 2-warpgroup tile on a
// persistent grid reaches.  ConvKernelCooperative below follows the structure of CUTLASS's
// sm90_gemm_tma_warpspecialized_cooperative.hpp (one producer warpgroup, two consumer warpgroups sharing a
// 128xN tile, a static persistent tile scheduler), reduced to what conv needs and made aware of conv problem
// shapes (im2col-linearized M/K modes; hierarchical N for wgrad).
//
// Split-K: the GEMM-K of wgrad is N*P*Q, often 10^5, while M x N (K x C*R*S) can be a single tile; fprop and
// dgrad of the 7x7 and 14x14 layers have few output tiles and long K.  The kernel takes `splits`: work tile
// (m, n, l) reduces k-tiles [l*kps, (l+1)*kps) and writes its partial sum to slice l of an fp32 output
// [splits][M][N]; the caller sums the slices (deterministic, no atomics).
#pragma once

#include <cuda_runtime.h>

#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cute/arch/cluster_sm90.hpp"
#include "cutlass/arch/reg_reconfig.h"
#include "cutlass/barrier.h"
#include "cutlass/cluster_launch.hpp"
#include "cutlass/device_kernel.h"
#include "cutlass/kernel_hardware_info.hpp"
#include "cutlass/pipeline/pipeline.hpp"
#include "cutlass/conv/convolution.h"
#include "cutlass/conv/convnd_problem_shape.hpp"
#include "cutlass/conv/detail.hpp"
#include "cutlass/conv/dispatch_policy.hpp"
#include "cutlass/conv/collective/collective_conv.hpp"
#include "cutlass/conv/collective/builders/sm90_common.inl"
#include "cutlass/gemm/collective/builders/sm90_common.inl"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"

namespace jitops::conv {

using namespace cute;
using cutlass::conv::Operator;

// A schedule tag of our own: CUTLASS's conv dispatch policy rejects its Cooperative tag by name, and its
// GemmUniversal would dispatch a KernelTmaWarpSpecializedCooperative schedule to a GEMM-only kernel.  This tag
// only selects our kernel below.
struct KernelConvCooperative {};

// ---- wgrad tiles that span filter taps --------------------------------------------------------------------
// CUTLASS's collective loads wgrad's B operand (x, through TMA im2col) as boxes of channels at one filter tap
// and tiles the (C,S,R) mode by channels, so a tile wider than C multiplies zeros: on a 64-channel 3x3 layer a
// 128-wide tile is half empty (9 work tiles of 64 useful columns instead of 5), which is why that layer ran at
// half of cuDNN's speed.  This collective takes a tile of TapsPerTile taps (consecutive s of one r) of
// TILE_N / TapsPerTile channels each, e.g. 64 channels x 3 taps = 192 columns, all of a 3x3 filter's row, and
// loads its B tile as TapsPerTile boxes, one per tap, into consecutive column ranges of the stage.  dy (the A
// tile) is then loaded once for three taps instead of once per tap.  Everything but the loads is CUTLASS's.
template <class Base, class SmemLayoutAtomB, int TapsPerTile>
struct WgradTapSpanning : Base {
  using TileShape = typename Base::TileShape;
  using ProblemShape = typename Base::ProblemShape;
  using Arguments = typename Base::Arguments;
  using StrideB = typename Base::StrideB;
  using InternalElementB = typename Base::InternalElementB;
  using SmemLayoutA = typename Base::SmemLayoutA;
  using MainloopPipeline = typename Base::MainloopPipeline;
  using PipelineState = typename Base::PipelineState;
  using TensorStorage = typename Base::TensorStorage;
  using ClusterShape = typename Base::DispatchPolicy::ClusterShape;
  static_assert(size(ClusterShape{}) == 1, "tap-spanning tiles take no cluster");

  static constexpr int TapChannels = size<1>(TileShape{}) / TapsPerTile;
  // One tap's B tile: the stage's columns [j * TapChannels, (j + 1) * TapChannels), laid out as the stage's
  // B tile is (swizzle atoms along K first, then along N), so that it starts j * TapElements in.
  using SmemLayoutBTap = decltype(tile_to_shape(
      SmemLayoutAtomB{}, make_shape(Int<TapChannels>{}, size<2>(TileShape{})), Step<_2, _1>{}));
  static constexpr int TapElements = TapChannels * size<2>(TileShape{});
  static constexpr int StageElementsB = size<1>(TileShape{}) * size<2>(TileShape{});
  using TapTileShape = Shape<decltype(get<0>(TileShape{})), Shape<Int<TapChannels>>, decltype(get<2>(TileShape{}))>;

  template <class TensorB>
  static auto make_tap_tma(TensorB const& tensor_b, ProblemShape const& problem_shape) {
    namespace detail = cutlass::conv::collective::detail;
    auto lower_corner_whd = detail::compute_lower_corner_whd(problem_shape);
    auto upper_corner_whd = detail::compute_upper_corner_whd(problem_shape);
    auto lower_srt = detail::compute_lower_srt(problem_shape);
    return make_im2col_tma_copy(
        typename Base::GmemTiledCopyB{}, tensor_b, SmemLayoutBTap{}, product_each(shape(SmemLayoutBTap{})),
        size<0>(ClusterShape{}), shape(lower_corner_whd), shape(upper_corner_whd),
        cute::reverse(shape(problem_shape.lower_padding)), cute::reverse(shape(problem_shape.upper_padding)),
        cute::reverse(shape(problem_shape.traversal_stride)), shape(lower_srt),
        cute::reverse(shape(problem_shape.dilation)));
  }
  using TmaLoadBTap = decltype(make_tap_tma(
      make_tensor(make_gmem_ptr(static_cast<InternalElementB const*>(nullptr)),
                  make_layout(typename Base::Params::TensorShapeB{}, StrideB{})),
      ProblemShape{}));

  struct Params : Base::Params {
    TmaLoadBTap tma_load_b_tap;
  };

  static Params to_underlying_arguments(ProblemShape const& problem_shape, Arguments const& args, void* workspace) {
    auto stride_b = cutlass::make_cute_packed_stride(StrideB{}, problem_shape.stride_B, Base::DispatchPolicy::ConvOp);
    auto tensor_b = make_tensor(make_gmem_ptr(reinterpret_cast<InternalElementB const*>(args.ptr_B)),
                                make_layout(problem_shape.get_shape_B(), stride_b));
    return {Base::to_underlying_arguments(problem_shape, args, workspace), make_tap_tma(tensor_b, problem_shape)};
  }

  // A tile is one whole filter row: C = TapChannels and S = TapsPerTile (wgrad's shape_C is the filter, KRSC),
  // so that its columns are the flat range [r * S * C, (r + 1) * S * C) of dw, which the kernel's flat
  // epilogue stores (CUTLASS's register epilogue cannot split a (channels, taps) tile between its two
  // warpgroups' 96 columns each).
  static bool can_implement(ProblemShape const& problem_shape, Arguments const& args) {
    return Base::can_implement(problem_shape, args) && problem_shape.shape_C[3] == TapChannels &&
           problem_shape.shape_C[2] == TapsPerTile;
  }

  CUTLASS_DEVICE
  static void prefetch_tma_descriptors(Params const& params) {
    Base::prefetch_tma_descriptors(params);
    cute::prefetch_tma_descriptor(params.tma_load_b_tap.get_tma_descriptor());
  }

  // (gA_mk, gB_nk, gB_tap): the base's tiled views (gB_nk by the spanning tile: the kernel takes the tile
  // counts from it) and x tiled by one tap's channels, (TAP_C, BLK_K, (c, s, r) tiles, k).
  template <class ProblemShapeMNKL>
  CUTLASS_DEVICE auto load_init(ProblemShapeMNKL const& problem_shape_MNKL, Params const& params) {
    auto [M, N, K, L] = problem_shape_MNKL;
    auto base_inputs = Base::load_init(problem_shape_MNKL, params);
    Tensor mB_tap = params.tma_load_b_tap.get_tma_tensor(make_shape(N, K));
    Tensor gB_tap = local_tile(mB_tap, TapTileShape{}, make_coord(_, _, _), Step<X, _1, _1>{});
    return cute::make_tuple(get<0>(base_inputs), get<1>(base_inputs), gB_tap);
  }

  template <class TensorA, class TensorB, class TensorBTap, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(Params const& params, MainloopPipeline pipeline, PipelineState producer_state,
                           cute::tuple<TensorA, TensorB, TensorBTap> const& load_inputs,
                           BlockCoord const& blk_coord, KTileIterator k_tile_iter, int k_tile_count,
                           int /*thread_idx*/, uint32_t /*block_rank_in_cluster*/, TensorStorage& shared_tensors) {
    if (!cute::elect_one_sync()) {
      return;
    }
    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{});  // (BLK_M,BLK_K,PIPE)
    auto block_tma_a = params.tma_load_a.get_slice(0);
    auto block_tma_b = params.tma_load_b_tap.get_slice(0);
    auto [m_coord, n_coord, k_coord, l_coord] = blk_coord;
    Tensor tAgA = block_tma_a.partition_S(get<0>(load_inputs)(_, _, m_coord, _));   // (TMA,TMA_M,TMA_K,k)
    Tensor tAsA = block_tma_a.partition_D(sA);                                         // (TMA,TMA_M,TMA_K,PIPE)
    // n_coord is (channel tile, group of taps along s, r); tap j of the group is s = group * TapsPerTile + j.
    auto channel_tile = get<0>(n_coord);
    auto first_tap = get<1>(n_coord) * TapsPerTile;
    auto filter_row = get<2>(n_coord);
    auto const& gB_tap = get<2>(load_inputs);

    CUTLASS_PRAGMA_NO_UNROLL
    for (; k_tile_count > 0; --k_tile_count) {
      pipeline.producer_acquire(producer_state);
      auto* tma_barrier = pipeline.producer_get_barrier(producer_state);
      int stage = producer_state.index();
      copy(params.tma_load_a.with(*tma_barrier, 0), tAgA(_, _, _, *k_tile_iter), tAsA(_, _, _, stage));
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < TapsPerTile; ++j) {
        Tensor gB = gB_tap(_, _, make_coord(channel_tile, first_tap + j, filter_row), *k_tile_iter);
        Tensor sB = make_tensor(
            make_smem_ptr(shared_tensors.smem_B.data() + stage * StageElementsB + j * TapElements), SmemLayoutBTap{});
        copy(params.tma_load_b_tap.with(*tma_barrier, 0), block_tma_b.partition_S(gB), block_tma_b.partition_D(sB));
      }
      ++k_tile_iter;
      ++producer_state;
    }
  }
};

// ---- mainloop: CUTLASS's sm90 implicit-GEMM collective, assembled as its CollectiveBuilder would for a
// two-consumer-warpgroup tile (AtomLayout 2x1x1), with the stage count fitted to what the epilogue leaves.
// TapsPerTile > 1: a wgrad tile over that many filter taps (WgradTapSpanning).
template <Operator Op, class Element, class TileShape, class ClusterShape, int EpilogueSmemBytes,
          int TapsPerTile = 1>
struct Mainloop {
  static constexpr GMMA::Major MajorA = Op == Operator::kWgrad ? GMMA::Major::MN : GMMA::Major::K;
  static constexpr GMMA::Major MajorB = Op == Operator::kFprop ? GMMA::Major::K : GMMA::Major::MN;

  // Two consumer warpgroups: a 128-row tile is split by rows (64 each); a 64-row tile (wgrad of layers with
  // 64 output channels, where 128 rows would be half empty) by columns.
  static constexpr bool SplitColumns = size<0>(TileShape{}) == 64;
  using AtomLayout = cute::conditional_t<SplitColumns, Layout<Shape<_1, _2, _1>>, Layout<Shape<_2, _1, _1>>>;
  using AtomTile = Shape<Int<size<0>(TileShape{}) / (SplitColumns ? 1 : 2)>,
                         Int<size<1>(TileShape{}) / (SplitColumns ? 2 : 1)>, decltype(get<2>(TileShape{}))>;
  using TiledMma = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, AtomTile, MajorA, MajorB>(), AtomLayout{}));

  // fprop/dgrad: A (activation or output gradient) through TMA im2col, B (filter) tiled; wgrad the reverse.
  using TiledCopyTiled = decltype(cutlass::gemm::collective::detail::sm90_cluster_shape_to_tma_atom(
      shape<Op == Operator::kWgrad ? 1 : 0>(ClusterShape{})));
  using TiledCopyIm2col = decltype(cutlass::conv::collective::detail::sm90_cluster_shape_to_im2col_tma_atom(
      shape<Op == Operator::kWgrad ? 0 : 1>(ClusterShape{})));
  using GmemTiledCopyA = cute::conditional_t<Op == Operator::kWgrad, TiledCopyTiled, TiledCopyIm2col>;
  using GmemTiledCopyB = cute::conditional_t<Op == Operator::kWgrad, TiledCopyIm2col, TiledCopyTiled>;

  using SmemLayoutAtomA = decltype(cutlass::gemm::collective::detail::ss_smem_selector<
      MajorA, Element, decltype(get<0>(TileShape{})), decltype(get<2>(TileShape{}))>());
  // B's swizzle atom is chosen by one warpgroup's columns: an MN-major operand's wgmma spans whole atoms (64
  // columns for the 128-byte swizzle), and a tile split by columns gives each warpgroup TILE_N / 2 of them
  // (32 for a 64x64 tile, 96 for 64x192: the 64-byte swizzle's 32-column atoms).
  using SmemLayoutAtomB = decltype(cutlass::gemm::collective::detail::ss_smem_selector<
      MajorB, Element, decltype(size<1>(AtomTile{})), decltype(get<2>(TileShape{}))>());

  static constexpr int StageBytes =
      int(sizeof(Element)) * (size<0>(TileShape{}) + size<1>(TileShape{})) * size<2>(TileShape{}) +
      int(sizeof(typename cutlass::PipelineTmaAsync<1>::SharedStorage));
  // 1 KB for the kernel's own barriers and alignment padding.
  static constexpr int Stages =
      (cutlass::gemm::collective::detail::sm90_smem_capacity_bytes - EpilogueSmemBytes - 1024) / StageBytes;
  static_assert(Stages >= 2, "tile too large for shared memory");

  using SmemLayoutA = decltype(tile_to_shape(SmemLayoutAtomA{},
      make_shape(shape<0>(TileShape{}), shape<2>(TileShape{}), Int<Stages>{}), Step<_2, _1, _3>{}));
  using SmemLayoutB = decltype(tile_to_shape(SmemLayoutAtomB{},
      make_shape(shape<1>(TileShape{}), shape<2>(TileShape{}), Int<Stages>{}), Step<_2, _1, _3>{}));

  using DispatchPolicy = cutlass::conv::MainloopSm90TmaGmmaWarpSpecializedImplicitGemm<
      Op, Stages, 2, ClusterShape, KernelConvCooperative>;
  using CutlassCollective = cutlass::conv::collective::CollectiveConv<
      DispatchPolicy, TileShape, Element, Element, TiledMma,
      cutlass::conv::collective::detail::Sm90ImplicitGemmTileTraits<GmemTiledCopyA, SmemLayoutA>,
      cutlass::conv::collective::detail::Sm90ImplicitGemmTileTraits<GmemTiledCopyB, SmemLayoutB>>;
  static_assert(TapsPerTile == 1 || Op == Operator::kWgrad, "only wgrad tiles span filter taps");
  using Collective = cute::conditional_t<(TapsPerTile > 1),
      WgradTapSpanning<CutlassCollective, SmemLayoutAtomB, TapsPerTile>, CutlassCollective>;
};

// ---- the kernel ---------------------------------------------------------------------------------------------
template <class CollectiveMainloop_, class CollectiveEpilogue_, bool SplitK_, bool FlatEpilogue_ = false>
class ConvKernelCooperative {
 public:
  using CollectiveMainloop = CollectiveMainloop_;
  using CollectiveEpilogue = CollectiveEpilogue_;
  static constexpr bool SplitK = SplitK_;
  using DispatchPolicy = typename CollectiveMainloop::DispatchPolicy;
  static constexpr Operator ConvOp = DispatchPolicy::ConvOp;
  using ProblemShape = cutlass::conv::ConvProblemShape<ConvOp, DispatchPolicy::NumSpatialDimensions>;
  using TileShape = typename CollectiveMainloop::TileShape;
  using TiledMma = typename CollectiveMainloop::TiledMma;
  using ArchTag = typename CollectiveMainloop::ArchTag;
  using ClusterShape = typename DispatchPolicy::ClusterShape;
  using ElementAccumulator = typename CollectiveMainloop::ElementAccumulator;
  using MainloopParams = typename CollectiveMainloop::Params;
  using EpilogueArguments = typename CollectiveEpilogue::Arguments;
  using EpilogueParams = typename CollectiveEpilogue::Params;
  using TileScheduler = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90;
  using TileSchedulerParams = typename TileScheduler::Params;

  static constexpr uint32_t NumMMAThreads = size(TiledMma{});
  static_assert(NumMMAThreads == 256, "two consumer warpgroups");
  static constexpr uint32_t NumLoadWarpGroups = 1;
  static constexpr uint32_t NumMmaWarpGroups = NumMMAThreads / cutlass::NumThreadsPerWarpGroup;
  static constexpr uint32_t MaxThreadsPerBlock = NumMMAThreads + NumLoadWarpGroups * cutlass::NumThreadsPerWarpGroup;
  static constexpr uint32_t MinBlocksPerMultiprocessor = 1;

  // Registers: the producer warpgroup gives most of its registers to the consumers (setmaxnreg).
  static constexpr int RegsPerThread = size<0>(TileShape{}) * size<1>(TileShape{}) / NumMMAThreads *
                                       sizeof(ElementAccumulator) / sizeof(uint32_t);
  static constexpr bool HeavyRegisterPressure = RegsPerThread >= 208;
  static constexpr uint32_t LoadRegisterRequirement = !HeavyRegisterPressure ? 40 : 24;
  static constexpr uint32_t MmaRegisterRequirement = !HeavyRegisterPressure ? 232 : 240;

  using LoadWarpOrderBarrier = cutlass::OrderedSequenceBarrier<1, 2>;

  struct SharedStorage {
    struct PipelineStorage : cute::aligned_struct<16, _1> {
      alignas(16) typename CollectiveMainloop::PipelineStorage mainloop;
      alignas(16) typename CollectiveEpilogue::PipelineStorage epi_load;
      alignas(16) typename LoadWarpOrderBarrier::SharedStorage load_order;
    } pipelines;
    struct TensorStorage : cute::aligned_struct<128, _1> {
      typename CollectiveEpilogue::TensorStorage epilogue;
      typename CollectiveMainloop::TensorStorage mainloop;
    } tensors;
  };
  static constexpr int SharedStorageSize = sizeof(SharedStorage);
  static_assert(SharedStorageSize <= cutlass::gemm::collective::detail::sm90_smem_capacity_bytes);

  using AccumulatorTileShape = cute::conditional_t<cute::rank_v<decltype(get<1>(TileShape{}))> == 1,
      decltype(take<0, 2>(TileShape{})), Shape<decltype(get<0>(TileShape{})), decltype(size<1>(TileShape{}))>>;

  // The GEMM view: im2col-linearized (M, N, K, L); for split-K wgrad L is the number of splits.
  using LinearShape = decltype(CollectiveMainloop::get_problem_shape_MNKL(ProblemShape{}));
  using ProblemShapeMNKL = cute::conditional_t<SplitK,
      decltype(make_shape(get<0>(LinearShape{}), get<1>(LinearShape{}), get<2>(LinearShape{}), int(0))),
      LinearShape>;

  // A wgrad epilogue that sees its output flat (epilogue_shape, below).
  static constexpr bool FlatEpilogue = FlatEpilogue_;
  static_assert(!FlatEpilogue || (ConvOp == Operator::kWgrad && SplitK), "a flat output is wgrad's");
  using EpilogueTileShape = cute::conditional_t<FlatEpilogue,
      Shape<decltype(size<0>(TileShape{})), decltype(size<1>(TileShape{})), decltype(size<2>(TileShape{}))>,
      TileShape>;
  using EpilogueShapeMNKL = cute::conditional_t<FlatEpilogue, Shape<int, int, int, int>, ProblemShapeMNKL>;

  struct Arguments {
    ProblemShape problem_shape{};
    typename CollectiveMainloop::Arguments mainloop{};
    EpilogueArguments epilogue{};
    cutlass::KernelHardwareInfo hw_info{};
    int splits = 1;
  };

  struct Params {
    ProblemShapeMNKL problem_shape{};
    EpilogueShapeMNKL epilogue_problem_shape{};
    MainloopParams mainloop{};
    EpilogueParams epilogue{};
    TileSchedulerParams scheduler{};
    int k_tiles_per_split = 0;
  };

  static auto problem_shape_mnkl(Arguments const& args) {
    auto linear = CollectiveMainloop::get_problem_shape_MNKL(args.problem_shape);
    if constexpr (SplitK) {
      return make_shape(get<0>(linear), get<1>(linear), get<2>(linear), args.splits);
    } else {
      return linear;
    }
  }

  // Without split-K the epilogue sees the un-linearized (transformed) shape, as in CUTLASS's conv kernel, and
  // writes the NHWC output through a TMA im2col store (any output strides).  With split-K it writes packed fp32
  // partial sums [split][M][N] and sees the linearized shape with L = splits.  wgrad's output (dw, or its fp32
  // slices) is a packed row-major K x (C*S*R) matrix per slice: a FlatEpilogue sees that flat shape and flat
  // tile coordinates, so that it can store through TMA instead of element by element from registers.  (Only
  // where the tiles of the hierarchical (C,S,R) N mode are the same flat column ranges: the caller knows.)
  static auto epilogue_shape(Arguments const& args) {
    if constexpr (FlatEpilogue) {
      auto linear = problem_shape_mnkl(args);
      return make_shape(int(size(get<0>(linear))), int(size(get<1>(linear))), int(size(get<2>(linear))),
                        int(args.splits));
    } else if constexpr (SplitK) {
      return problem_shape_mnkl(args);
    } else {
      return cutlass::conv::detail::get_transformed_problem_shape_MNKL(args.problem_shape);
    }
  }

  static int k_tiles(Arguments const& args) {
    auto shape = problem_shape_mnkl(args);
    // Matches the k-tile mode of the mainloop's tiled views (ceil per K sub-mode).
    return int(size(ceil_div(get<2>(shape), get<2>(TileShape{}))));
  }

  static bool can_implement(Arguments const& args) {
    bool ok = CollectiveMainloop::can_implement(args.problem_shape, args.mainloop);
    ok &= CollectiveEpilogue::can_implement(epilogue_shape(args), args.epilogue);
    if constexpr (SplitK) {
      int tiles = k_tiles(args);
      int per_split = (tiles + args.splits - 1) / args.splits;
      // Every split must own at least one k-tile: its slice of the output is written by the epilogue.
      ok &= args.splits >= 1 && (args.splits - 1) * per_split < tiles;
    } else {
      ok &= args.splits == 1;
    }
    return ok;
  }

  static Params to_underlying_arguments(Arguments const& args) {
    auto shape = problem_shape_mnkl(args);
    TileSchedulerParams scheduler = TileScheduler::to_underlying_arguments(
        shape, TileShape{}, ClusterShape{}, args.hw_info, typename TileScheduler::Arguments{}, nullptr, 1);
    int tiles = k_tiles(args);
    EpilogueShapeMNKL epilogue_problem_shape{};
    if constexpr (FlatEpilogue) {
      epilogue_problem_shape = epilogue_shape(args);
    } else {
      epilogue_problem_shape = shape;
    }
    return {shape,
            epilogue_problem_shape,
            CollectiveMainloop::to_underlying_arguments(args.problem_shape, args.mainloop, nullptr),
            CollectiveEpilogue::to_underlying_arguments(epilogue_shape(args), args.epilogue, nullptr),
            scheduler,
            (tiles + args.splits - 1) / args.splits};
  }

  static dim3 get_grid_shape(Params const& params, cutlass::KernelHardwareInfo const& hw_info) {
    typename TileScheduler::Arguments args{};
    return TileScheduler::get_grid_shape(params.scheduler, params.problem_shape, TileShape{}, ClusterShape{},
                                         hw_info, args);
  }

  static dim3 get_block_shape() { return dim3(MaxThreadsPerBlock, 1, 1); }

  CUTLASS_DEVICE
  void operator()(Params const& params, char* smem_buf) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    enum class WarpGroupRole { Producer = 0, Consumer0 = 1, Consumer1 = 2 };
    enum class ProducerWarpRole { Mainloop = 0, Warp1 = 1, Epilogue = 2, Warp3 = 3 };

    SharedStorage& shared_storage = *reinterpret_cast<SharedStorage*>(smem_buf);
    int thread_idx = int(threadIdx.x);
    int lane_idx = cutlass::canonical_lane_idx();
    int warp_idx = cutlass::canonical_warp_idx_sync();
    int warp_idx_in_warp_group = warp_idx % cutlass::NumWarpsPerWarpGroup;
    int warp_group_thread_idx = thread_idx % cutlass::NumThreadsPerWarpGroup;
    int mma_thread_idx = thread_idx % NumMMAThreads;
    auto warp_group_role = WarpGroupRole(cutlass::canonical_warp_group_idx());
    auto producer_warp_role = ProducerWarpRole(warp_idx_in_warp_group);
    int lane_predicate = cute::elect_one_sync();
    uint32_t block_rank_in_cluster = cute::block_rank_in_cluster();

    if (warp_idx == 0 && lane_predicate) {
      CollectiveMainloop::prefetch_tma_descriptors(params.mainloop);
      CollectiveEpilogue::prefetch_tma_descriptors(params.epilogue);
    }

    CollectiveEpilogue collective_epilogue(params.epilogue, shared_storage.tensors.epilogue);
    bool is_epi_load_needed = collective_epilogue.is_producer_load_needed();

    using MainloopPipeline = typename CollectiveMainloop::MainloopPipeline;
    typename MainloopPipeline::Params mainloop_pipeline_params;
    if (warp_group_role == WarpGroupRole::Producer && producer_warp_role == ProducerWarpRole::Mainloop) {
      mainloop_pipeline_params.role = MainloopPipeline::ThreadCategory::Producer;
    }
    if (warp_group_role == WarpGroupRole::Consumer0 || warp_group_role == WarpGroupRole::Consumer1) {
      mainloop_pipeline_params.role = MainloopPipeline::ThreadCategory::Consumer;
    }
    mainloop_pipeline_params.is_leader = warp_group_thread_idx == 0;
    mainloop_pipeline_params.num_consumers = NumMMAThreads;
    mainloop_pipeline_params.transaction_bytes = params.mainloop.tma_transaction_bytes;
    MainloopPipeline mainloop_pipeline(shared_storage.pipelines.mainloop, mainloop_pipeline_params, ClusterShape{});

    using EpiLoadPipeline = typename CollectiveEpilogue::LoadPipeline;
    typename EpiLoadPipeline::Params epi_load_pipeline_params;
    if (warp_group_role == WarpGroupRole::Producer && producer_warp_role == ProducerWarpRole::Epilogue) {
      epi_load_pipeline_params.role = EpiLoadPipeline::ThreadCategory::Producer;
    }
    if (warp_group_role == WarpGroupRole::Consumer0 || warp_group_role == WarpGroupRole::Consumer1) {
      epi_load_pipeline_params.role = EpiLoadPipeline::ThreadCategory::Consumer;
    }
    epi_load_pipeline_params.dst_blockid = cute::block_rank_in_cluster();
    epi_load_pipeline_params.producer_arv_count = cutlass::NumThreadsPerWarp;
    epi_load_pipeline_params.consumer_arv_count = NumMMAThreads;
    if constexpr (CollectiveEpilogue::RequiresTransactionBytes) {
      epi_load_pipeline_params.transaction_bytes = params.epilogue.tma_transaction_bytes;
    }
    EpiLoadPipeline epi_load_pipeline(shared_storage.pipelines.epi_load, epi_load_pipeline_params);

    using EpiStorePipeline = typename CollectiveEpilogue::StorePipeline;
    typename EpiStorePipeline::Params epi_store_pipeline_params;
    epi_store_pipeline_params.always_wait = true;
    EpiStorePipeline epi_store_pipeline(epi_store_pipeline_params);

    typename LoadWarpOrderBarrier::Params params_load_order_barrier;
    params_load_order_barrier.group_id = producer_warp_role == ProducerWarpRole::Mainloop ? 0 : 1;
    params_load_order_barrier.group_size = cutlass::NumThreadsPerWarp;
    LoadWarpOrderBarrier load_order_barrier(shared_storage.pipelines.load_order, params_load_order_barrier);

    typename CollectiveMainloop::PipelineState mainloop_pipe_consumer_state;
    typename CollectiveEpilogue::LoadPipelineState epi_load_pipe_consumer_state;
    cutlass::PipelineState mainloop_pipe_producer_state = cutlass::make_producer_start_state<MainloopPipeline>();
    cutlass::PipelineState epi_load_pipe_producer_state = cutlass::make_producer_start_state<EpiLoadPipeline>();
    cutlass::PipelineState epi_store_pipe_producer_state = cutlass::make_producer_start_state<EpiStorePipeline>();

    auto cluster_wait_fn = [] () {
      // Pipeline initialisation must be visible to every block of the cluster before anyone uses it.
      if constexpr (size(ClusterShape{}) > 1) {
        cute::cluster_arrive_relaxed();
        return [] () { cute::cluster_wait(); };
      } else {
        __syncthreads();
        return [] () {};
      }
    } ();

    auto problem_shape_MNKL = params.problem_shape;
    TiledMma tiled_mma;
    auto blk_shape = TileShape{};
    TileScheduler scheduler{params.scheduler};

    CollectiveMainloop collective_mainloop;
    // (BLK_M,BLK_K,m,k) and (BLK_N,BLK_K,n,k): conv views have no L mode.
    auto load_inputs = collective_mainloop.load_init(problem_shape_MNKL, params.mainloop);
    Tensor gA_mk = get<0>(load_inputs);
    Tensor gB_nk = get<1>(load_inputs);
    int const k_tiles_total = int(size<3>(gA_mk));

    // Which k-tiles a work tile reduces: all of them, or its split's share.
    auto k_range = [&](auto const& work) {
      if constexpr (SplitK) {
        int start = work.L_idx * params.k_tiles_per_split;
        return cute::make_tuple(start, cute::min(params.k_tiles_per_split, k_tiles_total - start));
      } else {
        return cute::make_tuple(0, k_tiles_total);
      }
    };
    auto block_coord = [&](auto const& work) {
      auto m_coord = idx2crd(work.M_idx, shape<2>(gA_mk));
      auto n_coord = idx2crd(work.N_idx, shape<2>(gB_nk));
      if constexpr (SplitK) {
        return make_coord(m_coord, n_coord, _, work.L_idx);
      } else {
        return make_coord(m_coord, n_coord, _, Int<0>{});
      }
    };

    // Where the epilogue writes a work tile: the mainloop's coordinates, or flat ones (FlatEpilogue).
    auto epilogue_problem_shape = params.epilogue_problem_shape;
    auto epilogue_tile_shape = EpilogueTileShape{};
    auto epilogue_coord = [&](auto const& work) {
      if constexpr (FlatEpilogue) {
        return make_coord(int(work.M_idx), int(work.N_idx), _, int(work.L_idx));
      } else {
        return block_coord(work);
      }
    };

    cluster_wait_fn();

    if (warp_group_role == WarpGroupRole::Producer) {
      auto work_tile_info = scheduler.initial_work_tile_info(ClusterShape{});
      cutlass::arch::warpgroup_reg_dealloc<LoadRegisterRequirement>();

      if (producer_warp_role == ProducerWarpRole::Mainloop) {
        bool do_load_order_arrive = true;
        while (work_tile_info.is_valid()) {
          auto blk_coord = block_coord(work_tile_info);
          auto [k_start, k_count] = k_range(work_tile_info);
          auto k_tile_iter = cute::make_coord_iterator(idx2crd(k_start, shape<3>(gA_mk)), shape<3>(gA_mk));
          collective_mainloop.load(params.mainloop, mainloop_pipeline, mainloop_pipe_producer_state, load_inputs,
                                   blk_coord, k_tile_iter, k_count, lane_idx, block_rank_in_cluster,
                                   shared_storage.tensors.mainloop);
          mainloop_pipe_producer_state.advance(k_count);
          if (do_load_order_arrive) {
            load_order_barrier.arrive();
            do_load_order_arrive = false;
          }
          work_tile_info = get<0>(scheduler.fetch_next_work(work_tile_info));
        }
        collective_mainloop.load_tail(mainloop_pipeline, mainloop_pipe_producer_state);
      } else if (producer_warp_role == ProducerWarpRole::Epilogue && is_epi_load_needed) {
        if (work_tile_info.is_valid()) {
          load_order_barrier.wait();
        }
        while (work_tile_info.is_valid()) {
          epi_load_pipe_producer_state = collective_epilogue.load(
              epi_load_pipeline, epi_load_pipe_producer_state, epilogue_problem_shape, epilogue_tile_shape,
              epilogue_coord(work_tile_info), tiled_mma, lane_idx, shared_storage.tensors.epilogue);
          work_tile_info = get<0>(scheduler.fetch_next_work(work_tile_info));
        }
        collective_epilogue.load_tail(epi_load_pipeline, epi_load_pipe_producer_state);
      }
    } else if (warp_group_role == WarpGroupRole::Consumer0 || warp_group_role == WarpGroupRole::Consumer1) {
      auto work_tile_info = scheduler.initial_work_tile_info(ClusterShape{});
      cutlass::arch::warpgroup_reg_alloc<MmaRegisterRequirement>();
      bool do_store_tail = false;
      while (work_tile_info.is_valid()) {
        auto blk_coord = block_coord(work_tile_info);
        auto k_count = get<1>(k_range(work_tile_info));
        // (MMA,MMA_M,MMA_N), over the tile's flat N (a tap-spanning wgrad tile's N mode is (channels, taps)).
        auto accumulators = partition_fragment_C(tiled_mma, AccumulatorTileShape{});
        collective_mainloop.mma(mainloop_pipeline, mainloop_pipe_consumer_state, accumulators, k_count,
                                mma_thread_idx, shared_storage.tensors.mainloop, params.mainloop);
        collective_mainloop.mma_tail(mainloop_pipeline, mainloop_pipe_consumer_state, k_count);
        mainloop_pipe_consumer_state.advance(k_count);

        auto [epi_load_next, epi_store_next] = collective_epilogue.store(
            epi_load_pipeline, epi_load_pipe_consumer_state, epi_store_pipeline, epi_store_pipe_producer_state,
            epilogue_problem_shape, epilogue_tile_shape, epilogue_coord(work_tile_info), accumulators, tiled_mma,
            mma_thread_idx,
            shared_storage.tensors.epilogue);
        epi_load_pipe_consumer_state = epi_load_next;
        epi_store_pipe_producer_state = epi_store_next;
        do_store_tail = true;
        work_tile_info = get<0>(scheduler.fetch_next_work(work_tile_info));
      }
      if (do_store_tail) {
        collective_epilogue.store_tail(epi_load_pipeline, epi_load_pipe_consumer_state, epi_store_pipeline,
                                       epi_store_pipe_producer_state);
      }
    }
#else
    printf("jitops conv2d: this kernel needs sm_90a\n");
#endif
  }
};

// ---- host side: arguments -> params -> launch on the caller's stream --------------------------------------
// Status codes returned to Python (jitops/ops/conv2d.py names them).
enum Status : int { kOk = 0, kCannotImplement = 1, kLaunchFailed = 2, kSetAttributeFailed = 3 };

template <class Kernel>
int launch(typename Kernel::Arguments const& args, cudaStream_t stream) {
  if (!Kernel::can_implement(args)) {
    return kCannotImplement;
  }
  // The shared-memory limit is raised once per device (the attribute belongs to the function in the current
  // device's context).  The launch below is cudaLaunchKernelExC itself: CUTLASS's ClusterLauncher::launch also
  // calls cudaFuncSetAttribute(NonPortableClusterSizeAllowed) on every launch, 6 us of host time each on the
  // H100 host (501 of them in 3 patched ResNet-50 steps, torch.profiler), and these clusters (at most 2 CTAs)
  // are portable sizes that need no such attribute.
  static bool smem_attribute_set[64] = {};
  int device = args.hw_info.device_id;
  if (device < 0 || device >= 64 || !smem_attribute_set[device]) {
    if (cudaFuncSetAttribute(cutlass::device_kernel<Kernel>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             Kernel::SharedStorageSize) != cudaSuccess) {
      cudaGetLastError();
      return kSetAttributeFailed;
    }
    if (device >= 0 && device < 64) {
      smem_attribute_set[device] = true;
    }
  }
  typename Kernel::Params params = Kernel::to_underlying_arguments(args);
  using ClusterShape = typename Kernel::ClusterShape;
  static_assert(size(ClusterShape{}) <= 8, "a portable cluster size (at most 8 CTAs)");
  cudaLaunchAttribute cluster;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = size<0>(ClusterShape{});
  cluster.val.clusterDim.y = size<1>(ClusterShape{});
  cluster.val.clusterDim.z = size<2>(ClusterShape{});
  cudaLaunchConfig_t config = {};
  config.gridDim = Kernel::get_grid_shape(params, args.hw_info);
  config.blockDim = Kernel::get_block_shape();
  config.dynamicSmemBytes = Kernel::SharedStorageSize;
  config.stream = stream;
  config.attrs = &cluster;
  config.numAttrs = 1;
  void* kernel_params[] = {&params};
  if (cudaLaunchKernelExC(&config, reinterpret_cast<void const*>(cutlass::device_kernel<Kernel>),
                          kernel_params) != cudaSuccess) {
    cudaGetLastError();
    return kLaunchFailed;
  }
  return kOk;
}

}  // namespace jitops::conv
