// jitops.gemm on sm_90a without CUTLASS: a warp-specialized TMA + wgmma GEMM written against PTX directly, so
// the compiler front end has almost nothing to instantiate (the default; JITOPS_GEMM_SM90_KERNEL=cutlass takes
// CUTLASS's kernel, sm90_gemm_kernel.cu).  conv2d's and grouped_gemm's sm_90a kernels are this one too.
//
//   D (M, N, row-major, ldd) = act(A (M, K) . B (K, N) + bias (N)), fp32 accumulation.  Each operand is
//   K-major (A row-major; B column-major, i.e. F.linear's weight (N, K) as w.t()) or MN-major (A column-major,
//   B row-major): a transposed view is a layout, not a copy.
//
// One CTA per SM, persistent over output tiles of 128 (or 64) x LIGHT_TILE_N (K step 64):
//   - the last warpgroup (2; 1 for 64-row tiles), one thread: the producer.  TMA loads A's and B's tiles (128-byte
//     swizzle) into a ring of kStages shared-memory stages; a "full" mbarrier per stage counts the bytes in, an
//     "empty" one the consumers' release;
//   - warpgroups 0 and 1 (0 alone for 64-row tiles): the consumers, 64 rows of the tile each (LIGHT_PINGPONG 0,
//     "cooperative"), or whole 128 x 128 tiles in turn (LIGHT_PINGPONG 1: one warpgroup's epilogue runs beside the
//     other's mainloop, which pays where K is short).  wgmma m64nNk16 from shared memory into fp32 registers, one
//     k-block's wgmmas kept in flight; then the epilogue (bias, activation, rounding) writes the accumulators into
//     shared memory, 64 x 128 bytes at a time in two buffers a warpgroup, each stored by a TMA store that runs on
//     while the warpgroup goes on to the next chunk and the next tile's mainloop (the producer is already loading
//     it).
// Tiles are visited in groups of `group_m` tile rows (the L2 reuse of a swizzled raster).  The host side is
// Python's (jitops/light_gemm.py): the three TMA descriptors come from the driver's cuTensorMapEncodeTiled.
//
// Configuration (-D macros):
//   LIGHT_T       0: bf16, 1: fp16 (A, B and bias)
//   LIGHT_OUT     0: D has the inputs' type, 1: fp32
//   LIGHT_TILE_N  64, 128, 192 or 256
//   LIGHT_PINGPONG  0: both consumers on each tile;  1: the consumers take tiles in turn (LIGHT_TILE_N 128)
//   LIGHT_FUSED   0: D = A.B;  1: D = act(A.B + bias), the bias optional (null) and act a run-time argument
//   LIGHT_A_KMAJOR, LIGHT_B_KMAJOR   1: K-major, 0: MN-major
//   LIGHT_CONV    0: the GEMM above;  1: conv2d's fprop, 2: its unit-stride dgrad, 3: its wgrad, as implicit GEMMs
//   LIGHT_D_ROWS  1: (dgrad) a strided dgrad's phases in one launch, D stored by rows at dx's strides
//   LIGHT_GROUPED 0: one GEMM;  1, 2, 3: jitops.grouped_gemm's ragged M, ragged K and list forms (below)
//   LIGHT_CLUSTER 1: one CTA;  2: clusters of two CTAs along N sharing A (below)
//   LIGHT_TILE_M  128: two consumer warpgroups of 64 rows;  64: one (a wgrad's of 64 filters, a decode GEMM; below);
//                 192: three (a plain GEMM whose tiles then fill the SMs' waves; below)
//
// Clusters (LIGHT_CLUSTER 2; the cooperative GEMM, conv fprop, unit-stride dgrad and wgrad).  The two CTAs of a cluster
// take tiles (m, 2j) and (m, 2j + 1) of one tile row, so they read the same A tile: each loads its 64 rows of it
// and multicasts them into both CTAs' stages (TMA's .multicast::cluster), halving A's traffic from L2, as
// CUTLASS's 1 x 2 cluster plans do.  A stage is then written by both producers, so it is free only once the
// consumers of both CTAs have released it: each consumer warp arrives on the empty barrier of both CTAs, and each
// producer, done, waits for its last releases (the other CTA's consumers arrive on its barriers until then).
// Where N has an odd number of tiles, the last pair's second tile lies past N: it loads zeros for B and stores
// nothing, but still loads and multicasts its half of A.
//
// Split tail (the plain cooperative GEMM: LIGHT_SPLITS below).  Where the last wave of tiles would leave most SMs
// idle, the host (jitops/light_gemm.py's split_tail) makes the tiles from `split_from` on `splits` work units each,
// of consecutive k-blocks; every such unit stores its fp32 accumulators to `workspace` (a slice a warpgroup,
// thread-major, so the stores coalesce) and counts itself in a per-(tile, warpgroup) counter; the last to arrive
// sums the tile's slices in split order (the same bits whichever arrives last), then runs the epilogue.  No unit
// waits for another, so nothing depends on which CTAs are resident.  The counters (`counters`, apart from the slices)
// must be zero at launch, and the last arrival resets its tile's: the host keeps them from call to call, zeroed once
// (a launch that cleared them each call spent a memset launch and ~47 us of Python host on it).
//
// Convolutions (LIGHT_CONV 1, 2; jitops/light_conv.py).  A is an im2col view of an NHWC tensor (x for fprop, dy
// for dgrad), loaded by TMA's im2col mode: a tile's 128 rows are 128 consecutive output pixels (n, p, q), each
// read at one filter tap, 64 channels a k-block; GEMM-K runs over (tap, channel block).  B is the KRSC filter
// through a rank-3 descriptor (a tap a box, so a channel count that is not a multiple of 64 reads zeros past C):
// fprop's B is K-major (dims C, R*S, K), dgrad's MN-major (dims C, K, R*S) with the taps flipped, since
// dx = conv(dy, w rotated 180 degrees and transposed) at unit stride.  D is the NHWC output as the row-major
// (N*P*Q, channels) matrix; fprop adds the bias (LIGHT_FUSED) and no activation.
//   A strided dgrad (LIGHT_D_ROWS 1) is stride_h * stride_w unit-stride dgrads, its phases: phase (a, b) writes dx's
// pixels (a + stride_h i, b + stride_w j) from the filter taps that reach them, a sub-filter of taps evenly spaced
// in the filter (none: the phase's pixels are zeros, its first idle_m by the producer warpgroup's idle warps during
// the GEMM tiles, the rest as tiles after them).  One launch runs up to kMaxPhases of them: the CTAs walk the
// units of one phase after another (as the grouped forms walk groups), each phase with its own im2col descriptor of
// dy (its bounding box) and its taps read from the whole filter's descriptor.  D is stored by rows at each pixel's
// address (dx's address in the bias field, a dgrad has none; the phase's strides d_sn, d_sh, d_sw): a TMA box
// cannot follow 128 consecutive pixels across the rows of a strided view.  As four launches, one a phase, ResNet-50's
// stride-2 3x3 dgrads ran x0.44-0.58 of cuDNN (H100), each launch a quarter of the tiles with 1-4 taps of K.
//   wgrad (LIGHT_CONV 3): M is the filters (A = dy as the MN-major (K, N*P*Q) matrix), N is (tap, channel) with
// each tap's channels padded to whole 64-channel blocks, GEMM-K the output pixels, split into `splits` equal runs
// of k-blocks (the final one reads zeros past N*P*Q).  B is x in im2col mode, 64 pixels by 64 channels of one tap a
// box (MN-major: the pixels are GEMM-K).  D is [split][K][taps][C] through a rank-4 store that drops the padding:
// LIGHT_OUT 1, each split's fp32 sums in its slice, which a reduction kernel sums into dw; LIGHT_OUT 0, one split
// written straight into dw's KRSC memory.
// Grouped GEMMs (LIGHT_GROUPED; jitops/light_grouped.py).  A work unit is one output tile of one group; the
// CTAs walk the units in order, each finding its group by walking on from the last one (units only increase), so
// the group sizes can live on the device: a ragged call reads no offsets on the host.
//   1, ragged M (a mixture of experts' y = x . w[g]): A (T, K) K-major through one 2-D descriptor, rows
//      offsets[g-1]:offsets[g] for group g; B (G, K, N) through a 3-D descriptor (group outermost); D (T, N) stored
//      by rows, only those of the tile's group (a TMA box would write the next group's rows).
//   2, ragged K (the weight gradient dw[g] = x[rows of g]^T . dy[rows of g]): A (M, T) and B (T, N), both MN-major,
//      k-blocks from the group's first row; the last k-block's rows past the group's end are zeroed in shared
//      memory before the wgmmas read them.  D (G, M, N) through a 3-D store.
//   3, list (D_g = A_g . B_g, any sizes): a table in global memory of per-group descriptors and sizes, made on the
//      host.
// Cooperative consumers only (the pingpong turns assume every tile has the same k-blocks).  Offsets outside
// [previous end, T] are clamped: a bad offsets tensor gives wrong numbers, never an access out of bounds.
// Needs (the host checks): N (and K, or M for an MN-major A) multiples of 8, 16-byte aligned A, B and D with
// leading dimensions that are multiples of 8 elements (D's: of 16 bytes); M, N, K below 2**31.
#if LIGHT_T == 0
#define LIGHT_AB "bf16"
#else
#define LIGHT_AB "f16"
#endif

