// The parts of jitops' C++ host path (host_path.cpp) that every op's section uses: the driver handed over from
// Python, one launch on torch's current stream, the checks a tensor passes to be served here, and the shared
// table state (one lock, one config generation, hit and miss counts).
#pragma once

#include <torch/extension.h>

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace jitops_host {

// ---- the driver, from Python (ctypes addresses of libcuda's entry points): no CUDA headers or libraries ----
using LaunchKernel = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*,
                             void**, void**);
using CtxGetCurrent = int (*)(void**);
using CtxSetCurrent = int (*)(void*);
using DeviceGet = int (*)(int*, int);
using PrimaryCtxRetain = int (*)(void**, int);

// cuMemcpy2DAsync_v2's CUDA_MEMCPY2D (cuda.h's layout), used device to device only.
struct Memcpy2D {
  size_t src_x_bytes, src_y;
  int src_memory_type;
  const void* src_host;
  uint64_t src_device;
  void* src_array;
  size_t src_pitch;
  size_t dst_x_bytes, dst_y;
  int dst_memory_type;
  void* dst_host;
  uint64_t dst_device;
  void* dst_array;
  size_t dst_pitch;
  size_t width_bytes, height;
};
static_assert(sizeof(Memcpy2D) == 128, "CUDA_MEMCPY2D is 128 bytes");
constexpr int kDeviceMemory = 2;  // CU_MEMORYTYPE_DEVICE
using Memcpy2DAsync = int (*)(const Memcpy2D*, void*);
using Memset2DD16Async = int (*)(uint64_t, size_t, unsigned short, size_t, size_t, void*);
using StreamIsCapturing = int (*)(void*, int*);

struct Driver {
  LaunchKernel launch = nullptr;
  CtxGetCurrent ctx_get = nullptr;
  CtxSetCurrent ctx_set = nullptr;
  DeviceGet device_get = nullptr;
  PrimaryCtxRetain primary_retain = nullptr;
  Memcpy2DAsync memcpy_2d = nullptr;
  Memset2DD16Async memset_2d_16 = nullptr;
  StreamIsCapturing is_capturing = nullptr;
};
Driver driver;

constexpr int kInvalidContext = 201;  // CUDA_ERROR_INVALID_CONTEXT

// A thread that has made no CUDA runtime call (autograd's device threads) has no current context; the driver
// then refuses launches.  Bind the device's primary context, as jitops.launch._bind_context does.
void bind_primary_context(int device) {
  int handle = 0;
  void* context = nullptr;
  TORCH_CHECK(driver.device_get(&handle, device) == 0 && driver.primary_retain(&context, handle) == 0 &&
                  driver.ctx_set(context) == 0,
              "jitops (C++ host path): cannot make device ", device, "'s primary context current");
}

// ---- the tables' shared state ------------------------------------------------------------------------------
// Every op's table of offered problems sits under one lock and belongs to one config generation: a scope may pick
// other kernels for the same problem, so an offer under a new generation drops every table (renew, host_path.cpp).
std::mutex table_guard;
std::atomic<int64_t> table_generation{-1};
std::atomic<int64_t> hits{0}, misses{0};
void renew(int64_t generation);  // caller holds table_guard

// A table of offered problems: a plain key struct (its maker zeroes it first, so padding takes part as zeros)
// compared and hashed as its bytes, eight at a time.
template <typename Key>
struct BytesEqual {
  bool operator()(const Key& a, const Key& b) const { return std::memcmp(&a, &b, sizeof(Key)) == 0; }
};

template <typename Key>
struct BytesHash {
  static_assert(sizeof(Key) % 8 == 0 && alignof(Key) >= 8, "a table key is a whole number of 8-byte words");
  size_t operator()(const Key& key) const {
    const auto* words = reinterpret_cast<const uint64_t*>(&key);
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < sizeof(Key) / 8; ++i) h = (h ^ words[i]) * 0x100000001b3ull;
    return static_cast<size_t>(h ^ (h >> 29));
  }
};

template <typename Key, typename Value>
using Table = std::unordered_map<Key, Value, BytesHash<Key>, BytesEqual<Key>>;

// The value offered under `key`, or a null one (caller does not hold table_guard).
template <typename Key, typename Value>
Value find_offered(const Table<Key, Value>& table, const Key& key) {
  std::lock_guard<std::mutex> hold(table_guard);
  auto found = table.find(key);
  return found == table.end() ? Value() : found->second;
}

