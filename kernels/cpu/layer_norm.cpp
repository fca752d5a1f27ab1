// jitops.layer_norm on the CPU, forward and backward, over `rows` contiguous rows of `n` elements.
// SCALAR_T comes from the shape class (float or double); every sum is taken in double.  stats holds the mean
// of every row, then its rstd (2 x rows, SCALAR_T).
// weight, bias, dx, dweight and dbias may be null (absent or not wanted).
// rms (jitops.rms_norm): the mean is taken as 0 (and saved as 0), and dx has no mean(g) term.
// dweight/dbias: each column is summed over the rows in row order by one task, whatever the thread count,
// so the result is deterministic.
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <vector>

#include "export.h"

namespace {
int64_t row_grain(int64_t n) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(n, 1)); }
constexpr int64_t kColumnGrain = 256;
}  // namespace

JITOPS_CPU_EXPORT
void layer_norm_forward(const SCALAR_T* px, const SCALAR_T* pw, const SCALAR_T* pb, SCALAR_T* py,
                        SCALAR_T* stats, int64_t rows, int64_t n, double eps, int64_t rms) {
  SCALAR_T* mean_out = stats;
  SCALAR_T* rstd_out = mean_out + rows;
  at::parallel_for(0, rows, row_grain(n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const SCALAR_T* xr = px + r * n;
      double sum = 0;
      if (!rms) {
        for (int64_t i = 0; i < n; ++i) sum += xr[i];
      }
      const double mean = sum / n;
      double m2 = 0;
      for (int64_t i = 0; i < n; ++i) {
        const double d = xr[i] - mean;
        m2 += d * d;
      }
      const double rstd = 1.0 / std::sqrt(m2 / n + eps);
      mean_out[r] = static_cast<SCALAR_T>(mean);
      rstd_out[r] = static_cast<SCALAR_T>(rstd);
      SCALAR_T* yr = py + r * n;
      for (int64_t i = 0; i < n; ++i) {
        double v = (xr[i] - mean) * rstd;
        if (pw) v *= pw[i];
        if (pb) v += pb[i];
        yr[i] = static_cast<SCALAR_T>(v);
      }
    }
  });
}

JITOPS_CPU_EXPORT
void layer_norm_backward(const SCALAR_T* pg, const SCALAR_T* px, const SCALAR_T* stats, const SCALAR_T* pw,
                         SCALAR_T* pdx, SCALAR_T* pdw, SCALAR_T* pdb, int64_t rows, int64_t n, int64_t rms) {
  const SCALAR_T* mean = stats;
  const SCALAR_T* rstd = mean + rows;
  if (pdx) {
    at::parallel_for(0, rows, row_grain(n), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const SCALAR_T* xr = px + r * n;
        const SCALAR_T* gr = pg + r * n;
        const double m = mean[r], s = rstd[r];
        double sum_g = 0, sum_gx = 0;
        for (int64_t i = 0; i < n; ++i) {
          const double g = pw ? double(gr[i]) * pw[i] : double(gr[i]);
          sum_g += g;
          sum_gx += g * ((xr[i] - m) * s);
        }
        const double mean_g = rms ? 0.0 : sum_g / n, mean_gx = sum_gx / n;
        SCALAR_T* dr = pdx + r * n;
        for (int64_t i = 0; i < n; ++i) {
          const double g = pw ? double(gr[i]) * pw[i] : double(gr[i]);
          dr[i] = static_cast<SCALAR_T>((g - mean_g - (xr[i] - m) * s * mean_gx) * s);
        }
      }
    });
  }
  if (pdw || pdb) {
    at::parallel_for(0, n, kColumnGrain, [&](int64_t begin, int64_t end) {
      std::vector<double> sw(end - begin, 0.0), sb(end - begin, 0.0);
      for (int64_t r = 0; r < rows; ++r) {
        const SCALAR_T* xr = px + r * n;
        const SCALAR_T* gr = pg + r * n;
        const double m = mean[r], s = rstd[r];
        for (int64_t i = begin; i < end; ++i) {
          sw[i - begin] += double(gr[i]) * ((xr[i] - m) * s);
          sb[i - begin] += gr[i];
        }
      }
      for (int64_t i = begin; i < end; ++i) {
        if (pdw) pdw[i] = static_cast<SCALAR_T>(sw[i - begin]);
        if (pdb) pdb[i] = static_cast<SCALAR_T>(sb[i - begin]);
      }
    });
  }
}