#include "sm90_light_gemm.cuh"

#ifndef LIGHT_CONV
#define LIGHT_CONV 0
#endif
#ifndef LIGHT_D_ROWS
#define LIGHT_D_ROWS 0
#endif
#ifndef LIGHT_GROUPED
#define LIGHT_GROUPED 0
#endif
#ifndef LIGHT_CLUSTER
#define LIGHT_CLUSTER 1
#endif
#ifndef LIGHT_TILE_M
#define LIGHT_TILE_M 128
#endif
#if LIGHT_CLUSTER == 2
#define LIGHT_CLUSTER_DIMS __cluster_dims__(2, 1, 1)
#else
#define LIGHT_CLUSTER_DIMS
#endif
#if LIGHT_CONV == 0 && LIGHT_GROUPED == 0 && LIGHT_PINGPONG == 0 && LIGHT_CLUSTER == 1
#define LIGHT_SPLITS 1
#else
#define LIGHT_SPLITS 0
#endif

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "sm90_light_gemm.cu needs sm_90a (wgmma, setmaxnreg)"
#endif

namespace jitops_light {

// 64-row tiles (LIGHT_TILE_M 64: a wgrad or a plain GEMM): a wgrad's M is the filter count, and on ResNet-50's
// 64-filter layers a 128-row tile was half zeros: L2's wgrad took 44.3 us against CUTLASS's 64-row plan's 30.4
// (H200, fp16).  A decode GEMM's 1-64 rows are the same case.
// 192-row and 192-column tiles (plain GEMMs): a tile count that fills whole waves of the SMs, as cuBLAS's 192 x 192
// and 128 x 192 tiles do.  ViT-B/16's 6304 x 768 GEMMs are 132 tiles of 192 x 192 (one wave) against 300 of
// 128 x 128 (2.3 waves), where cuBLAS took 13.3 us to this kernel's 17.9 (H200, 6304x768x768).  Three consumer
// warpgroups of 64 rows then share the registers: 152 each beside the producer's 40.
constexpr int kTileM = LIGHT_TILE_M;
constexpr int kTileN = LIGHT_TILE_N;
constexpr int kTileK = 64;  // one 128-byte swizzle row of 16-bit elements
constexpr bool kAKMajor = LIGHT_A_KMAJOR;
constexpr bool kBKMajor = LIGHT_B_KMAJOR;
constexpr bool kPingpong = LIGHT_PINGPONG;
constexpr int kConsumers = kPingpong ? 2 : kTileM / 64;  // cooperative: a warpgroup per 64 rows
constexpr int kConv = LIGHT_CONV;
constexpr bool kActivation = kConv == 0;  // a conv's fused epilogue adds its bias only
constexpr int kGrouped = LIGHT_GROUPED;
constexpr bool kRowStores = LIGHT_D_ROWS || kGrouped == 1;  // D stored by rows, not by TMA
constexpr int kCluster = LIGHT_CLUSTER;  // CTAs along N sharing an A tile
constexpr int kMaxPhases = 4;  // a strided dgrad's phases a launch (stride 2 x 2); more take several launches
constexpr int kWarpgroupRows = kPingpong ? kTileM : kTileM / kConsumers;  // a consumer's rows of its tiles
constexpr int kMmaBlocks = kWarpgroupRows / 64;                           // m64 wgmmas a k16 step
constexpr int kAccumulators = kMmaBlocks * kTileN / 2;                    // fp32 registers a thread
constexpr int kStageReaders = kPingpong ? 1 : kConsumers;                 // consumers that read each stage
constexpr int kThreads = 128 * (kConsumers + 1);
constexpr u32 kBytesA = kTileM * kTileK * 2;
constexpr u32 kBytesB = kTileN * kTileK * 2;
constexpr u32 kStageBytes = kBytesA + kBytesB;
// The epilogue's staging: a warpgroup's 64 rows by one 128-byte swizzle row of D (64 16-bit or 32 fp32 columns),
// two such buffers a warpgroup so that one fills while the other's TMA store reads it.
constexpr int kOutBytes = LIGHT_OUT == 1 ? 4 : 2;
constexpr int kStoreCols = 128 / kOutBytes;
constexpr int kStoreChunks = kTileN / kStoreCols;
constexpr u32 kStoreBytes = 64 * 128;
// H100's 227 KB of shared memory per block, less the epilogue's buffers, 1 KB of alignment slack and the barriers.
// Three consumers' second buffers (24 KB) would cost a 192 x 192 tile its fourth stage: they keep one each.
constexpr u32 kMaxSmem = 232448;
constexpr int kStoreBuffers = (kMaxSmem - 2048 - kConsumers * 2 * kStoreBytes) / kStageBytes < 4 &&
                                      (kMaxSmem - 2048 - kConsumers * kStoreBytes) / kStageBytes >= 4 ? 1 : 2;
constexpr u32 kEpilogueBytes = kConsumers * kStoreBuffers * kStoreBytes;
constexpr int kStagesFit = (kMaxSmem - 2048 - kEpilogueBytes) / kStageBytes;
constexpr int kStages = kStagesFit < 8 ? kStagesFit : 8;
// Barriers: full and empty a stage, and the pingpong consumers' two turn barriers; then a word a consumer warpgroup
// (split tail: whether this warpgroup summed a tile's slices last), padded to 16 bytes.
constexpr u32 kSmemBytes = 1024 + kStages * kStageBytes + kEpilogueBytes + 2 * kStages * 8 + 32;
// Registers: 65536 over 384 threads; the producer gives back all it can (40), the consumers take 232 each
// (128 * 40 + 256 * 232 = 64512), room for a 64 x 256 fp32 accumulator (128 a thread).
// Three consumers (512 threads): 128 * 40 + 384 * 152 = 63488, room for 64 x 192 (96 a thread).
constexpr u32 kProducerRegisters = 40;
constexpr u32 kConsumerRegisters = kConsumers == 3 ? 152 : 232;
static_assert(kTileN == 64 || kTileN == 128 || kTileN == 192 || kTileN == 256, "LIGHT_TILE_N: 64, 128, 192 or 256");
static_assert(kTileM == 128 || (kTileM == 64 && (kConv == 0 || kConv == 3) && !kGrouped && kCluster == 1 &&
                                 !kPingpong) ||
              (kTileM == 192 && kConv == 0 && !kGrouped && kCluster == 1 && !kPingpong && kTileN <= 192),
              "LIGHT_TILE_M: 128; 64 for a cooperative GEMM or wgrad in single CTAs; 192 for a cooperative GEMM in "
              "single CTAs, at most 192 wide");
static_assert(kTileN != 192 || (kConv == 0 && !kGrouped && !kPingpong),
              "LIGHT_TILE_N 192: a plain cooperative GEMM");
static_assert(kConv == 0 || (kConv == 3 ? !kAKMajor && !kBKMajor : kAKMajor && kBKMajor == (kConv == 1)),
              "conv: fprop K-major A and B, dgrad K-major A, wgrad MN-major A and B");
static_assert(!LIGHT_D_ROWS || (kConv == 2 && LIGHT_OUT == 0), "LIGHT_D_ROWS: a strided dgrad's 16-bit dx");
static_assert(!kGrouped || (kConv == 0 && !kPingpong && !LIGHT_FUSED && LIGHT_OUT == 0),
              "grouped: a plain cooperative GEMM with a 16-bit D");
static_assert(kGrouped != 1 || kAKMajor, "ragged M: A's rows are the ragged dimension, so K-major");
static_assert(kGrouped != 2 || (!kAKMajor && !kBKMajor), "ragged K: K is the strided dimension of A and B");
static_assert(kCluster == 1 || (kCluster == 2 && !kPingpong && !kGrouped && !LIGHT_D_ROWS),
              "LIGHT_CLUSTER 2: the cooperative GEMM and conv kernels, not a strided dgrad's");
static_assert(kAccumulators <= 128, "a consumer holds at most 64 x 256 or 128 x 128 fp32 accumulators");
static_assert(kStages >= 2, "shared memory holds fewer than two stages");
static_assert(kBytesA % 1024 == 0 && kBytesB % 1024 == 0, "stages must keep the 1024-byte swizzle alignment");

#if LIGHT_D_ROWS
// One phase of a strided dgrad: a unit-stride dgrad over its pixels (jitops/light_conv.py packs it).
struct alignas(64) Phase {
    TmaDescriptor a;         // dy in im2col mode, this phase's bounding box
    int m;                   // the phase's pixels, N * rows * columns: its GEMM's M
    int out_w, out_hw;       // its pixel grid: columns, rows * columns
    int corner_w, corner_h;  // the bounding box's lower corner
    int taps;                // its taps, rows * columns of them (0: no tap reaches these pixels: zeros)
    int filter_s;            // columns of them
    int dil_w, dil_h;        // between its taps, in dy's pixels
    int tap_last;            // the filter's tap (r * S + s) of its last tap, read first (the taps are flipped)
    int tap_step_h, tap_step_w;  // filter taps between its taps along a column and along a row
    int d_offset;            // elements from dx's address to its first pixel
    int idle_m;              // no taps: its first pixels, zeroed by the producer warpgroup's idle warps (the rest are
                             // the consumers' tiles, after the GEMM tiles); 0 otherwise
};
static_assert(sizeof(Phase) == 192, "Phase layout");
#endif

// The kernel's one parameter.  jitops/light_gemm.py packs it at fixed offsets: the descriptors of A, B and D at 0,
// 128 and 256, then bias 384, the ints from 392; every field is naturally aligned, so the sizes below fix the
// layout.
// (No offsetof: NVRTC 13.0 rejects __builtin_offsetof, and libcu++'s <cuda/std/cstddef> is the only include this
// kernel would need.)
struct alignas(64) Params {
    TmaDescriptor a;  // A: dims (K, M), box (64, 128); MN-major: dims (M, K), box (64, 64)
    TmaDescriptor b;  // B: dims (K, N), box (64, kTileN); MN-major: dims (N, K), box (64, 64)
    TmaDescriptor d;  // D: dims (N, M), box (kStoreCols, 64), stored
    const void* bias;  // null: no bias; LIGHT_D_ROWS: D's address
    int m, n, k;
    int activation;  // 0 none, 1 relu, 2 gelu (erf), 3 gelu (tanh)
    int group_m;     // tile rows per raster group, >= 1
#if LIGHT_CONV
    // A is then an im2col descriptor and B a rank-3 one; k = taps * c_blocks * 64.
    int c_blocks;            // 64-channel k-blocks a filter tap: ceil(channels of A / 64)
    int taps;                // R * S
    int filter_s;            // S
    int out_w, out_hw;       // the pixel grid of D's rows: Q and P * Q (dgrad: W and H * W)
    int corner_w, corner_h;  // the im2col bounding box's lower corner: -padding (dgrad: padding - dilation * (R - 1))
    int stride_w, stride_h;  // its traversal strides (dgrad: 1)
    int dil_w, dil_h;        // a tap's offset per filter column and row
    int splits;              // wgrad: slices of GEMM-K, k = split_blocks * 64 each (fprop, dgrad: 1)
    int split_blocks;
    int d_sn, d_sh, d_sw;    // LIGHT_D_ROWS: a phase's pixel strides in dx, elements (image, row, column)
#if LIGHT_D_ROWS
    int phases;              // of `phase`; a, out_w .. dil_h and m above are unused
    Phase phase[kMaxPhases];
#endif
#elif LIGHT_GROUPED
    // m, n, k are then: ragged M: T, N, K; ragged K: M, N, T; list: unused.
    const void* groups_data;  // ragged: the groups' int32 cumulative ends (device); list: the GroupEntry table
    void* d_rows;             // ragged M: D's address (stored by rows)
    int groups;
    int ldd;                  // ragged M: D's leading dimension, elements
#else
    // Split tail (LIGHT_SPLITS builds read them; the host writes split_from = tiles, splits = 1 for none).
    int split_from;   // units below it are whole tiles; each tile from it on is `splits` units
    int splits;
    void* workspace;  // fp32 slices [tail tile][split][warpgroup][accumulator][thread]
    int* counters;    // [tail tile][warpgroup]: zero at launch, and zero again when it ends
#endif
};
static_assert(sizeof(TmaDescriptor) == 128 && alignof(TmaDescriptor) == 64 && sizeof(void*) == 8 &&
              sizeof(Params) == (kConv ? 512 : 448) + (LIGHT_D_ROWS ? kMaxPhases * 192 : 0) &&
              alignof(Params) == 64, "Params layout");

// Read from the cubin by the host (and the tests) without a GPU: what the launch needs.
extern "C" __constant__ const u64 jitops_light_gemm_info[] = {
    kSmemBytes, kThreads, kTileM, kTileN, kTileK, kStages, sizeof(Params), sizeof(TmaDescriptor),
    2 * sizeof(TmaDescriptor), kStoreCols, kAKMajor, kBKMajor, kPingpong, kConv, LIGHT_D_ROWS, kGrouped, kCluster};

__device__ __forceinline__ void tile_coordinates(int tile, int tiles_m, int tiles_n, int group_m, int& m_block,
                                                 int& n_block) {
    const int per_group = group_m * tiles_n;
    const int group = tile / per_group;
    const int first_m = group * group_m;
    const int rows = tiles_m - first_m < group_m ? tiles_m - first_m : group_m;
    const int in_group = tile - group * per_group;
    m_block = first_m + in_group % rows;
    n_block = in_group / rows;
}

// The epilogue is unrolled over a thread's 64-128 accumulators, so the activation's code is repeated that often:
// with CUDA's erff and tanhf (branches, slow paths) it made ptxas take 3.2 s of a 5.5 s compile of the 128 x 256
// kernel.  Instead, branch-free formulas with one fast exp and one fast reciprocal each (ex2 and rcp .approx.ftz:
// a flushed denormal changes no output), the form a template argument so that neither computes the other's terms:
//   gelu (erf): 0.5 v (1 + erf(v / sqrt 2)), erf by Abramowitz & Stegun 7.1.26 (absolute error 1.5e-7): with
//               x = |v| / sqrt 2, t = 1 / (1 + 0.3275911 x), erf(x) = 1 - poly(t) e^(-x^2).  With q = poly e / 2
//               (the coefficients halved), that is v (1 - q) for v >= 0 and v q below;
//   gelu_tanh:  0.5 v (1 + tanh u), u = sqrt(2 / pi) (v + 0.044715 v^3), and 1 + tanh u = 2 - 2 / (1 + e^(2u)),
//               so v (1 - t) with t = 1 / (1 + e^(2u)).
// Computing both forms and selecting one per value took 33 instructions a value (SASS, 128 x 128 pingpong kernel)
// against 14 (erf) and 8 (tanh) now, and its epilogue outlasted the other consumer's mainloop where K is short:
// 8192x8192x1024 with bias + gelu 268.8 against 221.4 us now, CUTLASS's 245.7 (H200, bf16, kernel time).
__device__ __forceinline__ float ex2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float rcp_approx(float x) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float gelu_erf(float v) {
    const float e = ex2_approx(v * v * -0.72134752044448170f);               // e^(-v^2 / 2)
    const float t = rcp_approx(fmaf(fabsf(v), 0.23164188826636040f, 1.f));  // 0.3275911 / sqrt 2
    const float q = ((((0.5307027145f * t - 0.7265760135f) * t + 0.7107068705f) * t - 0.142248368f) * t +
                     0.127414796f) * t * e;
    return v * (v >= 0.f ? 1.f - q : q);
}

__device__ __forceinline__ float gelu_tanh(float v) {
    // 2u log2(e) = v (2.3022082 + 0.1029432 v^2)
    const float e = ex2_approx(v * fmaf(v * v, 0.10294323958002350f, 2.3022081981443250f));
    return v * (1.f - rcp_approx(1.f + e));  // (fmaf(-v, t, v) gives NaN at v = +inf, where torch gives inf)
}

// The bias of columns (col, col + 1) as one 4-byte load (col is even; the class's alignment keeps the bias
// 16-byte aligned, a bias that is not takes the sm_80 family's kernel).
__device__ __forceinline__ u32 load_bias_pair(const void* bias, int col) {
    return *reinterpret_cast<const u32*>(static_cast<const unsigned short*>(bias) + col);
}

// Element `half` (0: the lower address) of a pair of 16-bit bias values, in fp32.
__device__ __forceinline__ float bias_value(u32 pair, int half) {
    const u32 bits = half ? pair >> 16 : pair & 0xFFFFu;
#if LIGHT_T == 0
    return __uint_as_float(bits << 16);  // bf16 -> fp32 is exact: the high half
#else
    float v;
    asm("cvt.f32.f16 %0, %1;" : "=f"(v) : "h"(static_cast<unsigned short>(bits)));
    return v;
#endif
}

// Two adjacent outputs of a row into a staging buffer laid out as TMA's 128-byte swizzle has it: row r at r * 128
// bytes, its 16-byte unit u at unit u ^ (r % 8).  A warp's stores then hit 8 different units of 8 rows (no bank
// conflict), where a plain row-major buffer would put all 8 rows on the same 4 banks.
__device__ __forceinline__ void stage_pair(u32 buffer, int row, int col, float v0, float v1) {
    const u32 byte = col * kOutBytes;
    const u32 at = buffer + row * 128 + (((byte / 16) ^ (row % 8)) * 16) + byte % 16;
#if LIGHT_OUT == 1
    st_shared_f32x2(at, v0, v1);
#else
    u32 packed;  // cvt's first source goes to the upper half
    asm("cvt.rn." LIGHT_AB "x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(v1), "f"(v0));
    st_shared_u32(at, packed);
#endif
}

// What the epilogue computes on a value: kPlain the accumulator as it is (LIGHT_FUSED 0); in a fused epilogue,
// chosen once a chunk from the run-time activation (uniform in the warpgroup), kBiasOnly adds the bias, kRelu
// clamps, kGeluErf and kGeluTanh run the GELUs above (activation 2 and 3).
// Selected value by value instead, the whole GELU formula ran on every output of a bias-only Linear, the forward
// of every training Linear with a bias (its GELU runs apart, to keep the pre-activation): 4096x4096x1024 with a
// bias took 83.0 us, the same size without one 49.3, torch.addmm 51.3 (H200, bf16).
enum EpilogueKind { kPlain, kBiasOnly, kRelu, kGeluErf, kGeluTanh };

template <EpilogueKind kKind>
__device__ __forceinline__ float finish(float v) {
    if constexpr (kKind == kBiasOnly) return v;
    if constexpr (kKind == kRelu) return fmaxf(v, 0.f);
    if constexpr (kKind == kGeluErf) return gelu_erf(v);
    return gelu_tanh(v);
}

// One 64 x kStoreCols chunk of a consumer's accumulators (`values`: the chunk's first), bias added and finished
// (kPlain: as they are, not even + 0, which the compiler must keep for -0), into its staging buffer.
template <EpilogueKind kKind>
__device__ __forceinline__ void stage_chunk(u32 buffer, int row, int lane, const float* values, const u32* bias_pairs) {
#pragma unroll
    for (int cc = 0; cc < kStoreCols / 8; ++cc) {
        const int col = 8 * cc + 2 * (lane % 4);
        const float* v = values + 4 * cc;
        if constexpr (kKind == kPlain) {
            stage_pair(buffer, row, col, v[0], v[1]);
            stage_pair(buffer, row + 8, col, v[2], v[3]);
        } else {
            const float b0 = bias_value(bias_pairs[cc], 0), b1 = bias_value(bias_pairs[cc], 1);
            stage_pair(buffer, row, col, finish<kKind>(v[0] + b0), finish<kKind>(v[1] + b1));
            stage_pair(buffer, row + 8, col, finish<kKind>(v[2] + b0), finish<kKind>(v[3] + b1));
        }
    }
}

#if LIGHT_D_ROWS
// Where a CTA's walk over the phases' units is: the phase of the last unit, its first unit and unit count.
struct PhaseCursor {
    int phase = -1;
    int first = 0;
    int count = 0;
};

// The tile of unit `unit` (units only increase), the cursor moved on to its phase; false once past the last.
__device__ __forceinline__ bool next_phase_unit(const Params& p, PhaseCursor& c, int unit, int tiles_n, int& m_block,
                                                int& n_block) {
    while (unit >= c.first + c.count) {
        if (c.phase + 1 >= p.phases) return false;
        c.first += c.count;
        ++c.phase;
        c.count = (p.phase[c.phase].m - p.phase[c.phase].idle_m + kTileM - 1) / kTileM * tiles_n;
    }
    const Phase& g = p.phase[c.phase];
    tile_coordinates(unit - c.first, (g.m - g.idle_m + kTileM - 1) / kTileM, tiles_n, p.group_m, m_block, n_block);
    return true;
}

// Where pixel m of phase g starts, in elements from the phase's first pixel (its channels follow).
__device__ __forceinline__ long long pixel_offset(const Params& p, const Phase& g, int m) {
    const int image = m / g.out_hw;
    const int oh = (m - image * g.out_hw) / g.out_w;
    const int ow = m - image * g.out_hw - oh * g.out_w;
    return static_cast<long long>(image) * p.d_sn + static_cast<long long>(oh) * p.d_sh +
           static_cast<long long>(ow) * p.d_sw;
}

// Phase g's first pixel in dx.  A strided dgrad adds no bias, and its phases store by rows at dx's strides, not
// through D's TMA descriptor: its Params carry dx's address in the bias field (conv2d_run._call passes d there).
__device__ __forceinline__ unsigned short* phase_dx(const Params& p, const Phase& g) {
    return static_cast<unsigned short*>(const_cast<void*>(p.bias)) + g.d_offset;
}

// A staged 64 x 64 chunk of a phase's dx out to its pixels: 16 bytes a thread, 8 threads a row (one 128-byte row of
// the swizzled buffer, conflict-free; one coalesced 128-byte write), each row at its pixel's address.
__device__ __forceinline__ void store_rows(const Params& p, const Phase& g, u32 buffer, int row0, int col0,
                                           int thread) {
    unsigned short* d = phase_dx(p, g);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int unit = thread + 128 * i;  // 64 rows x 8 units
        const int row = unit / 8, u = unit % 8;
        const int m = row0 + row, col = col0 + 8 * u;
        if (m < g.m && col < p.n) {
            const uint4 v = ld_shared_v4(buffer + row * 128 + ((u ^ (row % 8)) * 16));
            *reinterpret_cast<uint4*>(d + pixel_offset(p, g, m) + col) = v;
        }
    }
}

// A pixel's zeros, 16 bytes at a time (`units` of them from `first`, every `step`).
__device__ __forceinline__ void zero_pixel(const Params& p, const Phase& g, int m, int first, int units, int step) {
    uint4* pixel = reinterpret_cast<uint4*>(phase_dx(p, g) + pixel_offset(p, g, m));
    for (int u = first; u < units; u += step) pixel[u] = make_uint4(0u, 0u, 0u, 0u);
}

// The producer warpgroup's three idle warps (`warp` 0-2) on the zero phases' first idle_m pixels, while the
// consumers run the GEMM tiles: a warp a pixel, 16 bytes a lane, every CTA a share.  ResNet-50's 1x1 stride-2
// dgrads are three quarters zeros: stored by the consumers after their tiles they ran x0.91-0.96 of CUTLASS's
// kernel (H200, L7 38.2 us against 34.4); all by the idle warps, L13 and L19 ran x1.14 and x1.20, but L7 (38.5 MB
// of zeros) 54.2 us, three warps an SM storing about 0.8 TB/s: hence the split (light_conv.idle_zero_pixels).
__device__ __forceinline__ void store_idle_zeros(const Params& p, int warp, int lane) {
    const int warps = gridDim.x * 3;
    for (int i = 0; i < p.phases; ++i) {
        const Phase& g = p.phase[i];
        for (int m = blockIdx.x * 3 + warp; m < g.idle_m; m += warps) zero_pixel(p, g, m, lane, p.n / 8, 32);
    }
}

// A warpgroup's 64 rows of a tile of a phase that no tap reaches, zeros straight to dx: no accumulators, no
// staging and no barriers, 16 bytes a thread, a row's columns by neighbouring threads (staged like the GEMM tiles,
// ResNet-50's 1x1 stride-2 dgrads, three quarters zeros, took 42.7 us against 37.7 now on the H200's L7 layer).
__device__ __forceinline__ void store_zero_rows(const Params& p, const Phase& g, int row0, int col0, int thread) {
    unsigned short* d = phase_dx(p, g);
    constexpr int kUnits = kTileN / 8;  // 16-byte units of a row
    for (int unit = thread; unit < 64 * kUnits; unit += 128) {
        const int m = row0 + unit / kUnits, col = col0 + 8 * (unit % kUnits);
        if (m < g.m && col < p.n) {
            *reinterpret_cast<uint4*>(d + pixel_offset(p, g, m) + col) = make_uint4(0u, 0u, 0u, 0u);
        }
    }
}
#endif

#if LIGHT_GROUPED
// The list form's table: one entry a group, made on the host (jitops/light_grouped.py packs it at these offsets).
struct alignas(64) GroupEntry {
    TmaDescriptor a;  // as Params' a, b and d, for this group's matrices
    TmaDescriptor b;
    TmaDescriptor d;
    int m, n, k;
};
static_assert(sizeof(GroupEntry) == 448, "GroupEntry layout");

// Where a CTA's walk over the work units is: the group of the last unit, the group's first unit and unit count,
// and its range of the ragged dimension.
struct GroupCursor {
    int group = -1;
    int first = 0;
    int count = 0;
    int begin = 0, end = 0;  // ragged: rows (M) or k (K) of the group; list: unused
    int m = 0, n = 0, k = 0;  // the group's problem
};

// One unit: an output tile of one group.
struct Unit {
    int m_block, n_block;
    int a_row0;    // A's first row (ragged M: within T)
    int k0;        // the first k (ragged K: the group's first row of A's columns and B's rows)
    int k_blocks;
    int k_last;    // rows of the last k-block inside the group (ragged K; 64 elsewhere)
    int d_row0;    // D's first row of the tile, and D's row and column bounds for its stores
    int d_rows, d_cols;
};

// The unit `unit` of the walk, the cursor moved on to its group; false once past the last group.
__device__ __forceinline__ bool next_unit(const Params& p, GroupCursor& c, int unit, Unit& u) {
    while (unit >= c.first + c.count) {
        if (c.group + 1 >= p.groups) return false;
        c.first += c.count;
        ++c.group;
#if LIGHT_GROUPED == 3
        const GroupEntry* e = static_cast<const GroupEntry*>(p.groups_data) + c.group;
        c.m = e->m;
        c.n = e->n;
        c.k = e->k;
#else
        const int limit = kGrouped == 1 ? p.m : p.k;  // T
        const int end = static_cast<const int*>(p.groups_data)[c.group];
        c.begin = c.end;
        c.end = end < c.begin ? c.begin : end > limit ? limit : end;
        c.m = kGrouped == 1 ? c.end - c.begin : p.m;
        c.n = p.n;
        c.k = kGrouped == 1 ? p.k : c.end - c.begin;
#endif
        // A ragged K group with no rows still has its tiles: its dw is zeros.
        c.count = kGrouped == 2 || c.k > 0 ? (c.m + kTileM - 1) / kTileM * ((c.n + kTileN - 1) / kTileN) : 0;
    }
    const int tiles_m = (c.m + kTileM - 1) / kTileM;
    tile_coordinates(unit - c.first, tiles_m, (c.n + kTileN - 1) / kTileN, p.group_m, u.m_block, u.n_block);
    u.k_blocks = (c.k + kTileK - 1) / kTileK;
    u.k_last = c.k - (u.k_blocks - 1) * kTileK;
    u.k0 = kGrouped == 2 ? c.begin : 0;
    u.a_row0 = (kGrouped == 1 ? c.begin : 0) + u.m_block * kTileM;
    u.d_row0 = u.a_row0;
    u.d_rows = kGrouped == 1 ? c.end : c.m;
    u.d_cols = c.n;
    return true;
}

// Rows [valid, 64) of a 64 x 64 MN-major box (64 rows of K, 128 bytes each) to zeros, by one warpgroup: a ragged K
// group's last k-block ends inside the box, and the rows past it belong to the next group.
__device__ __forceinline__ void zero_rows(u32 box, int valid, int thread) {
    for (int unit = valid * 8 + thread; unit < 64 * 8; unit += 128) st_shared_zero_v4(box + unit * 16);
}

// A staged 64 x 64 chunk of a ragged M tile out to D by rows, only rows below `rows_end` (the group's end) and
// columns below N: 16 bytes a thread, 8 threads a row.
__device__ __forceinline__ void store_group_rows(const Params& p, u32 buffer, int row0, int rows_end, int col0,
                                                 int thread) {
    unsigned short* d = static_cast<unsigned short*>(p.d_rows);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int unit = thread + 128 * i;
        const int row = unit / 8, u = unit % 8;
        const int m = row0 + row, col = col0 + 8 * u;
        if (m < rows_end && col < p.n) {
            const uint4 v = ld_shared_v4(buffer + row * 128 + ((u ^ (row % 8)) * 16));
            *reinterpret_cast<uint4*>(d + static_cast<long long>(m) * p.ldd + col) = v;
        }
    }
}
#endif

