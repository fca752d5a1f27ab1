// jitops.gelu on the CPU, forward and backward, over contiguous buffers of n elements.  SCALAR_T comes from the
// shape class.  approximate: 0 = erf form, 1 = tanh form (a runtime argument here: one compile serves both).
#include <ATen/Parallel.h>
#include <cmath>

#include "export.h"

namespace {
constexpr double kInvSqrt2 = 0.70710678118654752440, kSqrt2OverPi = 0.79788456080286535588,
                 kInvSqrt2Pi = 0.39894228040143267794, kCubic = 0.044715;
constexpr int64_t kGrain = 16384;  // elements per parallel task

inline SCALAR_T gelu_value(SCALAR_T x, bool tanh_form) {
  if (!tanh_form) return SCALAR_T(0.5) * x * (SCALAR_T(1) + std::erf(x * SCALAR_T(kInvSqrt2)));
  return SCALAR_T(0.5) * x * (SCALAR_T(1) + std::tanh(SCALAR_T(kSqrt2OverPi) * (x + SCALAR_T(kCubic) * x * x * x)));
}

inline SCALAR_T gelu_derivative(SCALAR_T x, bool tanh_form) {
  if (!tanh_form) {
    SCALAR_T cdf = SCALAR_T(0.5) * (SCALAR_T(1) + std::erf(x * SCALAR_T(kInvSqrt2)));
    return cdf + x * std::exp(SCALAR_T(-0.5) * x * x) * SCALAR_T(kInvSqrt2Pi);
  }
  SCALAR_T t = std::tanh(SCALAR_T(kSqrt2OverPi) * (x + SCALAR_T(kCubic) * x * x * x));
  return SCALAR_T(0.5) * (SCALAR_T(1) + t) +
         SCALAR_T(0.5) * x * (SCALAR_T(1) - t * t) * SCALAR_T(kSqrt2OverPi) * (SCALAR_T(1) + SCALAR_T(3 * kCubic) * x * x);
}
}  // namespace

JITOPS_CPU_EXPORT
void gelu_forward(const SCALAR_T* px, SCALAR_T* py, int64_t n, int32_t approximate) {
  const bool tanh_form = approximate == 1;
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) py[i] = gelu_value(px[i], tanh_form);
  });
}

JITOPS_CPU_EXPORT
void gelu_backward(const SCALAR_T* pg, const SCALAR_T* px, SCALAR_T* pd, int64_t n, int32_t approximate) {
  const bool tanh_form = approximate == 1;
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) pd[i] = pg[i] * gelu_derivative(px[i], tanh_form);
  });
}
