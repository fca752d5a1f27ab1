// jitops.conv2d, the stem's fprop over a folded im2col matrix (jitops/ops/conv2d_plan.py, _plan_fold): the
// filter w [K, C, R, S] (any strides) as the KRSC filter of that conv, [K8][taps][1][columns], where tap j holds
// filter rows j*fold .. j*fold + fold - 1 in (row, s, c) order, as the matrix's columns are, and everything past
// R rows, K filters or fold*S*C columns is zero.  One kernel in place of the zero-fill, slices, permuted reshapes
// and copies that built it with torch: 22 aten calls, about 90 us of host time a call on the H100's host.
#include "jitops/common.cuh"

namespace jitops {

template <typename T>
__global__ void conv2d_fold_weight(const T* __restrict__ w, T* __restrict__ out, int elements, int k, int c,
                                   int r, int s, int fold, int taps, int columns, i64 sk, i64 sc, i64 sr,
                                   i64 ss) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;  // k8 * taps * columns: a filter, far below 2^31
  if (e >= elements) return;
  const int col = e % columns;
  const int rest = e / columns;
  const int tap = rest % taps;
  const int kk = rest / taps;
  const int per_row = s * c;
  const int row_in_tap = col / per_row;
  const int row = tap * fold + row_in_tap;
  float value = 0.0f;
  if (kk < k && row_in_tap < fold && row < r) {
    const int within = col - row_in_tap * per_row;
    const int si = within / c;
    const int ci = within - si * c;
    value = load_as<float>(w[kk * sk + ci * sc + row * sr + si * ss]);
  }
  out[e] = store_as<T>(value);
}

}  // namespace jitops
