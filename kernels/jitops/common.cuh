// Shared device helpers for jitops kernels (NVRTC and nvcc).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace jitops {

using i64 = long long;

// Arithmetic happens in float for 16-bit types and in the type itself for float and double.
template <typename T> struct Acc { using type = float; };
template <> struct Acc<double> { using type = double; };
template <typename T> using acc_t = typename Acc<T>::type;

template <typename A, typename T> __device__ __forceinline__ A load_as(T v) { return static_cast<A>(v); }
template <> __device__ __forceinline__ float load_as<float, __half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float load_as<float, __nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T, typename A> __device__ __forceinline__ T store_as(A v) { return static_cast<T>(v); }
template <> __device__ __forceinline__ __half store_as<__half, float>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 store_as<__nv_bfloat16, float>(float v) {
  return __float2bfloat16_rn(v);
}

// VEC elements moved as one aligned access (16 bytes when VEC * sizeof(T) == 16: one LDG.128).
template <typename T, int VEC> struct alignas(sizeof(T) * VEC) Vec {
  T v[VEC];
};

template <typename T, int VEC> __device__ __forceinline__ Vec<T, VEC> load_vec(const T* p, i64 i) {
  return reinterpret_cast<const Vec<T, VEC>*>(p)[i];
}
template <typename T, int VEC> __device__ __forceinline__ void store_vec(T* p, i64 i, const Vec<T, VEC>& v) {
  reinterpret_cast<Vec<T, VEC>*>(p)[i] = v;
}

__device__ __forceinline__ i64 global_thread() { return blockIdx.x * (i64)blockDim.x + threadIdx.x; }
__device__ __forceinline__ i64 grid_threads() { return (i64)gridDim.x * blockDim.x; }

}  // namespace jitops
