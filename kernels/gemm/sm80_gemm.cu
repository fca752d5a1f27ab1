// jitops.gemm on sm_80, sm_86 and sm_89 (and on sm_90 for shapes TMA cannot take: rows or addresses not
// 16-byte aligned): D (M,N, row-major) = act(A (M,K) . B (K,N) + bias (N)), fp32 accumulation.
//
// A CUTLASS 2 tensor-op GEMM (mma.sync, cp.async multistage mainloop; a two-stage register-staged mainloop for
// 2-byte alignment, which cp.async cannot copy), compiled by NVRTC in a few seconds.  CUTLASS 2's host-side
// set-up (GemmKernel::Params) is CUTLASS_HOST_DEVICE, so this __global__ wrapper builds it on the device from
// plain arguments: no host code, and the cubin launches like any other NVRTC kernel.  The cost is a few dozen
// integer instructions per thread before the first load.
//
// The bias rides on the epilogue's source operand C with a zero row stride (C(m, n) = bias[n]), and the
// activation is a run-time argument of BiasActivationOp: one cubin serves every epilogue.
#include "cutlass/cutlass.h"
#include "cutlass/gemm/kernel/default_gemm.h"
#include "cutlass/gemm/threadblock/threadblock_swizzle.h"

#include "epilogue.cuh"

namespace jitops_gemm {

// CUTLASS 2 epilogue output operator: D = act(acc + C), C being the broadcast bias when there is one.
template <typename ElementOutput_, int Count>
class BiasActivationOp {
 public:
  using ElementOutput = ElementOutput_;
  using ElementSource = ElementOutput_;
  using ElementAccumulator = float;
  using ElementCompute = float;
  static int const kCount = Count;
  static cutlass::FloatRoundStyle const kRound = cutlass::FloatRoundStyle::round_to_nearest;
  using FragmentOutput = cutlass::Array<ElementOutput, kCount>;
  using FragmentSource = cutlass::Array<ElementOutput, kCount>;
  using FragmentAccumulator = cutlass::Array<float, kCount>;
  using FragmentCompute = cutlass::Array<float, kCount>;

  struct Params {
    int activation;
    int has_bias;
    CUTLASS_HOST_DEVICE Params() : activation(kNone), has_bias(0) {}
    CUTLASS_HOST_DEVICE Params(int activation_, int has_bias_) : activation(activation_), has_bias(has_bias_) {}
  };

  CUTLASS_HOST_DEVICE explicit BiasActivationOp(Params const& params) : params_(params) {}
  CUTLASS_HOST_DEVICE bool is_source_needed() const { return params_.has_bias != 0; }
  CUTLASS_HOST_DEVICE void set_k_partition(int, int) {}

  CUTLASS_HOST_DEVICE FragmentOutput operator()(FragmentAccumulator const& acc, FragmentSource const& source) const {
    cutlass::NumericArrayConverter<float, ElementOutput, kCount, kRound> to_float;
    return apply(acc, to_float(source));
  }

  CUTLASS_HOST_DEVICE FragmentOutput operator()(FragmentAccumulator const& acc) const {
    FragmentCompute zero;
    zero.fill(0.0f);
    return apply(acc, zero);
  }

 private:
  CUTLASS_HOST_DEVICE FragmentOutput apply(FragmentAccumulator const& acc, FragmentCompute const& bias) const {
    FragmentCompute out = BiasActivation<FragmentCompute>{}(acc, bias, ActivationArguments{params_.activation});
    cutlass::NumericArrayConverter<ElementOutput, float, kCount, kRound> to_output;
    return to_output(out);
  }

  Params params_;
};

template <typename T, typename TOut, bool AKMajor, bool BKMajor, int TM, int TN, int TK, int WM, int WN, int WK,
          int Stages, int Align>
struct Sm80Gemm {
  using LayoutA = typename cutlass::platform::conditional<AKMajor, cutlass::layout::RowMajor,
                                                          cutlass::layout::ColumnMajor>::type;
  using LayoutB = typename cutlass::platform::conditional<BKMajor, cutlass::layout::ColumnMajor,
                                                          cutlass::layout::RowMajor>::type;
  // The output vector width: Align elements of the output type, at most 16 bytes.
  static int const kAlignOut = Align * int(sizeof(T)) / int(sizeof(TOut)) > 0
                                   ? Align * int(sizeof(T)) / int(sizeof(TOut)) : 1;
  using OutputOp = BiasActivationOp<TOut, kAlignOut>;
  using Swizzle = cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<8>;
  using Kernel = typename cutlass::gemm::kernel::DefaultGemm<
      T, LayoutA, Align, T, LayoutB, Align, TOut, cutlass::layout::RowMajor, float,
      cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80, cutlass::gemm::GemmShape<TM, TN, TK>,
      cutlass::gemm::GemmShape<WM, WN, WK>, cutlass::gemm::GemmShape<16, 8, 16>, OutputOp, Swizzle, Stages,
      false, cutlass::arch::OpMultiplyAdd>::GemmKernel;
  static int const kThreads = Kernel::kThreadCount;
};

// One CTA per output tile (grid from Python: GemmIdentityThreadblockSwizzle<8>::get_grid_shape).  `smem_bytes`
// is the dynamic shared memory Python allocates; the static_assert keeps its formula honest.
template <typename T, typename TOut, bool AKMajor, bool BKMajor, int TM, int TN, int TK, int WM, int WN, int WK,
          int Stages, int Align, int SmemBytes>
__global__ void __launch_bounds__(Sm80Gemm<T, TOut, AKMajor, BKMajor, TM, TN, TK, WM, WN, WK, Stages, Align>::kThreads)
gemm_sm80(const T* a, const T* b, TOut* d, const TOut* bias, int m, int n, int k, long long lda, long long ldb,
          long long ldd, int activation) {
  using Config = Sm80Gemm<T, TOut, AKMajor, BKMajor, TM, TN, TK, WM, WN, WK, Stages, Align>;
  using Kernel = typename Config::Kernel;
  static_assert(sizeof(typename Kernel::SharedStorage) <= SmemBytes, "dynamic shared memory formula too small");
  extern __shared__ __align__(16) char smem[];

  cutlass::gemm::GemmCoord problem(m, n, k);
  cutlass::gemm::GemmCoord tiled = typename Config::Swizzle().get_tiled_shape(
      problem, cutlass::gemm::GemmCoord(TM, TN, TK), 1);
  typename Kernel::Params params(
      problem, tiled,
      {const_cast<T*>(a), typename Config::LayoutA(lda)},
      {const_cast<T*>(b), typename Config::LayoutB(ldb)},
      {const_cast<TOut*>(bias), cutlass::layout::RowMajor(0)},  // row stride 0: every row reads bias[0..N)
      {d, cutlass::layout::RowMajor(ldd)},
      typename Config::OutputOp::Params(activation, bias != nullptr));
  Kernel op;
  op(params, *reinterpret_cast<typename Kernel::SharedStorage*>(smem));
}

}  // namespace jitops_gemm
