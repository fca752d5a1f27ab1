// jitops.layer_norm forward and backward over `rows` rows of `n` contiguous elements.
//
// Shape class (jitops/ops/layer_norm.py): T, VEC elements per access (16 bytes when every pointer and n allow
// it; n % VEC == 0 always), TPR threads per row (a power of two, 1..1024), ITERS vectors per thread per row
// tile, index type I.  A row tile is TPR * ITERS vectors.  When the row fits in one tile (the common case) it
// is read from memory once and kept in registers between the statistics and the output; longer rows stream
// through tiles twice (the second pass mostly hits L2).
//
// A block holds RPB = THREADS / TPR rows at a time and walks row blocks grid-stride (a persistent grid in the
// backward, so that each block sums dweight/dbias over many rows in registers).
//
// RMS (jitops.rms_norm): the same kernels with the mean taken as 0, so rstd = 1/sqrt(mean(x^2) + eps) and the
// statistics saved for the backward hold a mean of 0; the backward then drops mean(g) from dx, and the dweight
// kernels, which read the saved mean, need no change.
//
// Reductions: a butterfly of warp shuffles, and for TPR > 32 one barrier and a second butterfly over the
// warps.  Every combine is commutative bit for bit, so all threads of a row get identical statistics; the
// dweight/dbias partial sums go to a workspace [2][blocks][n] and a second kernel adds them in a fixed order.
// No floating-point atomics anywhere: the same inputs on the same device give the same bits.
#include "jitops/common.cuh"

