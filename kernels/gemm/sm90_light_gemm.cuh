// sm90_light_gemm.cu's Hopper primitives as raw PTX: mbarriers, TMA loads, wgmma and its shared-memory
// descriptors, register reconfiguration.  No includes at all: the point of this kernel is its compile time
// (CUTLASS's GemmUniversal spends 41 s of a 49 s NVRTC compile instantiating templates on 2 cores;
// docs/benchmarks.md, "CUTLASS 3 through NVRTC").
//
// LIGHT_AB names the 16-bit operand type in PTX ("bf16" or "f16"); sm90_light_gemm.cu sets it.
#pragma once

namespace jitops_light {

typedef unsigned int u32;
typedef unsigned long long u64;

// A CUtensorMap as the driver's cuTensorMapEncodeTiled writes it: 128 opaque bytes, 64-byte aligned.  Passed
// as a __grid_constant__ kernel parameter, so TMA reads it from the parameter space in place.
struct alignas(64) TmaDescriptor {
    u64 bits[16];
};

__device__ __forceinline__ u32 smem_address(const void* p) {
    return static_cast<u32>(__cvta_generic_to_shared(p));
}

// ---- mbarriers (shared::cta, 8 bytes each) ----------------------------------------------------------------------
__device__ __forceinline__ void mbarrier_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}

// Makes the initialized barriers visible to the async proxy (TMA) before any thread uses them.
__device__ __forceinline__ void fence_barrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void mbarrier_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
}

// One arrival plus the bytes the TMA loads of this phase will complete.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
}

// Wait until the phase of parity `parity` has completed.  A fresh barrier is in phase 0, so waiting on parity 1
// returns at once: the producer's first pass over the ring does not wait for consumers.  The retry loop lives
// inside the asm (labels are local to its { } block), as CUTLASS's ClusterBarrier::wait has it: to the compiler
// the wait is one straight-line statement, with no divergent C++ loop before the warpgroup-aligned wgmma.
__device__ __forceinline__ void mbarrier_wait(u32 bar, u32 parity) {
    asm volatile(
        "{\n.reg .pred p;\n"
        "WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        "@p bra DONE;\n"
        "bra WAIT;\n"
        "DONE:\n}\n"
        :: "r"(bar), "r"(parity) : "memory");
}

// ---- TMA --------------------------------------------------------------------------------------------------------
__device__ __forceinline__ void tma_prefetch_descriptor(const TmaDescriptor* desc) {
    asm volatile("prefetch.tensormap [%0];" :: "l"(reinterpret_cast<u64>(desc)) : "memory");
}

// A 2-D box at (c0 inner, c1 outer) into shared memory; completes `bar`'s transaction bytes.  Out-of-bounds
// elements arrive as zeros and still count: every box completes its full size.
__device__ __forceinline__ void tma_load_2d(const TmaDescriptor* desc, u32 dst, u32 bar, int c0, int c1) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];"
        :: "r"(dst), "l"(reinterpret_cast<u64>(desc)), "r"(bar), "r"(c0), "r"(c1) : "memory");
}

// A 3-D box at (c0, c1, c2), innermost first (the conv kernels' filters: channels, a tap or a channel, taps).
__device__ __forceinline__ void tma_load_3d(const TmaDescriptor* desc, u32 dst, u32 bar, int c0, int c1, int c2) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];"
        :: "r"(dst), "l"(reinterpret_cast<u64>(desc)), "r"(bar), "r"(c0), "r"(c1), "r"(c2) : "memory");
}

// An im2col box of an NHWC tensor: the descriptor's pixelsPerColumn pixels, each channelsPerPixel channels from
// channel c, starting at pixel (w, h, n) (absolute: a padded start is negative) and stepping through the
// descriptor's bounding box by its traversal strides, every pixel read at (+ off_w, + off_h): the filter tap.
// Pixels outside the tensor arrive as zeros.
__device__ __forceinline__ void tma_load_im2col_4d(const TmaDescriptor* desc, u32 dst, u32 bar, int c, int w, int h,
                                                   int n, unsigned short off_w, unsigned short off_h) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4, %5, %6}], [%2], {%7, %8};"
        :: "r"(dst), "l"(reinterpret_cast<u64>(desc)), "r"(bar), "r"(c), "r"(w), "r"(h), "r"(n), "h"(off_w),
           "h"(off_h) : "memory");
}

