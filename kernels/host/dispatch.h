// jitops' ops as torch's dispatcher calls them: torch.compile's graphs (which call torch.ops.jitops.* for every
// swapped module), the profiler and modes reach the ops there, never through the public functions that ask the
// host path first.  Each op below gets a boxed kernel at the BackendSelect key, which every call passes on its way
// to the backend kernels (jitops/op.py's Python implementations): a CUDA call whose problem the Python path has
// offered is served here from the same tables as the public functions' calls; any other call passes on to the
// next key, exactly as if this kernel were not there.
//
// Why: a compiled patched GPT-2 step spent 25.1 ms of host time against torch.compile's 13.7, the dispatcher's
// trip into Python and jitops' Python around each of about 90 calls a step (docs/benchmarks.md, "torch.compile").
//
// The tables belong to one jitops.config generation: Python says which one is current (set_generation) whenever
// a scope starts or ends, and a call under another generation than the tables' passes on, as the public
// functions' calls under a stale generation do.
//
// conv2d's three operators were left out for a while: served here, a torch.compile'd ResNet-50 had trained on wrong
// values (loss ln(1000), a gradient 7.7e4 off).  The cause was the stem's fprop recipe: its run wrote the im2col
// matrix through the tensor it allocated and read it through a permuted view, which the recording took for two
// workspaces, so every replay read memory nothing wrote (jitops/native.py's encode now maps workspaces by
// address).  Eager training never replayed it (its wgrad is not offered).  Left in Python, compiled patched
// ResNet-50 ran x0.66 of torch.compile's step; served without the strided layers and the stem, x0.80; with them,
// x0.99 (H100; the 7 misses a step are the strided dgrads' and the stem's wgrad).  Each operator below checks the
// layouts its recipe was recorded with.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

#include "common.h"
#include "conv2d.h"
#include "layer_norm.h"
#include "linear.h"

namespace jitops_host {

std::atomic<int64_t> current_generation{-1};  // jitops.config.generation, as Python last set it

bool tables_current() {
  return driver.launch && table_generation.load(std::memory_order_relaxed) ==
                              current_generation.load(std::memory_order_relaxed);
}

using Arguments = c10::ArrayRef<c10::IValue>;

// A call this section does not serve: on to the next kernel (the Python implementation for CUDA and CPU tensors,
// the fake one for meta tensors).  Only CUDA calls count as misses.
void pass_on(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack, bool cuda) {
  if (cuda) misses.fetch_add(1, std::memory_order_relaxed);
  op.redispatchBoxed(keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::BackendSelect),
                     stack);
}

void served(torch::jit::Stack* stack, size_t arguments, std::initializer_list<at::Tensor> outputs) {
  torch::jit::drop(*stack, arguments);
  for (const at::Tensor& out : outputs) torch::jit::push(*stack, out);
  hits.fetch_add(1, std::memory_order_relaxed);
}

c10::optional<at::Tensor> optional_tensor(const c10::IValue& value) {
  if (value.isNone()) return c10::nullopt;
  return value.toTensor();
}

bool is_cuda_call(Arguments args) {
  return args[0].isTensor() && args[0].toTensor().is_cuda();
}

bool on_current_device(const at::Tensor& t) {
  return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getDevice().index() == t.get_device();
}

// ---- jitops::gemm(a, b, bias, activation, out_dtype): 2-D operands on the light kernel ------------------------
// gemm_plan.layout_of: (row-major, leading dimension) of a (rows, cols) operand read in place; false where the
// Python path copies it first.
bool layout_of(int64_t s0, int64_t s1, int64_t rows, int64_t cols, bool* row_major, int64_t* ld) {
  auto set = [&](bool r, int64_t l) {
    *row_major = r, *ld = l;
    return true;
  };
  if (rows > 1 && cols > 1) {
    if (s1 == 1 && s0 >= cols) return set(true, s0);
    if (s0 == 1 && s1 >= rows) return set(false, s1);
    return false;
  }
  if (rows <= 1 && cols <= 1) return set(true, 8);
  if (rows <= 1) return s1 == 1 ? set(true, (cols + 7) / 8 * 8) : s1 >= 1 ? set(false, s1) : false;
  return s0 == 1 ? set(false, (rows + 7) / 8 * 8) : s0 >= 1 ? set(true, s0) : false;
}

