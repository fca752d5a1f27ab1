// jitops.conv2d, layers with few input channels (the 7x7 stem, C=3): the im2col matrix [N*P*Q][columns], each
// row one output pixel's receptive field in (r, s, c) order, zero-padded to `columns` (a multiple of 8), which
// fprop and wgrad then run as a 1x1 conv: 3 k-steps a row instead of 49 taps of 8 padded channels; and its
// inverse for dgrad, col2im (at the end).
//
// x is read through its own strides (NCHW, channels_last or any other), so no layout conversion precedes this.
// It replaces torch's zero-fill, padded copy and 6-D strided copy (innermost extent C=3), which took most of the
// stem's 313 us fprop and wgrad on the H100 (docs/benchmarks.md, conv2d): the matrix is 122 MB at batch 32,
// about 45 us to write.
#include "jitops/common.cuh"

namespace jitops {

// A block builds `1 << log_rows` consecutive rows in shared memory, then writes them, one contiguous span of the
// matrix, with 16-byte stores.  Building them, neighbouring threads take neighbouring rows of one column, so a
// warp's loads read neighbouring pixels of x, and each thread keeps its row's window in registers and walks
// columns, whose offsets come from a table in shared memory (a broadcast: a warp reads one column's entry).
// Earlier versions, timed on the stem's 122 MB matrix on the H100 (a copy of the matrix reads and writes it in
// 83 us): a thread per 8 columns of a row, 147 us (its loads spread over seven image rows); a thread per 16
// columns with neighbouring threads on neighbouring rows, 384 us (its stores 304 bytes apart); staged like this one but every element placed from scratch, 137 us and
// issue-bound (Nsight Compute: SM 76%, memory 72%).  This one: 81.5 us; with its rows padded to an odd number
// of words (no bank conflicts staging, but 4-byte stores to write them), 85.9 us.
// Shared memory (the caller sizes it): the rows [block rows][columns], then per column x's offset for the tap
// and channel (8 bytes) and the tap's row and column offsets (r * dilation, s * dilation).
template <typename T>
__global__ void conv2d_im2col(const T* __restrict__ x, T* __restrict__ out, i64 rows, int columns, int log_rows,
                              int p, int q, int h, int w, int c, i64 sn, i64 sc, i64 sh, i64 sw, int s,
                              int stride_h, int stride_w, int pad_h, int pad_w, int dil_h, int dil_w, int taps_c) {
  extern __shared__ __align__(16) unsigned char shared[];
  const int block_rows = 1 << log_rows;
  T* tile = reinterpret_cast<T*>(shared);
  i64* column_offset = reinterpret_cast<i64*>(tile + block_rows * columns);  // 16-byte aligned: columns % 8 == 0
  int* column_dh = reinterpret_cast<int*>(column_offset + columns);
  int* column_dw = column_dh + columns;

  const i64 first_row = static_cast<i64>(blockIdx.x) << log_rows;
  const int rows_here = static_cast<int>(min(static_cast<i64>(block_rows), rows - first_row));
  for (int col = threadIdx.x; col < taps_c; col += blockDim.x) {
    const int tap = col / c;
    const int dh = (tap / s) * dil_h;
    const int dw = (tap % s) * dil_w;
    column_dh[col] = dh;
    column_dw[col] = dw;
    column_offset[col] = (col - tap * c) * sc + dh * sh + dw * sw;
  }
  __syncthreads();

  // This thread's row (neighbouring threads: neighbouring rows) and its window.
  const int i = threadIdx.x & (block_rows - 1);
  const int lanes = blockDim.x >> log_rows;  // threads per row (blockDim.x is a multiple of block_rows)
  if (i < rows_here) {
    const i64 row = first_row + i;
    const i64 image = row / (static_cast<i64>(p) * q);
    const int pq = static_cast<int>(row - image * p * q);
    const int top = (pq / q) * stride_h - pad_h;
    const int left = (pq % q) * stride_w - pad_w;
    const T* window = x + image * sn + top * sh + left * sw;
    T* row_tile = tile + i * columns;
    for (int col = threadIdx.x >> log_rows; col < columns; col += lanes) {
      T value = store_as<T>(0.0f);
      if (col < taps_c) {
        const int hi = top + column_dh[col];
        const int wi = left + column_dw[col];
        if (static_cast<unsigned>(hi) < static_cast<unsigned>(h) &&
            static_cast<unsigned>(wi) < static_cast<unsigned>(w)) {
          value = window[column_offset[col]];
        }
      }
      row_tile[col] = value;
    }
  }
  __syncthreads();

  T* destination = out + first_row * columns;  // rows_here whole rows: one contiguous span
  const int vectors = rows_here * columns / 8;
  for (int v = threadIdx.x; v < vectors; v += blockDim.x) {
    store_vec<T, 8>(destination, v, reinterpret_cast<const Vec<T, 8>*>(tile)[v]);
  }
}

// dgrad of the same layers, last step: dx = col2im(columns), where columns [N*P*Q][columns] = dy . W (a 1x1
// conv, jitops' fprop kernel) holds each output pixel's gradient for its receptive field in (r, s, c) order.
// One thread per element of dx (NHWC, channels fastest) gathers the entries that land on it: for each filter
// row r whose tap reaches its image row (h + pad - r*dil divisible by the stride, inside dy), each such filter
// column s.  No atomics: the sum is in a fixed order (r, then s), accumulated in fp32.
// The columns are fp32 (the 1x1 conv's split-K output): summing taps rounded to bf16 lost up to 0.046 at 0.39
// on torch's OpInfo samples (a 3x3 dgrad, stride 2), where one rounding at the end stays within torch's tolerance.
template <typename T, typename TC>
__global__ void conv2d_col2im(const TC* __restrict__ columns_in, T* __restrict__ dx, i64 elements, int h, int w,
                              int c, int p, int q, int r, int s, int columns, int stride_h, int stride_w, int pad_h,
                              int pad_w, int dil_h, int dil_w) {
  const i64 e = global_thread();
  if (e >= elements) return;
  const int ch = static_cast<int>(e % c);
  const i64 pixel = e / c;
  const int wi = static_cast<int>(pixel % w);
  const i64 image_row = pixel / w;
  const int hi = static_cast<int>(image_row % h);
  const i64 image = image_row / h;
  float sum = 0.0f;
  for (int rr = 0; rr < r; ++rr) {
    const int ph = hi + pad_h - rr * dil_h;
    if (ph < 0 || ph % stride_h) continue;
    const int pi = ph / stride_h;
    if (pi >= p) continue;
    const TC* row = columns_in + ((image * p + pi) * q) * columns + (rr * s) * c + ch;
    for (int ss = 0; ss < s; ++ss) {
      const int pw = wi + pad_w - ss * dil_w;
      if (pw < 0 || pw % stride_w) continue;
      const int qi = pw / stride_w;
      if (qi < q) sum += load_as<float>(row[static_cast<i64>(qi) * columns + ss * c]);
    }
  }
  dx[e] = store_as<T>(sum);
}

}  // namespace jitops