// ---- clusters (LIGHT_CLUSTER 2: two CTAs along N share the A tile, each loading half and multicasting it) ----------
// The loads above with .multicast::cluster: the box lands at the same offset in the shared memory of every CTA in
// `mask` (bit r: cluster rank r), and each one's mbarrier at `bar`'s offset counts the bytes it received.
__device__ __forceinline__ void tma_load_2d_multicast(const TmaDescriptor* desc, u32 dst, u32 bar, int c0, int c1,
                                                      unsigned short mask) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
        " [%0], [%1, {%3, %4}], [%2], %5;"
        :: "r"(dst), "l"(reinterpret_cast<u64>(desc)), "r"(bar), "r"(c0), "r"(c1), "h"(mask) : "memory");
}

__device__ __forceinline__ void tma_load_im2col_4d_multicast(const TmaDescriptor* desc, u32 dst, u32 bar, int c, int w,
                                                             int h, int n, unsigned short off_w,
                                                             unsigned short off_h, unsigned short mask) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes.multicast::cluster"
        " [%0], [%1, {%3, %4, %5, %6}], [%2], {%7, %8}, %9;"
        :: "r"(dst), "l"(reinterpret_cast<u64>(desc)), "r"(bar), "r"(c), "r"(w), "r"(h), "r"(n), "h"(off_w),
           "h"(off_h), "h"(mask) : "memory");
}

__device__ __forceinline__ u32 cluster_ctarank() {
    u32 rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    return rank;
}

// One arrival on the mbarrier at `bar`'s offset in the shared memory of cluster rank `rank` (this CTA's own too).
// The default .release.cta, as CUTLASS's ClusterBarrier::arrive: .release.cluster made every release wait, and the
// ring ran one stage at a time (6304x768x768 bf16: 35.7 against 17.3 us; ResNet-50's L8 fprop 64.3 against 19.8).
__device__ __forceinline__ void mbarrier_arrive_cluster(u32 bar, u32 rank) {
    asm volatile(
        "{\n.reg .b32 remote;\n"
        "mapa.shared::cluster.u32 remote, %0, %1;\n"
        "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}"
        :: "r"(bar), "r"(rank) : "memory");
}

// Every thread of every CTA of the cluster (all of them must come): the barriers' initialization is visible
// cluster-wide after it, before any CTA multicasts into another's shared memory or arrives on its barriers.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// A 2-D box of shared memory to global memory at (c0 inner, c1 outer), in the thread's bulk async-group.
// Out-of-bounds elements are not written: a partial tile needs no guard.
__device__ __forceinline__ void tma_store_2d(const TmaDescriptor* desc, u32 src, int c0, int c1) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];"
                 :: "l"(reinterpret_cast<u64>(desc)), "r"(src), "r"(c0), "r"(c1) : "memory");
}

// The same for a 3-D box at (c0, c1, c2) (a grouped GEMM's D: columns, rows, group).
__device__ __forceinline__ void tma_store_3d(const TmaDescriptor* desc, u32 src, int c0, int c1, int c2) {
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];"
                 :: "l"(reinterpret_cast<u64>(desc)), "r"(src), "r"(c0), "r"(c1), "r"(c2) : "memory");
}

// The same for a 4-D box at (c0, c1, c2, c3) (the conv wgrad's dw or fp32 slices: channels, tap, filter, slice).
__device__ __forceinline__ void tma_store_4d(const TmaDescriptor* desc, u32 src, int c0, int c1, int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];"
                 :: "l"(reinterpret_cast<u64>(desc)), "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3) : "memory");
}

__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }

// Wait until at most kPending of this thread's bulk groups still read their shared memory (the writes to global
// may still be on their way).
template <int kPending>
__device__ __forceinline__ void bulk_wait_group_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;" :: "n"(kPending) : "memory");
}

// Wait until this thread's bulk groups are complete.
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

// Orders this thread's later TMA operations through a descriptor in global memory (a grouped GEMM's per-group
// table, copied there before the launch) after the generic-proxy writes that made it.
__device__ __forceinline__ void tensormap_acquire(const TmaDescriptor* desc) {
    asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" :: "l"(reinterpret_cast<u64>(desc))
                 : "memory");
}

// Makes this thread's generic-proxy writes to shared memory visible to the async proxy (a TMA store after them).
__device__ __forceinline__ void fence_proxy_async_shared() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// A barrier over `kThreads` threads (whole warps) under id `id` (0 is __syncthreads'): one warpgroup's.
__device__ __forceinline__ void named_barrier_sync(u32 id, u32 threads) {
    asm volatile("bar.sync %0, %1;" :: "r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void st_shared_u32(u32 address, u32 value) {
    asm volatile("st.shared.u32 [%0], %1;" :: "r"(address), "r"(value) : "memory");
}

__device__ __forceinline__ u32 ld_shared_u32(u32 address) {
    u32 v;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(address) : "memory");
    return v;
}

__device__ __forceinline__ void st_shared_zero_v4(u32 address) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};" :: "r"(address), "r"(0u) : "memory");
}