// Where a work unit starts, one walk for the producer and the consumers: its output tile and k-blocks (in the
// grouped forms the whole Unit; the cursor: the grouped forms' group, a strided dgrad's phase).  False once past
// the last unit (grouped, strided dgrad).  `tiles`, `tiles_m`, `tiles_n` and `k_blocks` are the plain GEMM's and
// the convolutions' (a wgrad's unit: one tile of one split).
#if LIGHT_GROUPED
using UnitCursor = GroupCursor;
using UnitStart = Unit;
#else
#if LIGHT_D_ROWS
using UnitCursor = PhaseCursor;
#else
struct UnitCursor {};
#endif
struct UnitStart {
    int m_block, n_block;
    int k_blocks;
    int k_begin;  // the unit's first k-block (a split tile's split; 0 elsewhere)
    int split;    // its split, -1 for a whole tile
    int slot;     // a split tile's index among the split tiles
};
#endif

__device__ __forceinline__ bool start_unit(const Params& p, UnitCursor& cursor, int tile, int tiles, int tiles_m,
                                           int tiles_n, int k_blocks, UnitStart& at) {
#if LIGHT_GROUPED
    if (!next_unit(p, cursor, tile, at)) return false;
#elif LIGHT_D_ROWS
    if (!next_phase_unit(p, cursor, tile, tiles_n, at.m_block, at.n_block)) return false;
    at.k_blocks = p.phase[cursor.phase].taps * p.c_blocks;
#elif LIGHT_CLUSTER == 2
    // unit: a pair of tiles of one tile row (wgrad: of one split); this CTA's is the pair's (cluster rank)th
    tile_coordinates(kConv == 3 ? tile % tiles : tile, tiles_m, (tiles_n + 1) / 2, p.group_m, at.m_block,
                     at.n_block);
    at.n_block = 2 * at.n_block + static_cast<int>(cluster_ctarank());
    at.k_blocks = k_blocks;
    at.k_begin = 0;
    at.split = -1;
    at.slot = 0;
#else
    at.k_blocks = k_blocks;
    at.k_begin = 0;
    at.split = -1;
    at.slot = 0;
#if LIGHT_SPLITS
    if (tile >= p.split_from) {  // a split of tile split_from + slot: k-blocks [k_begin, k_begin + k_blocks)
        const int v = tile - p.split_from;
        at.slot = v / p.splits;
        at.split = v - at.slot * p.splits;
        tile = p.split_from + at.slot;
        at.k_begin = at.split * k_blocks / p.splits;
        at.k_blocks = (at.split + 1) * k_blocks / p.splits - at.k_begin;
    }
#endif
    tile_coordinates(kConv == 3 ? tile % tiles : tile, tiles_m, tiles_n, p.group_m, at.m_block, at.n_block);
#endif
    return true;
}

