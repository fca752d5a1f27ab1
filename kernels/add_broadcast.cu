// jitops.add's general case: out = a + alpha * b with broadcasting, any strides and mixed input dtypes.  (Same
// shapes, one dtype, contiguous inputs and alpha == 1 take add.cu's vectorized kernel instead.)
//
// The output is contiguous.  The Python side (jitops/ops/add.py, _plan) drops the output's size-1 dimensions,
// merges neighbours that are contiguous with each other in both inputs, and passes the NDIM (<= 6) that remain
// outermost first as (size, a stride, b stride) triples; a broadcast dimension has stride 0, so nothing is
// expanded in memory.  Unused triples are 0.
//
// TA and TB are TO or narrower (fp16/bf16 into fp32, anything into fp64): each input is read in its own type and
// widened exactly, as torch converts inputs to the result dtype first.  A wider operand (a 0-d fp64 tensor added
// to an fp16 tensor: torch.result_type is fp16) is converted on the host, since it is one element.  Arithmetic in
// acc_t<TO>, one rounding at the store.
//
// One thread per output element, grid-stride; its input offsets come from the output index by NDIM - 1 divisions
// in the index type I (unsigned 32-bit whenever every index and offset fits: add.py, _index_type).
#include "jitops/common.cuh"

namespace jitops {
namespace add_detail {

template <typename A> __device__ __forceinline__ A widen(float v) { return static_cast<A>(v); }
template <typename A> __device__ __forceinline__ A widen(double v) { return static_cast<A>(v); }
template <typename A> __device__ __forceinline__ A widen(__half v) { return static_cast<A>(__half2float(v)); }
template <typename A> __device__ __forceinline__ A widen(__nv_bfloat16 v) {
  return static_cast<A>(__bfloat162float(v));
}

}  // namespace add_detail

template <typename TA, typename TB, typename TO, int NDIM, typename I>
__global__ void add_broadcast(const TA* __restrict__ a, const TB* __restrict__ b, TO* __restrict__ out, i64 n_,
                              double alpha_, i64 size0, i64 size1, i64 size2, i64 size3, i64 size4, i64 size5,
                              i64 a0, i64 a1, i64 a2, i64 a3, i64 a4, i64 a5, i64 b0, i64 b1, i64 b2, i64 b3,
                              i64 b4, i64 b5) {
  static_assert(NDIM >= 1 && NDIM <= 6, "add.py merges dimensions down to at most 6");
  using A = acc_t<TO>;
  const I size[6] = {(I)size0, (I)size1, (I)size2, (I)size3, (I)size4, (I)size5};
  const I stride_a[6] = {(I)a0, (I)a1, (I)a2, (I)a3, (I)a4, (I)a5};
  const I stride_b[6] = {(I)b0, (I)b1, (I)b2, (I)b3, (I)b4, (I)b5};
  const A alpha = static_cast<A>(alpha_);
  const I n = static_cast<I>(n_);
  const I step = static_cast<I>(gridDim.x) * blockDim.x;
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    I rest = i, offset_a = 0, offset_b = 0;
#pragma unroll
    for (int d = NDIM - 1; d > 0; --d) {
      const I q = rest / size[d];
      const I r = rest - q * size[d];
      offset_a += r * stride_a[d];
      offset_b += r * stride_b[d];
      rest = q;
    }
    offset_a += rest * stride_a[0];
    offset_b += rest * stride_b[0];
    out[i] = store_as<TO>(add_detail::widen<A>(a[offset_a]) + alpha * add_detail::widen<A>(b[offset_b]));
  }
}

}  // namespace jitops