// gemm_plan.ACTIVATIONS; -1 for anything else.
int activation_code(const c10::IValue& value) {
  if (value.isNone()) return 0;
  if (!value.isString()) return -1;
  const auto name = value.toStringRef();
  return name == "relu" ? 1 : name == "gelu" ? kGelu : name == "gelu_tanh" ? kGeluTanh : -1;
}

bool serve_gemm(Arguments args, at::Tensor* out) {
  if (!args[0].isTensor() || !args[1].isTensor()) return false;
  const at::Tensor& a = args[0].toTensor();
  const at::Tensor& b = args[1].toTensor();
  const auto bias = optional_tensor(args[2]);
  const int activation = activation_code(args[3]);
  const auto dtype = a.scalar_type();
  if (activation < 0 || a.dim() != 2 || b.dim() != 2 || !a.is_cuda() || !b.is_cuda() ||
      (dtype != at::kBFloat16 && dtype != at::kHalf) || b.scalar_type() != dtype ||
      (!args[4].isNone() && args[4].toScalarType() != dtype)) {
    return false;
  }
  const int device = a.get_device();
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  if (b.size(0) != k || m == 0 || n == 0 || k == 0 || m > INT32_MAX || n > INT32_MAX || k > INT32_MAX) return false;
  if (b.get_device() != device || !plain(a) || !plain(b) || !aligned(a.data_ptr()) || !aligned(b.data_ptr()))
    return false;
  if (bias.has_value() && !bias_vector(*bias, n, dtype, device)) return false;
  bool a_row_major, b_row_major;
  int64_t lda, ldb;
  if (!layout_of(a.stride(0), a.stride(1), m, k, &a_row_major, &lda) ||
      !layout_of(b.stride(0), b.stride(1), k, n, &b_row_major, &ldb) || !on_current_device(a)) {
    return false;
  }
  const Plan* plan = find(make_key(device, dtype, false, a_row_major, !b_row_major, m, n, k, lda, ldb, n, activation,
                                   bias.has_value()));
  if (!plan) return false;
  *out = at::empty({m, n}, a.options());
  launch(*plan, device, a.data_ptr(), b.data_ptr(), out->data_ptr(), bias.has_value() ? bias->data_ptr() : nullptr);
  return true;
}

void gemm_dispatched(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  at::Tensor out;
  if (tables_current() && serve_gemm(torch::jit::last(*stack, 5), &out)) return served(stack, 5, {out});
  pass_on(op, keys, stack, is_cuda_call(torch::jit::last(*stack, 5)));
}

// ---- jitops::linear(x, weight, bias, activation): the forward alone (autograd sits above this key) -------------
void linear_dispatched(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  Arguments args = torch::jit::last(*stack, 4);
  LinearCall call;
  const int activation = activation_code(args[3]);
  if (tables_current() && activation >= 0 && args[0].isTensor() && args[1].isTensor() &&
      linear_call(args[0].toTensor(), args[1].toTensor(), optional_tensor(args[2]), &call) && !call.padded) {
    const Plan* plan = find(forward_key(call.device, call.dtype, call.m, call.n, call.k, call.lda, call.w, activation,
                                        call.has_bias));
    if (plan) {
      const auto bias = call.has_bias ? optional_tensor(args[2]) : c10::optional<at::Tensor>();
      return served(stack, 4, {plain_forward(args[0].toTensor(), args[1].toTensor(), bias, *plan, call.device)});
    }
  }
  pass_on(op, keys, stack, is_cuda_call(args));
}