#if LIGHT_SPLITS
// A split unit's accumulators (this warpgroup's rows of its tile) to its slice, counted in; true if it was the tile's
// last: then `acc` holds the sum of every split's slice, in split order, for the epilogue.  `flag`: this warpgroup's
// shared word, which broadcasts the count's verdict.  Rows past M are neither stored nor read (a decode GEMV's tile
// is one row of 64), and the last reads two slices at a time: the sum was the fix-up's largest part, a round trip
// to L2 a slice (1x4096x4096 split four ways: 14.4 us, 12.8 without the sum, 10.7 with no fix-up; H200).
__device__ __forceinline__ bool finish_split(const Params& p, const UnitStart& at, float (&acc)[kAccumulators],
                                             int warpgroup, u32 flag) {
    constexpr long long kSlice = kAccumulators * 128;  // floats of a warpgroup's slice
    const int thread = threadIdx.x % 128;
    float* slices = static_cast<float*>(p.workspace);
    const long long first = static_cast<long long>(at.slot) * p.splits * kConsumers + warpgroup;
    float* mine = slices + (first + static_cast<long long>(at.split) * kConsumers) * kSlice + thread;
    const int row = at.m_block * kTileM + warpgroup * 64 + (thread / 32) * 16 + thread % 32 / 4;  // acc[i], i % 4 < 2
    const bool low = row < p.m, high = row + 8 < p.m;  // (i % 4 >= 2: row + 8)
#pragma unroll
    for (int i = 0; i < kAccumulators; ++i) {
        if (i & 2 ? high : low) mine[i * 128] = acc[i];
    }
    __threadfence();  // the slice before the count (release)
    named_barrier_sync(1 + warpgroup, 128);
    int* counter = p.counters + at.slot * kConsumers + warpgroup;
    if (thread == 0) {
        const bool last = atomicAdd(counter, 1) == p.splits - 1;
        if (last) atomicExch(counter, 0);  // every split has counted: the next launch finds it zero
        st_shared_u32(flag, last ? 1u : 0u);
    }
    named_barrier_sync(1 + warpgroup, 128);
    if (ld_shared_u32(flag) == 0) return false;
    __threadfence();  // every split counted: their slices are visible (acquire)
#pragma unroll
    for (int i = 0; i < kAccumulators; ++i) acc[i] = 0.f;
    // Every slice, this one's own too, added in split order (not the arrivals'): the same bits every run.  Two
    // slices' loads in flight at once, where the registers allow: three times a 64 x 128 warpgroup tile's 64
    // accumulators (a 64 x 256 tile's 128, or three consumers' 152 registers each, would spill).
    constexpr bool kPairs = kConsumers < 3 && kAccumulators <= 64;
    int j = 0;
    for (; kPairs && j + 1 < p.splits; j += 2) {
        const float* slice = slices + (first + static_cast<long long>(j) * kConsumers) * kSlice + thread;
        const float* next = slice + kConsumers * kSlice;
        float a[kAccumulators], b[kAccumulators];
#pragma unroll
        for (int i = 0; i < kAccumulators; ++i) {
            const bool valid = i & 2 ? high : low;
            a[i] = valid ? __ldcg(slice + i * 128) : 0.f;
            b[i] = valid ? __ldcg(next + i * 128) : 0.f;
        }
#pragma unroll
        for (int i = 0; i < kAccumulators; ++i) acc[i] = (acc[i] + a[i]) + b[i];
    }
    for (; j < p.splits; ++j) {
        const float* slice = slices + (first + static_cast<long long>(j) * kConsumers) * kSlice + thread;
#pragma unroll
        for (int i = 0; i < kAccumulators; ++i) {
            if (i & 2 ? high : low) acc[i] += __ldcg(slice + i * 128);
        }
    }
    return true;
}
#endif