namespace jitops {
namespace ln {

template <typename A> struct Moments {
  A count, mean, m2;
};
template <typename A> struct Sums {
  A a, b;
};

__device__ __forceinline__ float shfl_xor(float v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }
__device__ __forceinline__ double shfl_xor(double v, int mask) { return __shfl_xor_sync(0xffffffffu, v, mask); }
template <typename A> __device__ __forceinline__ Moments<A> shfl_xor(const Moments<A>& v, int mask) {
  return {shfl_xor(v.count, mask), shfl_xor(v.mean, mask), shfl_xor(v.m2, mask)};
}
template <typename A> __device__ __forceinline__ Sums<A> shfl_xor(const Sums<A>& v, int mask) {
  return {shfl_xor(v.a, mask), shfl_xor(v.b, mask)};
}

// Chan, Golub and LeVeque's merge of two (count, mean, M2) summaries, written so that combine(p, q) and
// combine(q, p) give the same bits (sums and products of the same two operands; (a-b)^2 == (b-a)^2).
template <typename A> __device__ __forceinline__ Moments<A> combine(const Moments<A>& p, const Moments<A>& q) {
  if (p.count == A(0)) return q;
  if (q.count == A(0)) return p;
  const A count = p.count + q.count;
  const A inv = A(1) / count;
  const A delta = q.mean - p.mean;
  return {count, (p.count * p.mean + q.count * q.mean) * inv,
          (p.m2 + q.m2) + delta * delta * (p.count * q.count * inv)};
}
template <typename A> __device__ __forceinline__ Sums<A> combine(const Sums<A>& p, const Sums<A>& q) {
  return {p.a + q.a, p.b + q.b};
}

// Element k of a loaded vector, widened to the accumulation type.  bf16 pairs are read straight out of their
// 32-bit words (a shift or a mask) rather than through cuda_bf16.h's conversion, which unpacks every element into
// its own register first: with that, the bf16 backward needed 169 registers (200 bytes of spills at a cap of
// 128) where fp16 needed 128.
template <typename T> constexpr bool is_bf16 = false;
template <> constexpr bool is_bf16<__nv_bfloat16> = true;

template <typename A, typename T, int VEC> __device__ __forceinline__ A element(const Vec<T, VEC>& v, int k) {
  if constexpr (is_bf16<T> && VEC % 2 == 0) {
    const unsigned word = reinterpret_cast<const unsigned*>(v.v)[k / 2];
    return __uint_as_float(k % 2 ? word & 0xffff0000u : word << 16);
  } else if constexpr (is_bf16<T>) {
    return __uint_as_float(static_cast<unsigned>(static_cast<__nv_bfloat16_raw>(v.v[k]).x) << 16);
  } else {
    return load_as<A>(v.v[k]);
  }
}

__device__ __forceinline__ float rsqrt_of(float v) { return rsqrtf(v); }
__device__ __forceinline__ double rsqrt_of(double v) { return rsqrt(v); }

// g = dy * w, rounded as its own operation (mul.rn, which the compiler never fuses into an FMA).  The backward
// forms g twice, once into mean(g) and once into g - mean(g); with a plain multiply the second became
// fma(dy, w, -mean(g)), whose unrounded product left g - mean(g) at the product's rounding error instead of 0.
// For n == 1 (xhat == 0) that was all of dx: -6.7e-05 where the exact gradient is 0 (fp32, issue 19).
__device__ __forceinline__ float product(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double product(double a, double b) { return __dmul_rn(a, b); }

template <int TPR> struct Shape {
  static constexpr int THREADS = TPR > 128 ? TPR : 128;
  static constexpr int RPB = THREADS / TPR;  // rows per block
  static constexpr int WARPS = THREADS / 32;
};

// Blocks of the backward an SM must hold: registers for x and dy (32-bit words), the dweight/dbias sums
// (PARAMS == 1) and about 28 more; <= 64 a thread when that fits, else <= 128 (never fewer than 16 warps an SM).
// Without it the compiler took 95 registers for the odd-n bf16 backward (one 512-thread block an SM) where 64
// hold it.
template <typename T, int VEC, int TPR, int ITERS, int PARAMS> struct BackwardOccupancy {
  static constexpr int WORDS = VEC * (int)sizeof(T) < 4 ? 1 : VEC * (int)sizeof(T) / 4;
  static constexpr int NEED = 2 * ITERS * WORDS + (PARAMS == 1 ? 2 * ITERS * VEC * (int)sizeof(acc_t<T>) / 4 : 0) + 28;
  static constexpr int CAP = NEED <= 64 ? 64 : 128;
  static constexpr int BLOCKS = 65536 / (Shape<TPR>::THREADS * CAP) > 0 ? 65536 / (Shape<TPR>::THREADS * CAP) : 1;
};

// All-reduce over each group of TPR consecutive threads.  Every thread of a group ends with bitwise the same
// value.  TPR > 32 stages the warps' values in `scratch` (one slot per warp) behind one barrier; callers
// alternate between two scratch buffers, so a buffer is rewritten only after everyone passed the next barrier.
// Every thread of the block must call it the same number of times.
template <int TPR, typename V> __device__ __forceinline__ V group_allreduce(V v, V* scratch) {
  constexpr int WIDTH = TPR < 32 ? TPR : 32;
#pragma unroll
  for (int mask = WIDTH / 2; mask > 0; mask >>= 1) v = combine(v, shfl_xor(v, mask));
  if constexpr (TPR > 32) {
    constexpr int WARPS = TPR / 32;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = scratch[(warp & ~(WARPS - 1)) + (lane & (WARPS - 1))];
#pragma unroll
    for (int mask = WARPS / 2; mask > 0; mask >>= 1) v = combine(v, shfl_xor(v, mask));
  }
  return v;
}

}  // namespace ln

// ---- forward: y = (x - mean) * rstd * w + b; stats[row] = mean, stats[rows + row] = rstd (if stats) --------------
template <typename T, int VEC, int TPR, int ITERS, typename I, bool RMS>
__global__ void __launch_bounds__(ln::Shape<TPR>::THREADS)
    layer_norm_forward(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,
                       acc_t<T>* __restrict__ stats, i64 rows_, i64 n_, double eps_) {
  using A = acc_t<T>;
  using V = Vec<T, VEC>;
  using S = ln::Shape<TPR>;
  constexpr int TILE = TPR * ITERS;  // vectors per row tile
  __shared__ ln::Moments<A> scratch[2][S::WARPS];
  const I rows = static_cast<I>(rows_), n = static_cast<I>(n_), chunks = n / VEC;
  const A eps = static_cast<A>(eps_);
  const int group = threadIdx.x / TPR, t = threadIdx.x % TPR;
  const I row_blocks = (rows + S::RPB - 1) / S::RPB;
  const bool one_tile = chunks <= TILE;
  const V* wv = reinterpret_cast<const V*>(w);
  const V* bv = reinterpret_cast<const V*>(b);
  int parity = 0;
  for (I rb = blockIdx.x; rb < row_blocks; rb += gridDim.x) {
    const I row = rb * S::RPB + group;
    const bool valid = row < rows;
    const I offset = valid ? row * chunks : 0;  // in vectors
    const V* xr = reinterpret_cast<const V*>(x) + offset;
    V v[ITERS];
    ln::Moments<A> m = {A(0), A(0), A(0)};
    for (I base = 0; base < chunks; base += TILE) {
#pragma unroll
      for (int it = 0; it < ITERS; ++it) {
        const I c = base + it * TPR + t;
        if (valid && c < chunks) v[it] = xr[c];
      }
      A sum = A(0), count = A(0);
#pragma unroll
      for (int it = 0; it < ITERS; ++it) {
        const I c = base + it * TPR + t;
        if (valid && c < chunks) {
#pragma unroll
          for (int k = 0; k < VEC; ++k) sum += ln::element<A>(v[it], k);
          count += A(VEC);
        }
      }
      if (count > A(0)) {
        const A mean = RMS ? A(0) : sum / count;  // RMS: m2 is the sum of squares (combine's delta is 0)
        A m2 = A(0);
#pragma unroll
        for (int it = 0; it < ITERS; ++it) {
          const I c = base + it * TPR + t;
          if (valid && c < chunks) {
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
              const A d = ln::element<A>(v[it], k) - mean;
              m2 += d * d;
            }
          }
        }
        m = ln::combine(m, ln::Moments<A>{count, mean, m2});
      }
    }
    m = ln::group_allreduce<TPR>(m, scratch[parity]);
    parity ^= 1;
    const A mean = m.mean;
    const A rstd = ln::rsqrt_of(m.m2 / A(n) + eps);
    if (valid && t == 0 && stats != nullptr) {  // null: inference, nobody saves the statistics
      stats[row] = mean;
      stats[rows + row] = rstd;
    }
    V* yr = reinterpret_cast<V*>(y) + offset;
    for (I base = 0; base < chunks; base += TILE) {
      if (!one_tile) {
#pragma unroll
        for (int it = 0; it < ITERS; ++it) {
          const I c = base + it * TPR + t;
          if (valid && c < chunks) v[it] = xr[c];
        }
      }
#pragma unroll
      for (int it = 0; it < ITERS; ++it) {
        const I c = base + it * TPR + t;
        if (valid && c < chunks) {
          V wt, bt, o;
          if (w) wt = wv[c];
          if (b) bt = bv[c];
#pragma unroll
          for (int k = 0; k < VEC; ++k) {
            A value = (ln::element<A>(v[it], k) - mean) * rstd;
            if (w) value *= ln::element<A>(wt, k);
            if (b) value += ln::element<A>(bt, k);
            o.v[k] = store_as<T>(value);
          }
          yr[c] = o;
        }
      }
    }
  }
}

// ---- backward ---------------------------------------------------------------------------------------------------
// With xhat = (x - mean) * rstd and g = dy * w (g = dy without a weight):
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),   dweight = sum_rows dy * xhat,   dbias = sum_rows dy;
// RMS drops mean(g) (its mean is 0).
// PARAMS says where this kernel sums dweight/dbias over its rows:
//   0: it does not (no dweight/dbias wanted, or layer_norm_backward_columns does it);
//   1: in registers (one-tile rows only: a thread owns the same columns in every row);
//   2: in dynamic shared memory, [2][RPB][n] of acc_t<T> (rows of any length that fit).
// Either way the block then writes its sums to partial[0][blockIdx.x][:] (dweight) and partial[1][...] (dbias),
// adding the RPB row groups of the block in order; layer_norm_reduce_partials adds the blocks in order.
template <typename T, int VEC, int TPR, int ITERS, typename I, int PARAMS, bool RMS>
__global__ void __launch_bounds__(ln::Shape<TPR>::THREADS, (ln::BackwardOccupancy<T, VEC, TPR, ITERS, PARAMS>::BLOCKS))
    layer_norm_backward(const T* __restrict__ dy, const T* __restrict__ x, const acc_t<T>* __restrict__ stats,
                        const T* __restrict__ w, T* __restrict__ dx, acc_t<T>* __restrict__ partial,
                        T* __restrict__ dw_out, T* __restrict__ db_out, i64 rows_, i64 n_) {
  using A = acc_t<T>;
  using V = Vec<T, VEC>;
  using VA = Vec<A, VEC>;
  using S = ln::Shape<TPR>;
  constexpr int TILE = TPR * ITERS;
  constexpr int R_ITERS = PARAMS == 1 ? ITERS : 1;  // register accumulators only when PARAMS == 1
  __shared__ ln::Sums<A> scratch[2][S::WARPS];
  extern __shared__ __align__(16) unsigned char dynamic_smem[];
  A* const smem = reinterpret_cast<A*>(dynamic_smem);
  const I rows = static_cast<I>(rows_), n = static_cast<I>(n_), chunks = n / VEC;
  const int group = threadIdx.x / TPR, t = threadIdx.x % TPR;
  const I row_blocks = (rows + S::RPB - 1) / S::RPB;
  const bool one_tile = chunks <= TILE;
  const A inv_n = A(1) / A(n);
  const V* wv = reinterpret_cast<const V*>(w);

  A dw_acc[R_ITERS][VEC], db_acc[R_ITERS][VEC];
#pragma unroll
  for (int it = 0; it < R_ITERS; ++it)
#pragma unroll
    for (int k = 0; k < VEC; ++k) dw_acc[it][k] = db_acc[it][k] = A(0);
  // dweight/dbias wanted (the dynamic shared memory exists only then).  A grid of one block writes them
  // directly (dw_out, db_out: either may be null); larger grids write partial sums.
  const bool sums = partial != nullptr || dw_out != nullptr || db_out != nullptr;
  if constexpr (PARAMS == 2) {
    if (sums) {
      for (I i = threadIdx.x; i < 2 * S::RPB * n; i += S::THREADS) smem[i] = A(0);
    }
    __syncthreads();
  }
  VA* const smem_dw = reinterpret_cast<VA*>(smem + (I)group * n);
  VA* const smem_db = reinterpret_cast<VA*>(smem + (I)(S::RPB + group) * n);

  int parity = 0;
  for (I rb = blockIdx.x; rb < row_blocks; rb += gridDim.x) {
    const I row = rb * S::RPB + group;
    const bool valid = row < rows;
    const I offset = valid ? row * chunks : 0;
    const V* xr = reinterpret_cast<const V*>(x) + offset;
    const V* gr = reinterpret_cast<const V*>(dy) + offset;
    const A mean = valid ? stats[row] : A(0);
    const A rstd = valid ? stats[rows + row] : A(0);
    V vx[ITERS], vg[ITERS];
    ln::Sums<A> s = {A(0), A(0)};
    for (I base = 0; base < chunks; base += TILE) {
#pragma unroll
      for (int it = 0; it < ITERS; ++it) {
        const I c = base + it * TPR + t;
        if (valid && c < chunks) {
          vx[it] = xr[c];
          vg[it] = gr[c];
        }
      }
#pragma unroll
      for (int it = 0; it < ITERS; ++it) {
        const I c = base + it * TPR + t;
        if (valid && c < chunks) {
          V wt;
          if (w) wt = wv[c];
          VA pw, pb;
          if constexpr (PARAMS == 2) {
            if (sums) {
              pw = smem_dw[c];
              pb = smem_db[c];
            }
          }
#pragma unroll
          for (int k = 0; k < VEC; ++k) {
            const A xhat = (ln::element<A>(vx[it], k) - mean) * rstd;
            const A d = ln::element<A>(vg[it], k);
            const A g = w ? ln::product(d, ln::element<A>(wt, k)) : d;
            s.a += g;
            s.b += g * xhat;
            if constexpr (PARAMS == 1) {
              dw_acc[it][k] += d * xhat;
              db_acc[it][k] += d;
            } else if constexpr (PARAMS == 2) {
              pw.v[k] += d * xhat;
              pb.v[k] += d;
            }
          }
          if constexpr (PARAMS == 2) {
            if (sums) {
              smem_dw[c] = pw;
              smem_db[c] = pb;
            }
          }
        }
      }
    }
    if (dx == nullptr) continue;  // uniform across the grid: no barrier is skipped by some threads only
    s = ln::group_allreduce<TPR>(s, scratch[parity]);
    parity ^= 1;
    const A mean_g = RMS ? A(0) : s.a * inv_n, mean_gx = s.b * inv_n;
    V* dr = reinterpret_cast<V*>(dx) + offset;
    for (I base = 0; base < chunks; base += TILE) {
      if (!one_tile) {
#pragma unroll
        for (int it = 0; it < ITERS; ++it) {
          const I c = base + it * TPR + t;
          if (valid && c < chunks) {
            vx[it] = xr[c];
            vg[it] = gr[c];
          }
        }
      }
#pragma unroll
      for (int it = 0; it < ITERS; ++it) {
        const I c = base + it * TPR + t;
        if (valid && c < chunks) {
          V wt, o;
          if (w) wt = wv[c];
#pragma unroll
          for (int k = 0; k < VEC; ++k) {
            const A xhat = (ln::element<A>(vx[it], k) - mean) * rstd;
            const A d = ln::element<A>(vg[it], k);
            const A g = w ? ln::product(d, ln::element<A>(wt, k)) : d;
            o.v[k] = store_as<T>((g - mean_g - xhat * mean_gx) * rstd);
          }
          dr[c] = o;
        }
      }
    }
  }

  if constexpr (PARAMS != 0) {
    if (!sums) return;
    // Column vector c of this block's sums: to the partial workspace, or (one block) converted to T.
    auto emit = [&](I c, const VA& pw, const VA& pb) {
      if (partial != nullptr) {
        reinterpret_cast<VA*>(partial + (i64)blockIdx.x * n)[c] = pw;
        reinterpret_cast<VA*>(partial + ((i64)gridDim.x + blockIdx.x) * n)[c] = pb;
        return;
      }
      V ow, ob;
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        ow.v[k] = store_as<T>(pw.v[k]);
        ob.v[k] = store_as<T>(pb.v[k]);
      }
      if (dw_out != nullptr) reinterpret_cast<V*>(dw_out)[c] = ow;
      if (db_out != nullptr) reinterpret_cast<V*>(db_out)[c] = ob;
    };
    if constexpr (PARAMS == 1 && S::RPB == 1) {
#pragma unroll
      for (int it = 0; it < ITERS; ++it) {
        const I c = it * TPR + t;
        if (c < chunks) {
          VA pw, pb;
#pragma unroll
          for (int k = 0; k < VEC; ++k) {
            pw.v[k] = dw_acc[it][k];
            pb.v[k] = db_acc[it][k];
          }
          emit(c, pw, pb);
        }
      }
    } else {
      if constexpr (PARAMS == 1) {  // RPB > 1: stage every group's sums in shared memory first
#pragma unroll
        for (int it = 0; it < ITERS; ++it) {
          const I c = it * TPR + t;
          if (c < chunks) {
            VA pw, pb;
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
              pw.v[k] = dw_acc[it][k];
              pb.v[k] = db_acc[it][k];
            }
            smem_dw[c] = pw;
            smem_db[c] = pb;
          }
        }
      }
      __syncthreads();
      // Element by element, every thread busy, the RPB groups unrolled.  (A run with a loop of vectors over the
      // groups here and four independent sums in layer_norm_reduce_partials lost 2.5 to 20 us on every
      // backward with rows under 128 threads, e.g. (4096, 128) bf16 9.4 us against 6.9: both reverted.)
      for (I i = threadIdx.x; i < n; i += S::THREADS) {
        A sw = A(0), sb = A(0);
#pragma unroll
        for (int r = 0; r < S::RPB; ++r) {  // fixed order
          sw += smem[(I)r * n + i];
          sb += smem[(I)(S::RPB + r) * n + i];
        }
        if (partial != nullptr) {
          partial[(i64)blockIdx.x * n + i] = sw;
          partial[((i64)gridDim.x + blockIdx.x) * n + i] = sb;
        } else {
          if (dw_out != nullptr) dw_out[i] = store_as<T>(sw);
          if (db_out != nullptr) db_out[i] = store_as<T>(sb);
        }
      }
    }
  }
}

