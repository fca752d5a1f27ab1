// What CUTLASS 3's sm_90 headers take from the C++ standard library, which NVRTC does not have: the same names
// from libcu++ (CCCL).  Included only under NVRTC (__CUDACC_RTC__), before any CUTLASS header.
#pragma once

#include <cuda/std/cstddef>  // offsetof (the null-pointer form, a constant NVRTC 13.0 folds)
#include <cuda/std/type_traits>

#include "cute/container/tuple.hpp"

namespace std {
// The sm_90 epilogue builders (linear_combination_bias_elementwise.h, the ptr-array epilogue).
using cuda::std::is_pointer_v;
using cuda::std::void_t;

// Structured bindings of a const cute::tuple (Sm90RowBroadcast's `auto const& [m, n, l] = params.dRow`, the bias
// of jitops.gemm's fused epilogue): cute declares std::tuple_size / tuple_element for cute::tuple under NVRTC,
// but not the const-qualified forms that <utility> derives on a host compiler.
template <class... T>
struct tuple_size<const cute::tuple<T...>> : cuda::std::integral_constant<size_t, sizeof...(T)> {};

template <size_t I, class... T>
struct tuple_element<I, const cute::tuple<T...>> {
  using type = const typename tuple_element<I, cute::tuple<T...>>::type;
};
}  // namespace std