template <int kN>
__device__ __forceinline__ void wgmma_tile(float (&acc)[kN / 2], u64 desc_a, u64 desc_b, u32 scale_d) {
    if constexpr (kN == 256) {
        wgmma_m64n256k16<kAKMajor ? 0 : 1, kBKMajor ? 0 : 1>(acc, desc_a, desc_b, scale_d);
    } else if constexpr (kN == 192) {
        wgmma_m64n192k16<kAKMajor ? 0 : 1, kBKMajor ? 0 : 1>(acc, desc_a, desc_b, scale_d);
    } else if constexpr (kN == 64) {
        wgmma_m64n64k16<kAKMajor ? 0 : 1, kBKMajor ? 0 : 1>(acc, desc_a, desc_b, scale_d);
    } else {
        wgmma_m64n128k16<kAKMajor ? 0 : 1, kBKMajor ? 0 : 1>(acc, desc_a, desc_b, scale_d);
    }
}

// One operand's tile of a stage, kRows (M or N) by 64 (K).  K-major: one box.  MN-major: a box can be 128 bytes
// wide at most with the 128-byte swizzle, so kRows / 64 boxes of 64 x 64, 8 KB apart.
template <bool kKMajor, int kRows>
__device__ __forceinline__ void load_tile(const TmaDescriptor* desc, u32 dst, u32 bar, int k0, int row0) {
    if constexpr (kKMajor) {
        tma_load_2d(desc, dst, bar, k0, row0);
    } else {
#pragma unroll
        for (int j = 0; j < kRows / 64; ++j) tma_load_2d(desc, dst + j * 8192, bar, row0 + 64 * j, k0);
    }
}