// dweight/dbias partial sums for rows too long for layer_norm_backward to keep (PARAMS == 0): blocks of
// COLUMN_THREADS threads, each thread VEC columns, blockIdx.y a chunk of `rows_per_chunk` rows.  Writes
// partial[0][blockIdx.y][:] and partial[1][blockIdx.y][:].
constexpr int COLUMN_THREADS = 128;

template <typename T, int VEC, typename I>
__global__ void __launch_bounds__(COLUMN_THREADS)
    layer_norm_backward_columns(const T* __restrict__ dy, const T* __restrict__ x,
                                const acc_t<T>* __restrict__ stats, acc_t<T>* __restrict__ partial, i64 rows_,
                                i64 n_, i64 rows_per_chunk) {
  using A = acc_t<T>;
  using V = Vec<T, VEC>;
  using VA = Vec<A, VEC>;
  const I rows = static_cast<I>(rows_), n = static_cast<I>(n_), chunks = n / VEC;
  const I c = (I)blockIdx.x * COLUMN_THREADS + threadIdx.x;
  if (c >= chunks) return;
  const I first = (I)blockIdx.y * static_cast<I>(rows_per_chunk);
  const I last = min(rows, first + static_cast<I>(rows_per_chunk));
  VA pw, pb;
#pragma unroll
  for (int k = 0; k < VEC; ++k) pw.v[k] = pb.v[k] = A(0);
  const V* xv = reinterpret_cast<const V*>(x);
  const V* gv = reinterpret_cast<const V*>(dy);
#pragma unroll 4
  for (I row = first; row < last; ++row) {
    const V vx = xv[row * chunks + c], vg = gv[row * chunks + c];
    const A mean = stats[row], rstd = stats[rows + row];
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const A d = ln::element<A>(vg, k);
      pw.v[k] += d * ((ln::element<A>(vx, k) - mean) * rstd);
      pb.v[k] += d;
    }
  }
  reinterpret_cast<VA*>(partial + (i64)blockIdx.y * n)[c] = pw;
  reinterpret_cast<VA*>(partial + ((i64)gridDim.y + blockIdx.y) * n)[c] = pb;
}

