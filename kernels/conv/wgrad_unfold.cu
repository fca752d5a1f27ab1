// jitops.conv2d_weight_grad of a folded few-channel layer, last step.
#include "jitops/common.cuh"

namespace jitops {

// The stem's weight gradient (a few-channel strided wgrad over a folded im2col matrix, conv2d_plan._plan_fold):
// its slices are laid out [splits][K8][taps][width], tap j's `width` channels being filter rows j*fold ..
// j*fold + fold - 1, each S*C long, in (row, s, c) order.  This sums the slices in order and writes dw's KRSC
// memory directly, rows past R dropped, so the run is launches only and the C++ host path replays it; torch's
// copy of a fold-shaped gradient into dw kept ResNet-50's stem wgrad on the Python path.
template <typename T>
__global__ void conv2d_wgrad_unfold(const float* __restrict__ partial, T* __restrict__ dw, int splits, i64 slice,
                                    int k_count, int filter_rows, int row_elements, int fold, int taps, int width) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;  // K * R * S*C < 2^31 (checked by the caller)
  if (i >= k_count * filter_rows * row_elements) return;
  const int kr = i / row_elements;  // kr = k * R + r
  const int e = i - kr * row_elements;
  const int k = kr / filter_rows;
  const int r = kr - k * filter_rows;
  const int tap = r / fold;
  const float* source = partial + static_cast<i64>(k * taps + tap) * width + (r - tap * fold) * row_elements + e;
  float sum = 0.0f;
#pragma unroll 8
  for (int split = 0; split < splits; ++split) sum += source[split * slice];
  dw[i] = store_as<T>(sum);
}

}  // namespace jitops