// A consumer warp's release of a stage: to its own CTA's producer, and with LIGHT_CLUSTER 2 to the other CTA's too,
// which multicasts half of every stage's A into this one.
__device__ __forceinline__ void release_stage(u32 empty_bar) {
    if constexpr (kCluster == 2) {
        mbarrier_arrive_cluster(empty_bar, 0);
        mbarrier_arrive_cluster(empty_bar, 1);
    } else {
        mbarrier_arrive(empty_bar);
    }
}

template <bool kKMajor>
__device__ __forceinline__ u64 tile_descriptor(u32 smem) {
    return kKMajor ? kmajor_sw128_descriptor(smem) : mnmajor_sw128_descriptor(smem);
}

// 16 elements of K in the descriptor's 16-byte address units: 32 bytes along a K-major row, 16 rows of 128 bytes
// of an MN-major box.
template <bool kKMajor>
constexpr u64 kStepUnits = kKMajor ? 2 : 128;

extern "C" __global__ void __launch_bounds__(kThreads, 1) LIGHT_CLUSTER_DIMS
jitops_sm90_light_gemm(const __grid_constant__ Params p) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    // The swizzle pattern follows address bits 4-9, which the wgmma descriptors assume start at 0.
    const u32 raw = smem_address(smem_raw);
    const u32 base = (raw + 1023) & ~1023u;
    const u32 smem_a = base;
    const u32 smem_b = base + kStages * kBytesA;
    const u32 epilogue = base + kStages * kStageBytes;
    const u32 full = epilogue + kEpilogueBytes;
    const u32 empty = full + kStages * 8;
    const u32 turn = empty + kStages * 8;  // pingpong: turn + 8 w is consumer w's go-ahead for its next mainloop

    // Lane 0's warp and warpgroup, read through a shuffle: ptxas then knows they are the same across the warp and
    // keeps the stage addresses and wgmma descriptors in uniform registers, as CUTLASS's canonical_warp_group_idx
    // does.  From threadIdx directly, each wgmma waited on 64-bit descriptor adds in vector registers and four R2UR
    // (66 R2UR in the 128 x 64 kernel, 27 now): H200, TN, 768x768x6304 22.4-23.0 -> 19.1-19.3 us,
    // 1024x1024x4096 16.7-16.8 -> 15.0-15.2 (CUTLASS's 19.3-19.5 and 19.3-19.4; docs/architecture.md).
    const int warp = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 32), 0);
    const int lane = threadIdx.x % 32;
    const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);

    if (threadIdx.x == 0) {
        for (int s = 0; s < kStages; ++s) {
            mbarrier_init(full + 8 * s, 1);                   // the producer's arrive + TMA bytes
            mbarrier_init(empty + 8 * s, kStageReaders * 4 * kCluster);  // one per reading consumer warp
        }
        mbarrier_init(turn, 1);
        mbarrier_init(turn + 8, 1);
        fence_barrier_init();
    }
    if (kGrouped != 3 && threadIdx.x == 128 * kConsumers) {  // the list form's are in its table
#if LIGHT_D_ROWS
        for (int i = 0; i < p.phases; ++i) tma_prefetch_descriptor(&p.phase[i].a);  // (D: stored by rows)
        tma_prefetch_descriptor(&p.b);
#else
        tma_prefetch_descriptor(&p.a);
        tma_prefetch_descriptor(&p.b);
        tma_prefetch_descriptor(&p.d);
#endif
    }
    if constexpr (kCluster == 2) {
        cluster_sync();  // both CTAs' barriers initialized before either multicasts or arrives on the other's
    } else {
        __syncthreads();
    }
    // The CTA's (cluster's) place among the grid's: units are tiles (pairs of tiles) taken in turn.
    const int cta = blockIdx.x / kCluster;
    const int ctas = gridDim.x / kCluster;

    const int tiles_m = (p.m + kTileM - 1) / kTileM;
    const int tiles_n = (p.n + kTileN - 1) / kTileN;
    // A unit's tiles: one tile, or in a cluster a pair of one tile row (start_unit: the CTA's is the rank-th).
    const int tiles = tiles_m * (kCluster == 2 ? (tiles_n + 1) / 2 : tiles_n);
    const int k_blocks = (p.k + kTileK - 1) / kTileK;  // a work unit's
#if LIGHT_CONV == 3
    const int units = tiles * p.splits;  // a unit: one tile of one split (unit / tiles)
#elif LIGHT_GROUPED || LIGHT_D_ROWS
    const int units = 0x7FFFFFFF;  // until next_unit (next_phase_unit) finds no group (phase) left
#elif LIGHT_SPLITS
    const int units = p.split_from + (tiles - p.split_from) * p.splits;
#else
    const int units = tiles;