// The column kernels below: 32 columns a block, REDUCE_ROWS threads down each column.
constexpr int REDUCE_ROWS = 16;

namespace ln {
// The end of both column kernels: each thread's sums of its column (its rows ty, ty + REDUCE_ROWS, ...) through
// shared memory, added in the order of ty by the first row of threads, converted and written.  A null output is
// skipped.
template <typename T, typename A>
__device__ __forceinline__ void finish_columns(A (&sums)[2][REDUCE_ROWS][33], A sw, A sb, int tx, int ty, i64 col,
                                               i64 n, T* __restrict__ dw, T* __restrict__ db) {
  sums[0][ty][tx] = sw;
  sums[1][ty][tx] = sb;
  __syncthreads();
  if (ty == 0 && col < n) {
    A tw = A(0), tb = A(0);
#pragma unroll
    for (int r = 0; r < REDUCE_ROWS; ++r) {
      tw += sums[0][r][tx];
      tb += sums[1][r][tx];
    }
    if (dw) dw[col] = store_as<T>(tw);
    if (db) db[col] = store_as<T>(tb);
  }
}
}  // namespace ln

// dweight[i] = sum_p partial[0][p][i], dbias[i] = sum_p partial[1][p][i], p = 0..parts-1 in a fixed order:
// 32 columns a block, REDUCE_ROWS threads down each column, then their sums in order.  A null output is skipped.
template <typename T>
__global__ void __launch_bounds__(32 * REDUCE_ROWS)
    layer_norm_reduce_partials(const acc_t<T>* __restrict__ partial, T* __restrict__ dw, T* __restrict__ db,
                               i64 parts, i64 n) {
  using A = acc_t<T>;
  __shared__ A sums[2][REDUCE_ROWS][33];
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
  const i64 col = (i64)blockIdx.x * 32 + tx;
  A sw = A(0), sb = A(0);
  if (col < n) {
    for (i64 p = ty; p < parts; p += REDUCE_ROWS) {
      if (dw) sw += partial[p * n + col];
      if (db) sb += partial[(parts + p) * n + col];
    }
  }
  ln::finish_columns(sums, sw, sb, tx, ty, col, n, dw, db);
}