// ---- jitops::gelu(x, approximate) and jitops::gelu_backward(grad, x, approximate) ------------------------------
// `count` tensors (x; or grad, x), contiguous 16-bit CUDA tensors of one shape: the kernel for their addresses.
bool gelu_plan(Arguments args, int count, bool backward, ElementwisePlan* plan, int* vec) {
  const c10::IValue& approximate = args[count];
  if (!approximate.isString()) return false;
  const auto name = approximate.toStringRef();
  if (name != "none" && name != "tanh") return false;
  for (int i = 0; i < count; ++i) {
    if (!args[i].isTensor()) return false;
  }
  uintptr_t addresses = 0;
  const at::Tensor& x = args[count - 1].toTensor();
  for (int i = 0; i < count; ++i) {
    const at::Tensor& t = args[i].toTensor();
    if (!t.is_cuda() || !t.is_contiguous() || !plain(t) || t.scalar_type() != x.scalar_type() ||
        t.get_device() != x.get_device() || t.sizes() != x.sizes()) {
      return false;
    }
    addresses |= reinterpret_cast<uintptr_t>(t.data_ptr());
  }
  const auto dtype = x.scalar_type();
  if ((dtype != at::kBFloat16 && dtype != at::kHalf) || x.numel() == 0 || !on_current_device(x)) return false;
  *vec = vector_width(addresses, static_cast<int>(x.element_size()));
  return find_gelu(x.get_device(), dtype, x.element_size(), x.numel(), addresses, name == "tanh", backward, plan);
}

// gelu(x, approximate) -> y, and gelu_backward(grad, x, approximate) -> dx: the kernel reads x (grad, x).
template <bool kBackward>
void gelu_dispatched(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  constexpr int kInputs = kBackward ? 2 : 1;
  Arguments args = torch::jit::last(*stack, kInputs + 1);
  ElementwisePlan plan;
  int vec;
  if (tables_current() && gelu_plan(args, kInputs, kBackward, &plan, &vec)) {
    const at::Tensor& x = args[kInputs - 1].toTensor();
    at::Tensor out = at::empty(x.sizes(), x.options());
    const void* first = args[0].toTensor().data_ptr();
    const std::array<const void*, 3> pointers = {first, kBackward ? x.data_ptr() : out.data_ptr(),
                                                 kBackward ? out.data_ptr() : nullptr};
    launch_gelu(plan, x.get_device(), x.numel(), vec, pointers, kInputs + 1);
    return served(stack, kInputs + 1, {out});
  }
  pass_on(op, keys, stack, is_cuda_call(args));
}

// ---- jitops::layer_norm_forward / _inference / _backward: the recorded launch sequences -------------------------
// x over one normalized dimension, as layer_norm_run.py records it: a contiguous CUDA x with rows, weight and
// bias of its dtype and width (or None).  The row width, or 0 when the call is not one of these.
int64_t layer_norm_width(const c10::IValue& x_value, const c10::IValue& shape, const c10::optional<at::Tensor>& weight,
                         const c10::optional<at::Tensor>& bias) {
  if (!x_value.isTensor() || !shape.isIntList()) return 0;
  const at::Tensor& x = x_value.toTensor();
  const auto dims = shape.toIntVector();
  if (dims.size() != 1 || !x.is_cuda() || x.dim() < 1 || x.size(-1) != dims[0] || dims[0] <= 0 ||
      !x.is_contiguous() || !plain(x) || x.numel() == 0 || !on_current_device(x)) {
    return 0;
  }
  const auto dtype = x.scalar_type();
  if (dtype != at::kBFloat16 && dtype != at::kHalf && dtype != at::kFloat && dtype != at::kDouble) return 0;
  const int64_t n = dims[0];
  return layer_norm_param(weight, x, n) && layer_norm_param(bias, x, n) ? n : 0;
}

uintptr_t address_bits(std::initializer_list<const void*> addresses) {
  uintptr_t bits = 0;
  for (const void* a : addresses) bits |= reinterpret_cast<uintptr_t>(a);
  return bits;
}