#endif

    if (warpgroup == kConsumers) {
        // One consumer warpgroup has all the registers it needs at launch (256 threads: up to 255 each).
        if constexpr (kConsumers > 1) registers_decrease<kProducerRegisters>();
#if LIGHT_D_ROWS
        if (warp > 4 * kConsumers) {  // the warpgroup's warps 1-3
            store_idle_zeros(p, warp - 4 * kConsumers - 1, lane);
            return;
        }
#endif
        if (threadIdx.x != 128 * kConsumers) return;
        int stage = 0;
        u32 phase = 0;
        const int a_half = kCluster == 2 ? static_cast<int>(cluster_ctarank()) : 0;  // the rows of A it loads
#if LIGHT_CONV == 3
        // A k-block moves the pixel (image, oh, ow) of wgrad's B boxes on by 64 pixels: a mixed-radix addition of
        // these steps, so that this one thread divides per tile, not per k-block (with four run-time divisions a
        // k-block it was the kernel's bottleneck on short tiles: 35.6 against CUTLASS's 20.0 us on ResNet-50's
        // 256-channel 3x3 at 14x14, 128 x 64 tiles).
        const int out_h = p.out_hw / p.out_w;
        const int step_image = kTileK / p.out_hw, step_oh = kTileK % p.out_hw / p.out_w, step_ow = kTileK % p.out_w;
#endif
        UnitCursor cursor;
#if LIGHT_GROUPED == 3
        int acquired = -1;  // the list form: the group whose descriptors this thread has acquired
#endif
        for (int tile = cta; tile < units; tile += ctas) {
            UnitStart at;
            if (!start_unit(p, cursor, tile, tiles, tiles_m, tiles_n, k_blocks, at)) break;
            const int m_block = at.m_block, n_block = at.n_block, tile_k_blocks = at.k_blocks;
#if LIGHT_GROUPED
            const Unit& u = at;
#if LIGHT_GROUPED == 3
            const GroupEntry* entry = static_cast<const GroupEntry*>(p.groups_data) + cursor.group;
            if (acquired != cursor.group) {
                tensormap_acquire(&entry->a);
                tensormap_acquire(&entry->b);
                acquired = cursor.group;
            }
#endif
#elif LIGHT_D_ROWS
            const Phase& g = p.phase[cursor.phase];
#endif
#if LIGHT_CONV == 3
            const int first_block = tile / tiles * k_blocks;  // the split's first k-block of output pixels
            int image = first_block * kTileK / p.out_hw;
            int oh = (first_block * kTileK - image * p.out_hw) / p.out_w;
            int ow = first_block * kTileK - image * p.out_hw - oh * p.out_w;
            // Each 64-column block of the tile is one tap's channels: its channel offset and its tap's filter
            // offsets (16 bits each, packed), the same for every k-block.
            int b_channel[kTileN / 64];
            u32 b_offsets[kTileN / 64];
#pragma unroll
            for (int j = 0; j < kTileN / 64; ++j) {
                const int col = n_block * kTileN + 64 * j;
                const int tap = col / (p.c_blocks * kTileK);
                const int t = tap < p.taps ? tap : p.taps - 1;  // columns past N: loaded, never stored
                const int r = t / p.filter_s, s = t - r * p.filter_s;
                b_channel[j] = col - tap * p.c_blocks * kTileK;
                b_offsets[j] = static_cast<u32>(s * p.dil_w) | static_cast<u32>(r * p.dil_h) << 16;
            }
#elif LIGHT_CONV
#if !LIGHT_D_ROWS
            const Params& g = p;  // the unit's geometry: the conv's own, or its phase's (the same field names)
#endif
            // The tile's first output pixel, where its im2col box starts (the box then walks the pixel grid); in a
            // cluster, the first of this CTA's half of the tile's rows.
            const int m0 = m_block * kTileM + 64 * a_half;
            const int image = m0 / g.out_hw;
            const int oh = (m0 - image * g.out_hw) / g.out_w;
            const int ow = m0 - image * g.out_hw - oh * g.out_w;
            const int w0 = g.corner_w + ow * (LIGHT_D_ROWS ? 1 : p.stride_w);
            const int h0 = g.corner_h + oh * (LIGHT_D_ROWS ? 1 : p.stride_h);
            int tap = 0, c_block = 0, r = 0, s = 0;  // the k-block's filter tap (r, s) and channel block
#endif
            for (int kb = 0; kb < tile_k_blocks; ++kb) {
                mbarrier_wait(empty + 8 * stage, phase ^ 1);
                const u32 bar = full + 8 * stage;
                mbarrier_arrive_expect_tx(bar, kStageBytes);
#if LIGHT_CONV == 3
                if constexpr (kCluster == 2) {  // dy's filters: this CTA's 64 of the tile's 128, to both
                    tma_load_2d_multicast(&p.a, smem_a + stage * kBytesA + a_half * 8192, bar,
                                          m_block * kTileM + 64 * a_half, (first_block + kb) * kTileK, 0x3);
                } else {
                    load_tile<false, kTileM>(&p.a, smem_a + stage * kBytesA, bar, (first_block + kb) * kTileK,
                                             m_block * kTileM);
                }
                const int w0 = p.corner_w + ow * p.stride_w, h0 = p.corner_h + oh * p.stride_h;
#pragma unroll
                for (int j = 0; j < kTileN / 64; ++j) {
                    tma_load_im2col_4d(&p.b, smem_b + stage * kBytesB + j * 8192, bar, b_channel[j], w0, h0, image,
                                       static_cast<unsigned short>(b_offsets[j] & 0xFFFFu),
                                       static_cast<unsigned short>(b_offsets[j] >> 16));
                }
                ow += step_ow;  // each carry is at most one: every digit stays below its radix
                if (ow >= p.out_w) {
                    ow -= p.out_w;
                    ++oh;
                }
                oh += step_oh;
                if (oh >= out_h) {
                    oh -= out_h;
                    ++image;
                }
                image += step_image;
#elif LIGHT_CONV
                if constexpr (kCluster == 2) {
                    tma_load_im2col_4d_multicast(&g.a, smem_a + stage * kBytesA + a_half * 8192, bar, c_block * kTileK,
                                                 w0, h0, image, static_cast<unsigned short>(s * g.dil_w),
                                                 static_cast<unsigned short>(r * g.dil_h), 0x3);
                } else {
                    tma_load_im2col_4d(&g.a, smem_a + stage * kBytesA, bar, c_block * kTileK, w0, h0, image,
                                       static_cast<unsigned short>(s * g.dil_w),
                                       static_cast<unsigned short>(r * g.dil_h));
                }
#if LIGHT_D_ROWS
                const int filter_tap = g.tap_last - r * g.tap_step_h - s * g.tap_step_w;
#else
                const int filter_tap = kConv == 2 ? p.taps - 1 - tap : tap;
#endif
                if constexpr (kBKMajor) {
                    tma_load_3d(&p.b, smem_b + stage * kBytesB, bar, c_block * kTileK, filter_tap, n_block * kTileN);
                } else {
#pragma unroll
                    for (int j = 0; j < kTileN / 64; ++j) {
                        tma_load_3d(&p.b, smem_b + stage * kBytesB + j * 8192, bar, n_block * kTileN + 64 * j,
                                    c_block * kTileK, filter_tap);
                    }
                }
                if (++c_block == p.c_blocks) {
                    c_block = 0;
                    ++tap;
                    if (++s == g.filter_s) {
                        s = 0;
                        ++r;
                    }
                }
#elif LIGHT_GROUPED == 1
                tma_load_2d(&p.a, smem_a + stage * kBytesA, bar, kb * kTileK, u.a_row0);
                if constexpr (kBKMajor) {  // B (G, K, N) as dims (K, N, G)
                    tma_load_3d(&p.b, smem_b + stage * kBytesB, bar, kb * kTileK, n_block * kTileN, cursor.group);
                } else {  // dims (N, K, G)
#pragma unroll
                    for (int j = 0; j < kTileN / 64; ++j) {
                        tma_load_3d(&p.b, smem_b + stage * kBytesB + j * 8192, bar, n_block * kTileN + 64 * j,
                                    kb * kTileK, cursor.group);
                    }
                }
#elif LIGHT_GROUPED == 2
                load_tile<false, kTileM>(&p.a, smem_a + stage * kBytesA, bar, u.k0 + kb * kTileK, m_block * kTileM);
                load_tile<false, kTileN>(&p.b, smem_b + stage * kBytesB, bar, u.k0 + kb * kTileK, n_block * kTileN);
#elif LIGHT_GROUPED == 3
                load_tile<kAKMajor, kTileM>(&entry->a, smem_a + stage * kBytesA, bar, kb * kTileK, m_block * kTileM);
                load_tile<kBKMajor, kTileN>(&entry->b, smem_b + stage * kBytesB, bar, kb * kTileK, n_block * kTileN);
#else
                const int k0 = (at.k_begin + kb) * kTileK;  // a split's k-blocks start at k_begin (else 0)
                if constexpr (kCluster == 2) {  // this CTA's 64 rows of A (one 64 x 64 box either way), to both
                    const int row0 = m_block * kTileM + 64 * a_half;
                    tma_load_2d_multicast(&p.a, smem_a + stage * kBytesA + a_half * 8192, bar,
                                          kAKMajor ? k0 : row0, kAKMajor ? row0 : k0, 0x3);
                } else {
                    load_tile<kAKMajor, kTileM>(&p.a, smem_a + stage * kBytesA, bar, k0, m_block * kTileM);
                }
                load_tile<kBKMajor, kTileN>(&p.b, smem_b + stage * kBytesB, bar, k0, n_block * kTileN);
#endif
                if (++stage == kStages) {
                    stage = 0;
                    phase ^= 1;
                }
            }
        }
        if constexpr (kCluster == 2) {
            // The other CTA's consumers arrive on this CTA's empty barriers up to their last k-block: wait for every
            // stage's last release, so that this CTA (its shared memory) outlives those arrivals.  Not unrolled:
            // unrolled, it made the wgrad producer spill under its 40 registers.
#pragma unroll 1
            for (int i = 0; i < kStages; ++i) {
                mbarrier_wait(empty + 8 * stage, phase ^ 1);
                if (++stage == kStages) {
                    stage = 0;
                    phase ^= 1;
                }
            }
        }
        return;
    }

    if constexpr (kConsumers > 1) registers_increase<kConsumerRegisters>();
    const bool store_leader = threadIdx.x % 128 == 0;  // issues and waits for the warpgroup's TMA stores
    u32 stores = 0;
    // Cooperative: every tile of the CTA, this warpgroup's 64 rows of each A stage (64 rows of 128 bytes,
    // K-major, or the second 64 x 64 box, MN-major: 8 KB on either way).  Pingpong: every other tile, all 128
    // rows.  The ring position of a tile's first k-block follows from its place in the CTA's sequence (the
    // producer loads every tile's k-blocks in turn).
    //   Pingpong consumers also take turns at their mainloops: consumer 0 runs tile 0's, then consumer 1 tile 1's,
    // and so on, each waiting for the other's go-ahead.  A full barrier's parity wait only tells its current phase
    // from the one before, so a consumer must not wait on a stage more than one lap of the ring ahead of where
    // the loads are; without the turns, consumer 1 waited on tile 1's stages while tile 0's still filled them,
    // took tile 0's data and hung the kernel.
    const int first = kPingpong ? warpgroup : 0;
    const int stride = kPingpong ? kConsumers : 1;
    UnitCursor cursor;
#if LIGHT_GROUPED == 3
    int acquired = -1;
