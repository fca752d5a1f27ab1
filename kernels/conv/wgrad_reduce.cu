// jitops.conv2d_weight_grad, last step: the wgrad kernel leaves fp32 partial sums, one slice per split of
// GEMM-K (N*P*Q), laid out [splits][K8][R*S][C8] (channels padded to multiples of 8).  This sums the slices in
// a fixed order (deterministic: no atomics) and writes dw's KRSC memory in its own dtype, k < K and c < C only,
// in one pass, where torch's sum over the slices and the copy into dw were two kernels and an fp32 round trip.
//
// One thread per element of dw and one grid-stride-free grid: the loads in flight are what this kernel's speed
// is made of.  Earlier versions, timed inside ResNet-50's wgrad on the H100, lost to torch on
// large unsplit dw (L20, 512x512x3x3: 44-46 us against 35.7 for the layer) with grids capped at 8-16 blocks per
// SM, and one of them also split the flat index with two 64-bit divisions per element.
#include "jitops/common.cuh"

namespace jitops {

template <typename T>
__global__ void conv2d_wgrad_reduce(const float* __restrict__ partial, T* __restrict__ dw, int splits, i64 slice,
                                    int rows, int channels, int channels_padded) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;  // rows * channels < 2^31 (checked by the caller)
  if (i >= rows * channels) return;
  const int row = i / channels;  // row = k * R*S + tap
  const int c = i - row * channels;
  const float* source = partial + static_cast<i64>(row) * channels_padded + c;
  float sum = 0.0f;
#pragma unroll 8
  for (int split = 0; split < splits; ++split) sum += source[split * slice];
  dw[i] = store_as<T>(sum);
}

}  // namespace jitops
