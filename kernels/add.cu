// jitops.add: out = a + b, elementwise, contiguous.  VEC elements per access (the shape class picks VEC from
// the pointers' alignment); a scalar loop finishes the tail.
#include "jitops/common.cuh"

namespace jitops {

template <typename T, int VEC>
__global__ void add_forward(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out, i64 n) {
  using A = acc_t<T>;
  const i64 n_vec = n / VEC;
  for (i64 i = global_thread(); i < n_vec; i += grid_threads()) {
    Vec<T, VEC> va = load_vec<T, VEC>(a, i), vb = load_vec<T, VEC>(b, i), vo;
#pragma unroll
    for (int k = 0; k < VEC; ++k) vo.v[k] = store_as<T>(load_as<A>(va.v[k]) + load_as<A>(vb.v[k]));
    store_vec<T, VEC>(out, i, vo);
  }
  for (i64 i = n_vec * VEC + global_thread(); i < n; i += grid_threads()) {
    out[i] = store_as<T>(load_as<A>(a[i]) + load_as<A>(b[i]));
  }
}

}  // namespace jitops