// layer_norm_forward(x, normalized_shape, weight, bias, eps, rms) -> (y, stats), and layer_norm_inference (-> y).
template <bool kStats>
void layer_norm_forward_dispatched(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  Arguments args = torch::jit::last(*stack, 6);
  if (tables_current() && args[4].isDouble() && args[5].isBool()) {
    const auto weight = optional_tensor(args[2]), bias = optional_tensor(args[3]);
    const int64_t n = layer_norm_width(args[0], args[1], weight, bias);
    if (n) {
      const at::Tensor& x = args[0].toTensor();
      const int64_t rows = x.numel() / n;
      const int device = x.get_device();
      const Recipe* recipe = layer_norm_recipes.find(layer_norm_key(
          kStats ? kForwardWithStats : kInference, device, x.scalar_type(), rows, n, weight.has_value(),
          bias.has_value(), static_cast<int64_t>(address_bits({x.data_ptr(), address_of(weight), address_of(bias)})),
          args[4].toDouble(), false, false, false, args[5].toBool()));
      if (recipe) {
        at::Tensor y = at::empty(x.sizes(), x.options());
        at::Tensor stats = kStats ? new_stats(x, rows) : at::Tensor();
        replay(*recipe, device,
               {x.data_ptr(), address_of(weight), address_of(bias), y.data_ptr(), kStats ? stats.data_ptr() : nullptr},
               x.options());
        if (kStats) return served(stack, 6, {y, stats});
        return served(stack, 6, {y});
      }
    }
  }
  pass_on(op, keys, stack, is_cuda_call(args));
}

// layer_norm_backward(grad, x, stats, weight, normalized_shape, need_dx, need_dweight, need_dbias, rms) -> (dx,
// dweight, dbias), an empty tensor for each gradient not asked for.
void layer_norm_backward_dispatched(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  Arguments args = torch::jit::last(*stack, 9);
  if (tables_current() && args[0].isTensor() && args[2].isTensor() && args[5].isBool() && args[6].isBool() &&
      args[7].isBool() && args[8].isBool()) {
    const auto weight = optional_tensor(args[3]);
    const int64_t n = layer_norm_width(args[1], args[4], weight, c10::nullopt);
    const at::Tensor& grad = args[0].toTensor();
    const at::Tensor& stats = args[2].toTensor();
    if (n) {
      const at::Tensor& x = args[1].toTensor();
      const int64_t rows = x.numel() / n;
      const auto stats_dtype = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
      const bool need_dx = args[5].toBool(), need_dweight = args[6].toBool(), need_dbias = args[7].toBool();
      if (grad.is_cuda() && grad.get_device() == x.get_device() && grad.scalar_type() == x.scalar_type() &&
          grad.sizes() == x.sizes() && grad.is_contiguous() && plain(grad) && stats.is_cuda() &&
          stats.get_device() == x.get_device() && stats.scalar_type() == stats_dtype && stats.is_contiguous() &&
          stats.numel() == 2 * rows && plain(stats)) {
        const int device = x.get_device();
        const Recipe* recipe = layer_norm_recipes.find(layer_norm_key(
            kBackward, device, x.scalar_type(), rows, n, weight.has_value(), false,
            static_cast<int64_t>(address_bits({grad.data_ptr(), x.data_ptr(), address_of(weight)})), 0.0, need_dx,
            need_dweight, need_dbias, args[8].toBool()));
        if (recipe) {
          at::Tensor dx = need_dx ? at::empty(x.sizes(), x.options()) : at::empty({0}, x.options());
          at::Tensor dweight = need_dweight ? at::empty({n}, x.options()) : at::empty({0}, x.options());
          at::Tensor dbias = need_dbias ? at::empty({n}, x.options()) : at::empty({0}, x.options());
          replay(*recipe, device,
                 {grad.data_ptr(), x.data_ptr(), stats.data_ptr(), address_of(weight), dx.data_ptr(),
                  dweight.data_ptr(), dbias.data_ptr()},
                 x.options());
          return served(stack, 9, {dx, dweight, dbias});
        }
      }
    }
  }
  pass_on(op, keys, stack, is_cuda_call(args));
}

// ---- jitops::conv2d, conv2d_input_grad, conv2d_weight_grad: each operator's recorded run ---------------------------
// An operator's recipe was recorded with channels_last, 16-byte aligned tensors (conv2d_run.py offers only runs
// that copied nothing), and its key holds sizes and geometry, not layouts: a call is served only with those layouts.
bool conv_operand(const c10::IValue& value, at::ScalarType dtype, int device) {
  if (!value.isTensor()) return false;
  const at::Tensor& t = value.toTensor();
  return t.is_cuda() && t.get_device() == device && t.scalar_type() == dtype && channels_last_dense(t) && plain(t);
}

