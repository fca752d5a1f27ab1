// jitops.gelu forward and backward, elementwise over contiguous buffers.
//   APPROX 0: gelu(x) = x/2 (1 + erf(x / sqrt 2))
//   APPROX 1: gelu(x) = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
// VEC elements per access (16 bytes when aligned), index type I (int when every offset fits: cheaper
// address math), arithmetic in float (double for double).
//
// Memory-bound: what decides the speed is how many bytes each SM has in flight.  Each thread issues UNROLL
// independent 16-byte loads per input before it computes anything (UNROLL = 4: 64 bytes a thread, 16 KB
// for a 256-thread block), and a block walks the buffer in tiles of BLOCK * UNROLL vectors, coalesced: the
// u-th load of every thread of a block covers one contiguous 4 KB span.
// FAST 1 (16-bit types, tanh form only): tanh through the SFU's tanh.approx.f32 (max relative error 2^-10.99),
// under the half-ulp of fp16 and bf16 outputs.  It measured no faster on the H100 (the kernels run at copy
// bandwidth either way), so jitops/ops/gelu.py leaves it off; fp32 and fp64 always use the accurate functions.
#include "jitops/common.cuh"

namespace jitops {

__device__ __forceinline__ float erf_of(float v) { return erff(v); }
__device__ __forceinline__ double erf_of(double v) { return erf(v); }
__device__ __forceinline__ double exp_of(double v) { return exp(v); }
__device__ __forceinline__ float exp_of(float v) { return __expf(v); }

template <int FAST> __device__ __forceinline__ float tanh_of(float v) {
  if (FAST) {
    float r;
    asm("tanh.approx.f32 %0, %1;" : "=f"(r) : "f"(v));
    return r;
  }
  return tanhf(v);
}
template <int FAST> __device__ __forceinline__ double tanh_of(double v) { return tanh(v); }

template <int APPROX, int FAST, typename A> __device__ __forceinline__ A gelu_value(A x) {
  if (APPROX == 0) return A(0.5) * x * (A(1) + erf_of(x * A(0.70710678118654752440)));
  const A inner = A(0.79788456080286535588) * (x + A(0.044715) * x * x * x);
  return A(0.5) * x * (A(1) + tanh_of<FAST>(inner));
}

template <int APPROX, int FAST, typename A> __device__ __forceinline__ A gelu_derivative(A x) {
  if (APPROX == 0) {
    const A cdf = A(0.5) * (A(1) + erf_of(x * A(0.70710678118654752440)));
    const A pdf = exp_of(A(-0.5) * x * x) * A(0.39894228040143267794);
    return cdf + x * pdf;
  }
  const A k0 = A(0.79788456080286535588), k1 = A(0.044715);
  const A t = tanh_of<FAST>(k0 * (x + k1 * x * x * x));
  return A(0.5) * (A(1) + t) + A(0.5) * x * (A(1) - t * t) * k0 * (A(1) + A(3) * k1 * x * x);
}

// Grid-stride over tiles of blockDim.x * UNROLL vectors; the VEC-1 trailing elements (when count % VEC) go
// element by element.  With I = int the caller guarantees count < 2^30, so base + stride cannot overflow.
template <typename T, int VEC, int APPROX, typename I, int UNROLL = 4, int FAST = 0>
__global__ void __launch_bounds__(256) gelu_forward(const T* __restrict__ x, T* __restrict__ y, i64 count) {
  using A = acc_t<T>;
  using V = Vec<T, VEC>;
  const I n = static_cast<I>(count);
  const I n_vec = n / VEC;
  const I tile = (I)blockDim.x * UNROLL;
  const V* xv = reinterpret_cast<const V*>(x);
  V* yv = reinterpret_cast<V*>(y);
  for (I base = (I)blockIdx.x * tile + threadIdx.x; base < n_vec; base += (I)gridDim.x * tile) {
    V v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const I i = base + u * (I)blockDim.x;
      if (i < n_vec) v[u] = xv[i];
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const I i = base + u * (I)blockDim.x;
      if (i < n_vec) {
        V o;
#pragma unroll
        for (int k = 0; k < VEC; ++k) o.v[k] = store_as<T>(gelu_value<APPROX, FAST>(load_as<A>(v[u].v[k])));
        yv[i] = o;
      }
    }
  }
  for (I i = n_vec * VEC + (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {
    y[i] = store_as<T>(gelu_value<APPROX, FAST>(load_as<A>(x[i])));
  }
}

template <typename T, int VEC, int APPROX, typename I, int UNROLL = 2, int FAST = 0>
__global__ void __launch_bounds__(256) gelu_backward(const T* __restrict__ dy, const T* __restrict__ x,
                                                     T* __restrict__ dx, i64 count) {
  using A = acc_t<T>;
  using V = Vec<T, VEC>;
  const I n = static_cast<I>(count);
  const I n_vec = n / VEC;
  const I tile = (I)blockDim.x * UNROLL;
  const V* gv = reinterpret_cast<const V*>(dy);
  const V* xv = reinterpret_cast<const V*>(x);
  V* dv = reinterpret_cast<V*>(dx);
  for (I base = (I)blockIdx.x * tile + threadIdx.x; base < n_vec; base += (I)gridDim.x * tile) {
    V vg[UNROLL], vx[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const I i = base + u * (I)blockDim.x;
      if (i < n_vec) {
        vg[u] = gv[i];
        vx[u] = xv[i];
      }
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const I i = base + u * (I)blockDim.x;
      if (i < n_vec) {
        V o;
#pragma unroll
        for (int k = 0; k < VEC; ++k)
          o.v[k] = store_as<T>(load_as<A>(vg[u].v[k]) * gelu_derivative<APPROX, FAST>(load_as<A>(vx[u].v[k])));
        dv[i] = o;
      }
    }
  }
  for (I i = n_vec * VEC + (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {
    dx[i] = store_as<T>(load_as<A>(dy[i]) * gelu_derivative<APPROX, FAST>(load_as<A>(x[i])));
  }
}

}  // namespace jitops
