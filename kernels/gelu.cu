// jitops.gelu forward and backward, elementwise over contiguous buffers.
//   APPROX 0: gelu(x) = x/2 (1 + erf(x / sqrt 2))
//   APPROX 1: gelu(x) = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
// VEC elements per access (16 bytes when aligned), index type I (int when every offset fits: cheaper
// address math), arithmetic in float (double for double).
#include "jitops/common.cuh"

namespace jitops {

__device__ __forceinline__ float erf_of(float v) { return erff(v); }
__device__ __forceinline__ double erf_of(double v) { return erf(v); }
__device__ __forceinline__ float tanh_of(float v) { return tanhf(v); }
__device__ __forceinline__ double tanh_of(double v) { return tanh(v); }
__device__ __forceinline__ float exp_of(float v) { return __expf(v); }
__device__ __forceinline__ double exp_of(double v) { return exp(v); }

template <int APPROX, typename A> __device__ __forceinline__ A gelu_value(A x) {
  if (APPROX == 0) return A(0.5) * x * (A(1) + erf_of(x * A(0.70710678118654752440)));
  const A inner = A(0.79788456080286535588) * (x + A(0.044715) * x * x * x);
  return A(0.5) * x * (A(1) + tanh_of(inner));
}

template <int APPROX, typename A> __device__ __forceinline__ A gelu_derivative(A x) {
  if (APPROX == 0) {
    const A cdf = A(0.5) * (A(1) + erf_of(x * A(0.70710678118654752440)));
    const A pdf = exp_of(A(-0.5) * x * x) * A(0.39894228040143267794);
    return cdf + x * pdf;
  }
  const A k0 = A(0.79788456080286535588), k1 = A(0.044715);
  const A t = tanh_of(k0 * (x + k1 * x * x * x));
  return A(0.5) * (A(1) + t) + A(0.5) * x * (A(1) - t * t) * k0 * (A(1) + A(3) * k1 * x * x);
}

template <typename T, int VEC, int APPROX, typename I>
__global__ void gelu_forward(const T* __restrict__ x, T* __restrict__ y, i64 count) {
  using A = acc_t<T>;
  const I n = static_cast<I>(count);
  const I n_vec = n / VEC;
  const I stride = (I)gridDim.x * blockDim.x;
  for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n_vec; i += stride) {
    Vec<T, VEC> vx = load_vec<T, VEC>(x, i), vy;
#pragma unroll
    for (int k = 0; k < VEC; ++k) vy.v[k] = store_as<T>(gelu_value<APPROX>(load_as<A>(vx.v[k])));
    store_vec<T, VEC>(y, i, vy);
  }
  for (I i = n_vec * VEC + (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    y[i] = store_as<T>(gelu_value<APPROX>(load_as<A>(x[i])));
  }
}

template <typename T, int VEC, int APPROX, typename I>
__global__ void gelu_backward(const T* __restrict__ dy, const T* __restrict__ x, T* __restrict__ dx, i64 count) {
  using A = acc_t<T>;
  const I n = static_cast<I>(count);
  const I n_vec = n / VEC;
  const I stride = (I)gridDim.x * blockDim.x;
  for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n_vec; i += stride) {
    Vec<T, VEC> vg = load_vec<T, VEC>(dy, i), vx = load_vec<T, VEC>(x, i), vo;
#pragma unroll
    for (int k = 0; k < VEC; ++k)
      vo.v[k] = store_as<T>(load_as<A>(vg.v[k]) * gelu_derivative<APPROX>(load_as<A>(vx.v[k])));
    store_vec<T, VEC>(dx, i, vo);
  }
  for (I i = n_vec * VEC + (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    dx[i] = store_as<T>(load_as<A>(dy[i]) * gelu_derivative<APPROX>(load_as<A>(x[i])));
  }
}

}  // namespace jitops