// dweight/dbias straight from dy, x and the statistics, for a few rows (PARAMS 3 on the Python side: the row
// kernel then computes dx only): 32 columns a block, REDUCE_ROWS threads down each column (rows ty, ty +
// REDUCE_ROWS, ...), then their sums in order, so the result is deterministic.  One kernel reading 2 x rows x n
// elements, where the row kernel's per-block sums plus layer_norm_reduce_partials wrote and re-read 2 x rows x n
// floats (at (64, 1024) 16-bit: 512 KB against 256 KB).  A null output is skipped.
template <typename T>
__global__ void __launch_bounds__(32 * REDUCE_ROWS)
    layer_norm_param_grads(const T* __restrict__ dy, const T* __restrict__ x, const acc_t<T>* __restrict__ stats,
                           T* __restrict__ dw, T* __restrict__ db, i64 rows, i64 n) {
  using A = acc_t<T>;
  __shared__ A sums[2][REDUCE_ROWS][33];
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
  const i64 col = (i64)blockIdx.x * 32 + tx;
  A sw = A(0), sb = A(0);
  if (col < n) {
#pragma unroll 4
    for (i64 r = ty; r < rows; r += REDUCE_ROWS) {
      const A d = load_as<A>(dy[r * n + col]);
      sw += d * ((load_as<A>(x[r * n + col]) - stats[r]) * stats[rows + r]);
      sb += d;
    }
  }
  ln::finish_columns(sums, sw, sb, tx, ty, col, n, dw, db);
}

}  // namespace jitops