// The two tensors every conv2d operator reads first (16-bit, one device, the current one) and its geometry, the
// int[2] stride, padding and dilation after the third argument.
bool conv_operands(Arguments args, ConvGeometry* g) {
  if (!args[0].isTensor()) return false;
  const at::Tensor& first = args[0].toTensor();
  const auto dtype = first.scalar_type();
  const int device = first.is_cuda() ? first.get_device() : -1;
  if ((dtype != at::kBFloat16 && dtype != at::kHalf) || !conv_operand(args[0], dtype, device) ||
      !conv_operand(args[1], dtype, device) || !on_current_device(first)) {
    return false;
  }
  for (size_t i = 0; i < 3; ++i) {
    if (!args[3 + i].isIntList()) return false;
    const auto values = args[3 + i].toIntVector();
    if (values.size() != 2) return false;
    auto& pair = i == 0 ? g->stride : i == 1 ? g->padding : g->dilation;
    pair = {values[0], values[1]};
  }
  return true;
}

// conv2d(x, weight, bias, stride, padding, dilation) -> y
bool serve_conv2d(Arguments args, at::Tensor* out) {
  ConvGeometry g;
  if (!conv_operands(args, &g)) return false;
  const at::Tensor& x = args[0].toTensor();
  const auto dtype = x.scalar_type();
  const int device = x.get_device();
  const auto bias = optional_tensor(args[2]);
  const at::Tensor& weight = args[1].toTensor();
  if (bias.has_value() && !bias_vector(*bias, weight.size(0), dtype, device)) return false;
  const Recipe* fprop = conv_recipes.find(conv_key(kFprop, device, dtype, x.sizes(), weight.sizes(), g,
                                                   bias.has_value()));
  if (!fprop || weight.size(1) != x.size(1)) return false;
  *out = channels_last_empty(conv_output_size(x, weight, g), x);
  replay(*fprop, device, {x.data_ptr(), weight.data_ptr(), address_of(bias), out->data_ptr()}, x.options());
  return true;
}

// conv2d_input_grad(grad, weight, input_size, ...) -> dx and conv2d_weight_grad(grad, x, weight_size, ...) -> dw:
// the second tensor and the size are the filter and x's size (dgrad) or x and the filter's size (wgrad).
template <ConvOperator kOp>
bool serve_conv_grad(Arguments args, at::Tensor* out) {
  ConvGeometry g;
  if (!args[2].isIntList() || !conv_operands(args, &g)) return false;
  const at::Tensor& grad = args[0].toTensor();
  const auto dtype = grad.scalar_type();
  const int device = grad.get_device();
  const std::vector<int64_t> size = args[2].toIntVector();
  if (size.size() != 4) return false;
  const at::Tensor& other = args[1].toTensor();
  const at::IntArrayRef x_size = kOp == kDgrad ? at::IntArrayRef(size) : other.sizes();
  const at::IntArrayRef w_size = kOp == kDgrad ? other.sizes() : at::IntArrayRef(size);
  const Recipe* recipe = conv_recipes.find(conv_key(kOp, device, dtype, x_size, w_size, g, false));
  if (!recipe) return false;
  *out = channels_last_empty(size, grad);
  replay(*recipe, device, {grad.data_ptr(), other.data_ptr(), out->data_ptr()}, grad.options());
  return true;
}

void conv2d_dispatched(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  at::Tensor out;
  if (tables_current() && serve_conv2d(torch::jit::last(*stack, 6), &out)) return served(stack, 6, {out});
  pass_on(op, keys, stack, is_cuda_call(torch::jit::last(*stack, 6)));
}

template <ConvOperator kOp>
void conv_grad_dispatched(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  at::Tensor out;
  if (tables_current() && serve_conv_grad<kOp>(torch::jit::last(*stack, 6), &out)) return served(stack, 6, {out});
  pass_on(op, keys, stack, is_cuda_call(torch::jit::last(*stack, 6)));
}

