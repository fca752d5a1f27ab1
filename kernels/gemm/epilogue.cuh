// jitops.gemm epilogue math, shared by the CUTLASS 3 (sm_90a) and CUTLASS 2 (sm_80 family) kernels:
//     D = act(acc + bias)      act: 0 none, 1 relu, 2 gelu (erf form, torch's default), 3 gelu (tanh form,
//                              torch's approximate="tanh": GPT-2's and ViT's MLPs)
// The activation is a run-time argument (one warp-uniform branch per fragment), so one compiled kernel serves
// every bias/activation combination: fewer configurations to compile and to prewarm.
#pragma once

#include "cutlass/array.h"
#include "cutlass/cutlass.h"

namespace jitops_gemm {

enum Activation : int { kNone = 0, kRelu = 1, kGelu = 2, kGeluTanh = 3 };

CUTLASS_HOST_DEVICE float activate(float z, int activation) {
  if (activation == kGelu) {
    return 0.5f * z * (1.0f + erff(z * 0.70710678118654752440f));
  }
  if (activation == kGeluTanh) {  // sqrt(2/pi) (z + 0.044715 z^3), as torch writes it
    return 0.5f * z * (1.0f + tanhf(0.79788456080286535588f * (z + 0.044715f * z * z * z)));
  }
  if (activation == kRelu) {
    return z < 0.0f ? 0.0f : z;  // NaN stays NaN, as in torch.relu
  }
  return z;
}

// Run-time arguments of the epilogue (a CUTLASS 3 EVT compute node takes them by this member type).
struct ActivationArguments {
  int activation = kNone;
};

// CUTLASS 3 EVT compute functor: out = act(acc + bias).  Sm90Compute instantiates it for the scalar compute type
// (to find Arguments) and for fragments (to compute).
template <class T>
struct BiasActivation {
  using Arguments = ActivationArguments;
};

template <int N>
struct BiasActivation<cutlass::Array<float, N>> {
  using Arguments = ActivationArguments;

  CUTLASS_HOST_DEVICE cutlass::Array<float, N> operator()(cutlass::Array<float, N> const& acc,
                                                          cutlass::Array<float, N> const& bias,
                                                          Arguments const& args) const {
    cutlass::Array<float, N> out;
    // One branch per fragment, then a straight loop (the activation is uniform across the grid).
    if (args.activation == kGelu) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < N; ++i) out[i] = activate(acc[i] + bias[i], kGelu);
    } else if (args.activation == kGeluTanh) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < N; ++i) out[i] = activate(acc[i] + bias[i], kGeluTanh);
    } else if (args.activation == kRelu) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < N; ++i) out[i] = activate(acc[i] + bias[i], kRelu);
    } else {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < N; ++i) out[i] = acc[i] + bias[i];
    }
    return out;
  }
};

}  // namespace jitops_gemm