// A call the host path hands back to Python: counted, and None to the caller.
py::object miss() {
  misses.fetch_add(1, std::memory_order_relaxed);
  return py::none();
}

py::object hit(const at::Tensor& out) {
  hits.fetch_add(1, std::memory_order_relaxed);
  return py::cast(out);
}

// The device's current torch stream (CUDA graph capture included).
void* current_stream(int device) {
  return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)
      ->getStream(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)))
      .native_handle();
}

// Whether `stream` is capturing a CUDA graph (cuStreamIsCapturing: CU_STREAM_CAPTURE_STATUS_NONE is 0).
bool capturing(void* stream) {
  int status = 0;
  return driver.is_capturing && driver.is_capturing(stream, &status) == 0 && status != 0;
}

// One driver call on the device's current torch stream, again after binding the primary context if the thread
// had none.
template <typename Call>
void on_stream(int device, const char* what, Call call) {
  void* stream = current_stream(device);
  int status = call(stream);
  if (status == kInvalidContext) {
    bind_primary_context(device);
    status = call(stream);
  }
  TORCH_CHECK(status == 0, "jitops (C++ host path): ", what, " failed with CUDA error ", status);
}

// One launch on the device's current torch stream.
void launch_kernel(void* function, const unsigned (&grid)[3], const unsigned (&block)[3], unsigned smem, int device,
                   void** args) {
  on_stream(device, "cuLaunchKernel", [&](void* stream) {
    return driver.launch(function, grid[0], grid[1], grid[2], block[0], block[1], block[2], smem, stream, args,
                         nullptr);
  });
}

// `rows` rows of `width` bytes from src to dst, each at its own pitch (bytes), on the current stream: one driver
// call where ATen's copy_ of a narrowed view sets up a TensorIterator (the padded Linear's output and gradient).
void copy_rows(const void* src, size_t src_pitch, void* dst, size_t dst_pitch, size_t width, size_t rows,
               int device) {
  Memcpy2D copy;
  std::memset(&copy, 0, sizeof(copy));
  copy.src_memory_type = copy.dst_memory_type = kDeviceMemory;
  copy.src_device = reinterpret_cast<uint64_t>(src);
  copy.dst_device = reinterpret_cast<uint64_t>(dst);
  copy.src_pitch = src_pitch, copy.dst_pitch = dst_pitch, copy.width_bytes = width, copy.height = rows;
  on_stream(device, "cuMemcpy2DAsync", [&](void* stream) { return driver.memcpy_2d(&copy, stream); });
}

// `columns` 16-bit zeros at the start of each of `rows` rows, `pitch` bytes apart.
void zero_columns_16(void* dst, size_t pitch, size_t columns, size_t rows, int device) {
  on_stream(device, "cuMemsetD2D16Async", [&](void* stream) {
    return driver.memset_2d_16(reinterpret_cast<uint64_t>(dst), pitch, 0, columns, rows, stream);
  });
}

const void* address_of(const c10::optional<at::Tensor>& t) { return t.has_value() ? t->data_ptr() : nullptr; }

bool aligned(const void* address) { return (reinterpret_cast<uintptr_t>(address) & 15) == 0; }

bool plain(const at::Tensor& t) {
  // Subclasses, functorch wrappers and functionalization have their own dispatch keys: the Python path (the
  // dispatcher) serves them.
  const auto keys = t.key_set();
  return !keys.has(c10::DispatchKey::Python) && !keys.has(c10::DispatchKey::FuncTorchBatched) &&
         !keys.has(c10::DispatchKey::FuncTorchGradWrapper) && !keys.has(c10::DispatchKey::Functionalize) &&
         !t._fw_grad(0).defined();
}

// A bias the kernels read: n elements of the call's dtype in one dense, 16-byte aligned vector on its device.
bool bias_vector(const at::Tensor& bias, int64_t n, at::ScalarType dtype, int device) {
  return bias.is_cuda() && bias.get_device() == device && bias.scalar_type() == dtype && bias.dim() == 1 &&
         bias.size(0) == n && bias.stride(0) == 1 && aligned(bias.data_ptr()) && plain(bias);
}

// The output gradient as the kernels read it: contiguous, 16-byte aligned (a fresh copy otherwise).
at::Tensor dense(const at::Tensor& grad, at::ScalarType dtype) {
  at::Tensor g = grad.contiguous();
  if (!aligned(g.data_ptr()) || g.scalar_type() != dtype) g = g.to(dtype).clone(at::MemoryFormat::Contiguous);
  return g;
}

}  // namespace jitops_host