// ---- the Autograd key: a call that records no gradient stays in C++ ---------------------------------------------
// torch.library.register_autograd installs a Python kernel at the Autograd alias key, and every call through the
// dispatcher passes it, gradient or not: autograd_impl, forward_no_grad and redispatch in Python before the kernel
// above.  A compiled graph calls the ops that way with no gradient to record (its forward runs under no_grad, its
// backward is a graph of its own): 61 of a compiled patched GPT-2 step's 74 calls, where torch.compile alone calls
// cuBLAS with no Python between (its step x0.93 of torch.compile's on the H200 with the same GPU time).  This kernel
// sits at AutogradCPU and AutogradCUDA of the ops with a backward: a call that records no gradient goes below
// autograd here, as forward_no_grad does; any other goes to the Python kernel, which the Autograd alias also put at
// AutogradOther (a key of no backend, the lowest autograd one, so the backend keys below stay as they were).
// (The five ops take tensors and optional tensors, no tensor lists.)
bool any_requires_grad(Arguments args) {
  for (const c10::IValue& value : args) {
    if (value.isTensor() && value.toTensor().requires_grad()) return true;
  }
  return false;
}

void autograd_dispatched(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const size_t arguments = op.schema().arguments().size();
  if (at::GradMode::is_enabled() && any_requires_grad(torch::jit::last(*stack, arguments))) {
    op.redispatchBoxed((keys & c10::after_autograd_keyset) | c10::DispatchKeySet(c10::DispatchKey::AutogradOther),
                       stack);
    return;
  }
  at::AutoDispatchBelowAutograd below;
  op.redispatchBoxed(keys & c10::after_autograd_keyset, stack);
}

// The ops whose Python registration has a backward (jitops/op.py: register_autograd).
constexpr const char* kDifferentiable[] = {"gemm", "linear", "gelu", "layer_norm_forward", "conv2d"};

// ---- registration ----------------------------------------------------------------------------------------------
// Once a process: the kernels stay registered for the process's life (torch.library keeps no handle to drop them).
void register_dispatch() {
  static std::unique_ptr<torch::Library> library;
  if (library) return;
  library = std::make_unique<torch::Library>(torch::Library::IMPL, "jitops", c10::DispatchKey::BackendSelect,
                                             __FILE__, __LINE__);
  library->impl("gemm", torch::CppFunction::makeFromBoxedFunction<&gemm_dispatched>());
  library->impl("linear", torch::CppFunction::makeFromBoxedFunction<&linear_dispatched>());
  library->impl("gelu", torch::CppFunction::makeFromBoxedFunction<&gelu_dispatched<false>>());
  library->impl("gelu_backward", torch::CppFunction::makeFromBoxedFunction<&gelu_dispatched<true>>());
  library->impl("layer_norm_forward",
                torch::CppFunction::makeFromBoxedFunction<&layer_norm_forward_dispatched<true>>());
  library->impl("layer_norm_inference",
                torch::CppFunction::makeFromBoxedFunction<&layer_norm_forward_dispatched<false>>());
  library->impl("layer_norm_backward", torch::CppFunction::makeFromBoxedFunction<&layer_norm_backward_dispatched>());
  library->impl("conv2d", torch::CppFunction::makeFromBoxedFunction<&conv2d_dispatched>());
  library->impl("conv2d_input_grad", torch::CppFunction::makeFromBoxedFunction<&conv_grad_dispatched<kDgrad>>());
  library->impl("conv2d_weight_grad", torch::CppFunction::makeFromBoxedFunction<&conv_grad_dispatched<kWgrad>>());
  static std::unique_ptr<torch::Library> autograd_cpu, autograd_cuda;
  autograd_cpu = std::make_unique<torch::Library>(torch::Library::IMPL, "jitops", c10::DispatchKey::AutogradCPU,
                                                  __FILE__, __LINE__);
  autograd_cuda = std::make_unique<torch::Library>(torch::Library::IMPL, "jitops", c10::DispatchKey::AutogradCUDA,
                                                   __FILE__, __LINE__);
  for (const char* name : kDifferentiable) {
    autograd_cpu->impl(name, torch::CppFunction::makeFromBoxedFunction<&autograd_dispatched>());
    autograd_cuda->impl(name, torch::CppFunction::makeFromBoxedFunction<&autograd_dispatched>());
  }
}

void set_generation(int64_t generation) { current_generation = generation; }

}  // namespace jitops_host