#endif
#if LIGHT_GROUPED || LIGHT_D_ROWS || LIGHT_SPLITS
    unsigned long long ring = 0;  // k-blocks consumed so far: a grouped unit's (a phase's, a split's) count varies
#endif
    for (int local = first, tile = cta + first * ctas; tile < units; local += stride, tile += stride * ctas) {
        if constexpr (kPingpong) {
            if (local > 0) mbarrier_wait(turn + 8 * warpgroup, ((local - 1) / 2) & 1);  // the other's mainloop
        }
        UnitStart at;
        if (!start_unit(p, cursor, tile, tiles, tiles_m, tiles_n, k_blocks, at)) break;
        const int m_block = at.m_block, n_block = at.n_block, tile_k_blocks = at.k_blocks;
#if LIGHT_GROUPED
        const Unit& u = at;
        const unsigned long long position = ring;
        ring += tile_k_blocks;
        const int d_row0 = u.d_row0, d_rows = u.d_rows, d_cols = u.d_cols;
#if LIGHT_GROUPED == 3
        const GroupEntry* entry = static_cast<const GroupEntry*>(p.groups_data) + cursor.group;
        if (store_leader && acquired != cursor.group) {
            tensormap_acquire(&entry->d);
            acquired = cursor.group;
        }
#endif
#elif LIGHT_D_ROWS
        const Phase& g = p.phase[cursor.phase];
        if (tile_k_blocks == 0) {  // no tap reaches the phase's pixels, and the producer loaded nothing
            store_zero_rows(p, g, g.idle_m + m_block * kTileM + warpgroup * 64, n_block * kTileN, threadIdx.x % 128);
            continue;
        }
        const unsigned long long position = ring;
        ring += tile_k_blocks;
        const int d_row0 = m_block * kTileM, d_rows = g.m, d_cols = p.n;
#else
#if LIGHT_SPLITS
        const unsigned long long position = ring;
        ring += tile_k_blocks;
#else
        const unsigned long long position = static_cast<unsigned long long>(local) * k_blocks;
#endif
        const int d_row0 = m_block * kTileM, d_rows = p.m, d_cols = p.n;
#endif
        int stage = static_cast<int>(position % kStages);
        u32 phase = static_cast<u32>(position / kStages) & 1;
        float acc[kAccumulators];
#pragma unroll
        for (int i = 0; i < kAccumulators; ++i) acc[i] = 0.f;

        int previous = -1;
        for (int kb = 0; kb < tile_k_blocks; ++kb) {
            mbarrier_wait(full + 8 * stage, phase);
#if LIGHT_GROUPED == 2
            if (kb == tile_k_blocks - 1 && u.k_last < kTileK) {  // the rows past the group's end to zeros
                const int thread = threadIdx.x % 128;
                zero_rows(smem_a + stage * kBytesA + warpgroup * 8192, u.k_last, thread);
#pragma unroll
                for (int j = warpgroup; j < kTileN / 64; j += kConsumers) {
                    zero_rows(smem_b + stage * kBytesB + j * 8192, u.k_last, thread);
                }
                fence_proxy_async_shared();
                named_barrier_sync(1 + kConsumers, 128 * kConsumers);  // both consumers read all of B
            }
#endif
            const u64 desc_b = tile_descriptor<kBKMajor>(smem_b + stage * kBytesB);
            fence_accumulators(acc);
            wgmma_fence();
#pragma unroll
            for (int step = 0; step < kTileK / 16; ++step) {
#pragma unroll
                for (int h = 0; h < kMmaBlocks; ++h) {
                    const u32 rows = smem_a + stage * kBytesA + (kPingpong ? h : warpgroup) * 8192;
                    wgmma_tile<kTileN>(*reinterpret_cast<float(*)[kTileN / 2]>(&acc[h * kTileN / 2]),
                                       tile_descriptor<kAKMajor>(rows) + kStepUnits<kAKMajor> * step,
                                       desc_b + kStepUnits<kBKMajor> * step, 1);
                }
            }
            wgmma_commit();
            fence_accumulators(acc);
            wgmma_wait<1>();  // the previous k-block's wgmmas are done: release its stage
            if (previous >= 0 && lane == 0) release_stage(empty + 8 * previous);
            previous = stage;
            if (++stage == kStages) {
                stage = 0;
                phase ^= 1;
            }
        }
        if constexpr (kPingpong) {
            if (store_leader) mbarrier_arrive(turn + 8 * (1 - warpgroup));  // every stage of the tile is in
        }
        wgmma_wait<0>();
        fence_accumulators(acc);
        if (previous >= 0 && lane == 0) release_stage(empty + 8 * previous);
#if LIGHT_SPLITS
        if (at.split >= 0 && !finish_split(p, at, acc, warpgroup, turn + 16 + 4 * warpgroup)) {
            continue;  // another split of the tile sums it
        }
#endif

        // Epilogue: 64 x kStoreCols chunks of this warpgroup's rows through shared memory, one TMA store each.
        // A buffer is refilled only once the store issued from it two chunks ago has read it; the buffers are used
        // in turn over the whole kernel (a tile at N's edge stores fewer chunks).
        const int row = (warp % 4) * 16 + lane / 4;  // and row + 8, in each 64-row block
        const u32 buffers = epilogue + warpgroup * kStoreBuffers * kStoreBytes;
#pragma unroll
        for (int h = 0; h < kMmaBlocks; ++h) {
            const int store_row0 = d_row0 + (kPingpong ? h : warpgroup) * 64;
            if (store_row0 >= d_rows) break;  // the block's rows are all past M (uniform in the warpgroup)
            const float* block = &acc[h * kTileN / 2];
#pragma unroll
            for (int j = 0; j < kStoreChunks; ++j) {
                const int chunk_col0 = n_block * kTileN + j * kStoreCols;
                if (chunk_col0 >= d_cols) break;  // uniform too
                const u32 buffer = buffers + (stores++ % kStoreBuffers) * kStoreBytes;
#if LIGHT_FUSED
                // The chunk's bias, loaded together before the barrier: one load, then an asm store with a
                // memory clobber, in turn, serialized 128 load latencies a tile (8192x8192x1024 with bias + gelu
                // ran x0.74-0.76 of CUTLASS's kernel, x0.98-0.99 without).
                u32 bias_pairs[kStoreCols / 8];
#pragma unroll
                for (int cc = 0; cc < kStoreCols / 8; ++cc) {
                    const int col = chunk_col0 + 8 * cc + 2 * (lane % 4);
                    bias_pairs[cc] = p.bias != nullptr && col < p.n ? load_bias_pair(p.bias, col) : 0u;
                }
#endif
                if (store_leader) bulk_wait_group_read<kStoreBuffers - 1>();
                named_barrier_sync(1 + warpgroup, 128);
#if LIGHT_FUSED
                const float* values = block + 4 * j * (kStoreCols / 8);
                if (!kActivation || p.activation == 0) {
                    stage_chunk<kBiasOnly>(buffer, row, lane, values, bias_pairs);
                } else if (p.activation == 1) {
                    stage_chunk<kRelu>(buffer, row, lane, values, bias_pairs);
                } else if (p.activation == 2) {
                    stage_chunk<kGeluErf>(buffer, row, lane, values, bias_pairs);
                } else {
                    stage_chunk<kGeluTanh>(buffer, row, lane, values, bias_pairs);
                }
#else
                stage_chunk<kPlain>(buffer, row, lane, block + 4 * j * (kStoreCols / 8), nullptr);
#endif
#if LIGHT_D_ROWS
                // The buffer is staged again two chunks on, after a barrier that every thread's reads here precede.
                named_barrier_sync(1 + warpgroup, 128);
                store_rows(p, g, buffer, store_row0, chunk_col0, threadIdx.x % 128);
                continue;
#elif LIGHT_GROUPED == 1
                named_barrier_sync(1 + warpgroup, 128);
                store_group_rows(p, buffer, store_row0, d_rows, chunk_col0, threadIdx.x % 128);
                continue;
#endif
                fence_proxy_async_shared();
                named_barrier_sync(1 + warpgroup, 128);
                if (store_leader) {
#if LIGHT_CONV == 3
                    // dw's (or the split's slice's) KRSC memory: a chunk's columns lie in one tap, whose channels
                    // are whole 64-column blocks here, and the store clips those past C.
                    const int tap = chunk_col0 / (p.c_blocks * kTileK);
                    tma_store_4d(&p.d, buffer, chunk_col0 - tap * p.c_blocks * kTileK, tap, store_row0, tile / tiles);
#elif LIGHT_GROUPED == 2
                    tma_store_3d(&p.d, buffer, chunk_col0, store_row0, cursor.group);
#elif LIGHT_GROUPED == 3
                    tma_store_2d(&entry->d, buffer, chunk_col0, store_row0);
#else
                    tma_store_2d(&p.d, buffer, chunk_col0, store_row0);
#endif
                    bulk_commit_group();
                }
            }
        }
    }
    if (store_leader) bulk_wait_all();  // shared memory must outlive the stores' reads
}

}  // namespace jitops_light