__device__ __forceinline__ uint4 ld_shared_v4(u32 address) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(address));
    return v;
}

__device__ __forceinline__ void st_shared_f32x2(u32 address, float x, float y) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};" :: "r"(address), "f"(x), "f"(y) : "memory");
}

// ---- register reconfiguration (warpgroup-wide) ------------------------------------------------------------------
template <u32 kRegisters>
__device__ __forceinline__ void registers_decrease() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(kRegisters));
}

template <u32 kRegisters>
__device__ __forceinline__ void registers_increase() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(kRegisters));
}

// ---- wgmma --------------------------------------------------------------------------------------------------------
// Shared-memory matrix descriptor of a K-major tile stored as rows of 128 bytes (64 16-bit elements) with the
// 128-byte swizzle, as TMA writes it with CU_TENSOR_MAP_SWIZZLE_128B: 8-row groups of 1024 bytes (the stride
// byte offset), the leading byte offset unused for a swizzled K-major layout (1, as CUTLASS sets it), layout
// type 1 (128B swizzle) in bits 62-63.  The tile must start on a 1024-byte boundary (base offset 0); stepping
// 16 elements of K is +32 bytes on the start address.
__device__ __forceinline__ u64 kmajor_sw128_descriptor(u32 smem) {
    return static_cast<u64>((smem & 0x3FFFF) >> 4) | (static_cast<u64>(1) << 16) |
           (static_cast<u64>(1024 >> 4) << 32) | (static_cast<u64>(1) << 62);
}

// The same for an MN-major tile (M or N contiguous, from a column-major A or a row-major B): TMA writes it as
// boxes of 64 MN elements (one 128-byte swizzle row) by 64 K rows, 8 KB each, stacked along MN.  Within a box,
// 8 K rows make one 1024-byte swizzle group (the stride byte offset); the next 64 MN elements are the next box,
// 8192 bytes on (the leading byte offset).  Stepping 16 of K is 16 rows of 128 bytes: +2048 bytes.  (DeepGEMM's
// make_gmma_desc builds the same for its MN-major operands.)
__device__ __forceinline__ u64 mnmajor_sw128_descriptor(u32 smem) {
    return static_cast<u64>((smem & 0x3FFFF) >> 4) | (static_cast<u64>(8192 >> 4) << 16) |
           (static_cast<u64>(1024 >> 4) << 32) | (static_cast<u64>(1) << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }

template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(kPending) : "memory");
}

// Keeps the compiler from moving accumulator reads or writes across the asynchronous wgmma window.
template <int kCount>
__device__ __forceinline__ void fence_accumulators(float (&d)[kCount]) {
#pragma unroll
    for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(d[i]) :: "memory");
}

// D (64 x N, fp32, registers of the warpgroup) += A (64 x 16, shared) . B (16 x N, shared); kTransA, kTransB:
// 0 if the operand's tile is K-major in shared memory, 1 if MN-major; scale_d 0 ignores D's old value.  Register
// i of a thread holds row 16 * warp + lane / 4 + 8 * (i / 2 % 2), column 8 * (i / 4) + 2 * (lane % 4) + i % 2.
template <int kTransA, int kTransB>
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], u64 desc_a, u64 desc_b, u32 scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." LIGHT_AB "." LIGHT_AB " {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, %32, %33, p, 1, 1, %35, %36;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
          "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
          "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransA), "n"(kTransB));
}

template <int kTransA, int kTransB>
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], u64 desc_a, u64 desc_b, u32 scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." LIGHT_AB "." LIGHT_AB " {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, %64, %65, p, 1, 1, %67, %68;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
          "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
          "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
          "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
          "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
          "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
          "+f"(d[63])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransA), "n"(kTransB));
}

template <int kTransA, int kTransB>
__device__ __forceinline__ void wgmma_m64n192k16(float (&d)[96], u64 desc_a, u64 desc_b, u32 scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n192k16.f32." LIGHT_AB "." LIGHT_AB " {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
        "}, %96, %97, p, 1, 1, %99, %100;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
          "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
          "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
          "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
          "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
          "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]),
          "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]),
          "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]),
          "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]),
          "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransA), "n"(kTransB));
}

template <int kTransA, int kTransB>
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], u64 desc_a, u64 desc_b, u32 scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32." LIGHT_AB "." LIGHT_AB " {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
        "}, %128, %129, p, 1, 1, %131, %132;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
          "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
          "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
          "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
          "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
          "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
          "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]),
          "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]),
          "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
          "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]),
          "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]),
          "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]),
          "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]),
          "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]),
          "+f"(d[126]), "+f"(d[127])
        : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransA), "n"(kTransB));
}


}  // namespace jitops_light
