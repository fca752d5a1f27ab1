// jitops.add on the CPU.  SCALAR_T comes from the shape class (-D): float or double (fp16 and bf16 are computed
// in float: jitops/ops/add.py converts them).
//   add_forward: out = a + b over contiguous buffers of n elements.
//   add_strided: out = a + alpha * b, out contiguous (n elements); a and b read through the `dims` (size,
//                stride) dimensions that add.py's _plan leaves, outermost first, a broadcast dimension having
//                stride 0 (nothing is expanded in memory).  layout holds the sizes, then a's strides, then b's.
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "export.h"

// 32768 elements a task: below that, threading costs more than it saves.
constexpr int64_t kGrain = 32768;

JITOPS_CPU_EXPORT
void add_forward(const SCALAR_T* pa, const SCALAR_T* pb, SCALAR_T* po, int64_t n) {
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) po[i] = pa[i] + pb[i];
  });
}

JITOPS_CPU_EXPORT
void add_strided(const SCALAR_T* pa, const SCALAR_T* pb, SCALAR_T* po, int64_t n, double alpha, int32_t dims,
                 const int64_t* layout) {
  const int64_t* sizes = layout;
  const int64_t* a_strides = layout + dims;
  const int64_t* b_strides = layout + 2 * dims;
  const SCALAR_T scale = static_cast<SCALAR_T>(alpha);
  const int64_t inner = sizes[dims - 1], step_a = a_strides[dims - 1], step_b = b_strides[dims - 1];
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    // The task's first element as an index per dimension, then runs along the innermost one with a carry.
    std::vector<int64_t> index(dims);
    int64_t rest = begin, offset_a = 0, offset_b = 0;
    for (int d = dims - 1; d >= 0; --d) {
      index[d] = rest % sizes[d];
      rest /= sizes[d];
      offset_a += index[d] * a_strides[d];
      offset_b += index[d] * b_strides[d];
    }
    for (int64_t i = begin; i < end;) {
      const int64_t run = std::min(end - i, inner - index[dims - 1]);
      if (scale == SCALAR_T(1)) {
        for (int64_t k = 0; k < run; ++k) po[i + k] = pa[offset_a + k * step_a] + pb[offset_b + k * step_b];
      } else {  // one rounding, as torch's vectorized CPU add (fmadd) and the CUDA kernels compute a + alpha * b
        for (int64_t k = 0; k < run; ++k) {
          po[i + k] = std::fma(scale, pb[offset_b + k * step_b], pa[offset_a + k * step_a]);
        }
      }
      i += run;
      offset_a += run * step_a;
      offset_b += run * step_b;
      index[dims - 1] += run;
      for (int d = dims - 1; d > 0 && index[d] == sizes[d]; --d) {
        offset_a += a_strides[d - 1] - sizes[d] * a_strides[d];
        offset_b += b_strides[d - 1] - sizes[d] * b_strides[d];
        index[d] = 0;
        ++index[d - 1];
      }
    }
  });
}
