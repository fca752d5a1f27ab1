// Ground truth for jitops/cutlass_host.py: runs CUTLASS's own host code (GemmKernel::to_underlying_arguments,
// get_grid_shape) for one configuration of kernels/gemm/sm90_gemm.cuh over the problems given as arguments, with
// cuTensorMapEncodeTiled replaced by a recorder, and prints what it saw as JSON:
//   - every cuTensorMapEncodeTiled call's arguments (the descriptor's 128 bytes then hold "JTMA" and the call's
//     index, so the Params bytes show where each descriptor lives);
//   - the Params bytes, the grid, block and shared-memory size.
// Built by nvcc for the host only (no kernel is instantiated) by tests/cutlass_host/make_fixtures.py; its
// output is the committed fixture that tests/test_cutlass_host.py checks the Python host logic against.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda.h>

#include "sm90_gemm.cuh"

namespace {
struct EncodeCall {
  int dtype, rank, interleave, swizzle, l2, oob;
  unsigned long long address;
  unsigned long long dims[5], strides[4];
  unsigned box[5], elem[5];
};
std::vector<EncodeCall> calls;
}  // namespace

extern "C" CUresult cuTensorMapEncodeTiled(CUtensorMap* map, CUtensorMapDataType dtype, cuuint32_t rank,
                                           void* address, const cuuint64_t* dims, const cuuint64_t* strides,
                                           const cuuint32_t* box, const cuuint32_t* elem,
                                           CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                           CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob) {
  EncodeCall c{};
  c.dtype = dtype; c.rank = static_cast<int>(rank); c.interleave = interleave; c.swizzle = swizzle;
  c.l2 = l2; c.oob = oob; c.address = reinterpret_cast<unsigned long long>(address);
  for (unsigned i = 0; i < rank; ++i) { c.dims[i] = dims[i]; c.box[i] = box[i]; c.elem[i] = elem[i]; }
  for (unsigned i = 0; i + 1 < rank; ++i) c.strides[i] = strides[i];
  unsigned index = static_cast<unsigned>(calls.size());
  calls.push_back(c);
  std::memset(map, 0, sizeof(*map));
  std::memcpy(map, "JTMA", 4);
  std::memcpy(reinterpret_cast<char*>(map) + 4, &index, 4);
  return CUDA_SUCCESS;
}

// The bytes of Params that CUTLASS's host code sets: two runs, after the stack below main was filled with 0x00
// and with 0xff; a byte that differs between them is padding or a field nobody set (printed as "..").
__attribute__((noinline)) void dirty_stack(unsigned char fill) {
  volatile unsigned char pad[1 << 16];
  for (unsigned i = 0; i < sizeof(pad); ++i) pad[i] = fill;
}

__attribute__((noinline)) void capture(typename jitops_gemm::GemmKernel::Arguments const& args,
                                       unsigned char* out) {
  typename jitops_gemm::GemmKernel::Params params = jitops_gemm::GemmKernel::to_underlying_arguments(args, nullptr);
  std::memcpy(out, &params, sizeof(params));
}

int main(int argc, char** argv) {
  using namespace jitops_gemm;
  unsigned long long const layout[] = {JITOPS_GEMM_LAYOUT};
  std::printf("{\"layout\": [");
  for (size_t j = 0; j < sizeof(layout) / sizeof(layout[0]); ++j) std::printf("%s%llu", j ? ", " : "", layout[j]);
  std::printf("], ");
  // argv: groups of m n k lda ldb ldd activation swizzle raster sm_count a b d bias (addresses as integers)
  std::printf("\"sizeof_params\": %zu, \"alignof_params\": %zu, \"smem\": %d, \"block\": %u, \"problems\": [",
              sizeof(typename GemmKernel::Params), alignof(typename GemmKernel::Params),
              static_cast<int>(GemmKernel::SharedStorageSize), GemmKernel::get_block_shape().x);
  for (int i = 1; i + 13 < argc + 1 && i < argc; i += 14) {
    auto v = [&](int j) { return std::strtoll(argv[i + j], nullptr, 0); };
    calls.clear();
    auto args = arguments(reinterpret_cast<void*>(v(10)), reinterpret_cast<void*>(v(11)),
                          reinterpret_cast<void*>(v(12)), reinterpret_cast<void*>(v(13)), int(v(0)), int(v(1)),
                          int(v(2)), v(3), v(4), v(5), int(v(6)), int(v(7)), int(v(8)), 0, 1, int(v(9)));
    bool ok = GemmKernel::can_implement(args);
    static unsigned char zeros[sizeof(Params)], ones[sizeof(Params)];
    dirty_stack(0x00);
    capture(args, zeros);
    dirty_stack(0xff);
    calls.clear();
    capture(args, ones);
    typename GemmKernel::Params params;
    std::memcpy(&params, ones, sizeof(params));
    dim3 grid = GemmKernel::get_grid_shape(params);
    std::printf("%s{\"args\": [", i == 1 ? "" : ", ");
    for (int j = 0; j < 14; ++j) std::printf("%s%lld", j ? ", " : "", v(j));
    std::printf("], \"can_implement\": %s, \"grid\": [%u, %u, %u], \"params\": \"", ok ? "true" : "false", grid.x,
                grid.y, grid.z);
    for (size_t j = 0; j < sizeof(params); ++j) {
      if (zeros[j] == ones[j]) std::printf("%02x", ones[j]); else std::printf("..");
    }
    std::printf("\", \"encodes\": [");
    for (size_t j = 0; j < calls.size(); ++j) {
      auto& c = calls[j];
      std::printf("%s{\"dtype\": %d, \"rank\": %d, \"interleave\": %d, \"swizzle\": %d, \"l2\": %d, \"oob\": %d, "
                  "\"address\": %llu, \"dims\": [", j ? ", " : "", c.dtype, c.rank, c.interleave, c.swizzle, c.l2,
                  c.oob, c.address);
      for (int r = 0; r < c.rank; ++r) std::printf("%s%llu", r ? ", " : "", c.dims[r]);
      std::printf("], \"strides\": [");
      for (int r = 0; r + 1 < c.rank; ++r) std::printf("%s%llu", r ? ", " : "", c.strides[r]);
      std::printf("], \"box\": [");
      for (int r = 0; r < c.rank; ++r) std::printf("%s%u", r ? ", " : "", c.box[r]);
      std::printf("], \"element_strides\": [");
      for (int r = 0; r < c.rank; ++r) std::printf("%s%u", r ? ", " : "", c.elem[r]);
      std::printf("]}");
    }
    std::printf("]}");
  }
  std::printf("]}\n");
  return 0;
}
