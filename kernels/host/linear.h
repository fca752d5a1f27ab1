// jitops.linear's section of the C++ host path (host_path.cpp): a Linear's forward and its backward as a C++
// autograd node, and a Linear with its GELU, on the light sm_90a GEMM kernel with the Params that
// jitops/light_gemm.py packed for the same problem.
//
// Python offers each packed problem here (`offer`) once; a call whose forward (and, when a gradient is to be
// recorded, backward) problems were all offered takes this path, any other returns None and the caller takes the
// Python path, which packs and offers them.  A problem is keyed by everything that picks the kernel and its
// Params: device, dtypes, operand layouts, M, N, K, leading dimensions, B's stored rows, activation, bias.
#pragma once

#include "common.h"

#include <algorithm>
#include <map>

namespace jitops_host {

// ---- packed problems -------------------------------------------------------------------------------------
constexpr size_t kParamsSize = 448;  // light_gemm.PARAMS_SIZE
constexpr size_t kWorkspaceField = 424;  // light_gemm.WORKSPACE_FIELD: a split tail's slices, then its counters
constexpr int64_t kGelu = 2, kGeluTanh = 3;  // gemm_plan.ACTIVATIONS

struct Key {
  int64_t m, n, k, lda, ldb, ldd;
  int64_t b_rows;  // light_gemm.Problem.b_rows: B stored shorter than the problem (0: as long)
  int32_t device;
  int8_t dtype, out_fp32, a_kmajor, b_kmajor, activation, bias;
};

struct Plan {
  void* function;
  unsigned grid[3];
  unsigned block;
  unsigned smem;
  uint32_t address_at[3];  // the global-address field of A's, B's and D's descriptors in Params
  uint32_t bias_at;
  int64_t slices_bytes;  // a split tail's (light_gemm.workspace_bytes; 0: none) and its counters
  int64_t counter_count;
  alignas(64) uint8_t params[kParamsSize];
};

Table<Key, Plan*> table;  // under table_guard
std::vector<std::unique_ptr<Plan>> plans;  // never freed: a backward node may hold one past a config change

Key make_key(int device, at::ScalarType dtype, bool out_fp32, bool a_kmajor, bool b_kmajor, int64_t m, int64_t n,
             int64_t k, int64_t lda, int64_t ldb, int64_t ldd, int activation, bool bias, int64_t b_rows = 0) {
  Key key;
  std::memset(&key, 0, sizeof(Key));  // the padding takes part in the comparison and the hash
  key.m = m, key.n = n, key.k = k, key.lda = lda, key.ldb = ldb, key.ldd = ldd, key.b_rows = b_rows;
  key.device = device;
  key.dtype = dtype == at::kBFloat16 ? 0 : 1;
  key.out_fp32 = out_fp32, key.a_kmajor = a_kmajor, key.b_kmajor = b_kmajor;
  key.activation = static_cast<int8_t>(activation), key.bias = bias;
  return key;
}

const Plan* find(const Key& key) {
  return find_offered(table, key);
}

// A split launch's counters on the device's current stream (light_gemm.split_counters): zero at launch, and the
// kernel leaves them zero (the last split of a tile resets its own), so one buffer serves every eager launch queued
// on the stream in turn, kept for the process.  A launch under CUDA-graph capture gets its own buffer from the
// graph's pool, zeroed by a captured fill on every replay: two graphs replayed at once on two streams must not count
// on one buffer.
at::Tensor split_counters(int device, int64_t count) {
  const auto options = at::TensorOptions().dtype(at::kInt).device(at::kCUDA, device);
  void* stream = current_stream(device);
  if (capturing(stream)) return at::zeros({count}, options);
  static std::mutex guard;
  static auto* buffers = new std::map<std::pair<int, uintptr_t>, at::Tensor>();  // never destroyed: no exit order
  const std::pair<int, uintptr_t> key{device, reinterpret_cast<uintptr_t>(stream)};
  std::lock_guard<std::mutex> hold(guard);
  at::Tensor& found = (*buffers)[key];
  if (!found.defined() || found.numel() < count) {
    found = at::zeros({std::max<int64_t>(count, 1024)}, options);  // light_gemm.COUNTERS_MIN
  }
  return found;
}

// One launch of a packed problem on other operands: Params copied to the stack and the four addresses patched
// (the launch copies Params, so concurrent callers of one plan share nothing).  A split tail's slices come from
// torch's caching allocator and go back to it once the launch is queued (stream-ordered reuse), as in the Python path
// (light_gemm.split_workspace).
void launch(const Plan& plan, int device, const void* a, const void* b, void* d, const void* bias) {
  alignas(64) uint8_t params[kParamsSize];
  std::memcpy(params, plan.params, kParamsSize);
  const void* addresses[3] = {a, b, d};
  for (int i = 0; i < 3; ++i) std::memcpy(params + plan.address_at[i], &addresses[i], 8);
  std::memcpy(params + plan.bias_at, &bias, 8);
  at::Tensor slices, counters;  // held until the launch is queued (a captured launch's counters are its own)
  if (plan.slices_bytes) {
    slices = at::empty({plan.slices_bytes}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA, device));
    counters = split_counters(device, plan.counter_count);
    const void* addresses[2] = {slices.data_ptr(), counters.data_ptr()};
    std::memcpy(params + kWorkspaceField, addresses, 16);
  }
  void* args[1] = {params};
  const unsigned block[3] = {plan.block, 1, 1};
  launch_kernel(plan.function, plan.grid, block, plan.smem, device, args);
}

// ---- jitops.gelu's kernels (kernels/gelu.cu), for a Linear whose GELU trains beside it ---------------------------
// gelu_forward(x, y, n) and gelu_backward(dy, x, dx, n): one 256-thread block per `per_block` elements' worth of
// vectors, as jitops/ops/gelu.py launches them.
struct ElementwisePlan {
  void* function;
  unsigned block;
  int64_t per_block;  // vectors a block covers (threads x unroll)
};

std::unordered_map<uint64_t, ElementwisePlan> gelu_table;  // under table_guard

uint64_t gelu_key(int device, at::ScalarType dtype, bool tanh, int vec, bool int_index, bool backward) {
  return (static_cast<uint64_t>(device) << 16) | (static_cast<uint64_t>(dtype == at::kBFloat16) << 12) |
         (static_cast<uint64_t>(tanh) << 11) | (static_cast<uint64_t>(vec) << 2) |
         (static_cast<uint64_t>(int_index) << 1) | static_cast<uint64_t>(backward);
}

// gelu.py's GeluClass.vec of contiguous tensors starting at these addresses (_remembered).
int vector_width(uintptr_t addresses, int itemsize) {
  int width = 16 / itemsize;
  while (width > 1 && addresses % (width * itemsize)) width >>= 1;
  return width;
}

bool find_gelu(int device, at::ScalarType dtype, int64_t itemsize, int64_t numel, uintptr_t addresses, bool tanh,
               bool backward, ElementwisePlan* plan) {
  const uint64_t key = gelu_key(device, dtype, tanh, vector_width(addresses, static_cast<int>(itemsize)),
                                numel < (int64_t{1} << 30), backward);
  std::lock_guard<std::mutex> hold(table_guard);
  auto found = gelu_table.find(key);
  if (found == gelu_table.end()) return false;
  *plan = found->second;
  return true;
}

void launch_gelu(const ElementwisePlan& plan, int device, int64_t numel, int vec, std::array<const void*, 3> pointers,
                 int count) {
  const int64_t vectors = numel / vec ? numel / vec : 1;
  const unsigned grid[3] = {static_cast<unsigned>((vectors + plan.per_block - 1) / plan.per_block), 1, 1};
  void* args[4];
  for (int i = 0; i < count; ++i) args[i] = &pointers[i];
  args[count] = &numel;
  const unsigned block[3] = {plan.block, 1, 1};
  launch_kernel(plan.function, grid, block, 0, device, args);
}

// The weight's (N, K) layout: row-major (an nn.Linear's) or column-major (a view of transformers' Conv1D
// (K, N) weight), with its leading dimension.
struct WeightLayout {
  bool row_major;
  int64_t ld;
};

// ---- the problems of one Linear: forward, and the backward's dx and dweight ----------------------------------
// The keys below are the ones jitops/ops/linear.py's Python path lands on (gemm_plan.class_from_layouts from
// the strides it reads): a forward (M, K) x (K, N) with x row-major (leading dimension lda: K, or a 2-D view's row
// stride) and weight^T in place, dx = dy . weight (M, N) x (N, K), dweight = dy^T . x (N, M) x (M, K), or for a
// transposed weight dweight^T = x^T . dy.
// weight_rows: the weight's stored rows where the problem's N is padded past them (LinearFunction<true>), else 0.
Key forward_key(int device, at::ScalarType dtype, int64_t m, int64_t n, int64_t k, int64_t lda, WeightLayout w,
                int activation, bool bias, int64_t weight_rows = 0) {
  return make_key(device, dtype, false, true, w.row_major, m, n, k, lda, w.ld, n, activation, bias, weight_rows);
}

Key grad_x_key(int device, at::ScalarType dtype, int64_t m, int64_t n, int64_t k, WeightLayout w,
               int64_t weight_rows = 0) {
  return make_key(device, dtype, false, true, !w.row_major, m, k, n, n, w.ld, k, 0, false, weight_rows);
}

Key grad_weight_key(int device, at::ScalarType dtype, int64_t m, int64_t n, int64_t k, int64_t lda, bool transposed) {
  if (transposed) return make_key(device, dtype, false, false, false, k, n, m, lda, n, n, 0, false);
  return make_key(device, dtype, false, false, false, n, k, m, n, lda, k, 0, false);
}

// ---- autograd ------------------------------------------------------------------------------------------------
// dx = dy . weight, dweight = dy^T . x (in the parameter's layout), dbias = dy summed over rows: each if needed.
torch::autograd::variable_list linear_grads(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                                            const at::Tensor& weight, const at::Tensor& grad) {
  const auto* grad_x_plan = reinterpret_cast<const Plan*>(ctx->saved_data["grad_x"].toInt());
  const auto* grad_weight_plan = reinterpret_cast<const Plan*>(ctx->saved_data["grad_weight"].toInt());
  const int device = static_cast<int>(ctx->saved_data["device"].toInt());
  const int64_t n = weight.size(0), k = weight.size(1);
  const int64_t m = grad.numel() / n;
  at::Tensor grad_x, grad_weight, grad_bias;
  if (ctx->needs_input_grad(0)) {
    grad_x = at::empty(x.sizes(), x.options());
    launch(*grad_x_plan, device, grad.data_ptr(), weight.data_ptr(), grad_x.data_ptr(), nullptr);
  }
  if (ctx->needs_input_grad(1)) {
    // A column-major weight (a view of Conv1D's (K, N) parameter): dweight in the parameter's own layout, so
    // that autograd copies nothing into place.
    if (weight.stride(1) != 1) {
      at::Tensor stored = at::empty({k, n}, x.options());
      launch(*grad_weight_plan, device, x.data_ptr(), grad.data_ptr(), stored.data_ptr(), nullptr);
      grad_weight = stored.t();
    } else {
      grad_weight = at::empty({n, k}, x.options());
      launch(*grad_weight_plan, device, grad.data_ptr(), x.data_ptr(), grad_weight.data_ptr(), nullptr);
    }
  }
  // needs_input_grad counts the inputs that are tensors: without a bias there is no index 2.
  if (ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(2)) grad_bias = grad.view({m, n}).sum(0);
  return {grad_x, grad_weight, grad_bias};
}

void save_plans(torch::autograd::AutogradContext* ctx, const Plan* grad_x, const Plan* grad_weight, int64_t device,
                bool bias) {
  ctx->saved_data["grad_x"] = reinterpret_cast<int64_t>(grad_x);
  ctx->saved_data["grad_weight"] = reinterpret_cast<int64_t>(grad_weight);
  ctx->saved_data["device"] = device;
  ctx->saved_data["bias"] = bias;
}


at::Tensor output_like(const at::Tensor& x, int64_t n) {
  auto sizes = x.sizes().vec();
  sizes.back() = n;
  return at::empty(sizes, x.options());
}

// A Linear whose width N is not a multiple of 8 (GPT-2's 50257-wide head), as jitops/ops/linear.py's padded path
// runs it: TMA wants 16-byte rows, so the GEMM writes an (M, N8) buffer (the bias zero-padded to N8) and its first
// N columns are copied out; the backward pads dy to (M, N8) and keeps the valid block of the weight's gradient.
// The weight is read unpadded, N rows where the problems read N8 (their b_rows: TMA reads zeros past them).  The
// same padded operands and the same offered problems as the Python path, so the same bits; here the output's copy
// and dy's pad are driver calls (copy_rows, zero_columns_16) instead of ATen's copy_ and F.pad.
int64_t round8(int64_t n) { return (n + 7) / 8 * 8; }

at::Tensor padded_forward(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                          const Plan& forward, int device) {
  const int64_t n = weight.size(0), k = weight.size(1), n8 = round8(n);
  const int64_t m = x.numel() / k;
  const at::Tensor padded_bias = bias.has_value() ? at::constant_pad_nd(*bias, {0, n8 - n}) : at::Tensor();
  at::Tensor padded = at::empty({m, n8}, x.options());
  launch(forward, device, x.data_ptr(), weight.data_ptr(), padded.data_ptr(),
         padded_bias.defined() ? padded_bias.data_ptr() : nullptr);
  at::Tensor out = output_like(x, n);
  const size_t size = x.element_size();
  copy_rows(padded.data_ptr(), n8 * size, out.data_ptr(), n * size, n * size, m, device);
  return out;
}

// The padded backward: dy zero-padded to (M, N8), dx = (M, N8) . (N8, K) on the weight's N rows read as N8, and
// dweight the first N rows of (N8, M) . (M, K).
torch::autograd::variable_list padded_grads(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                                            const at::Tensor& weight, const at::Tensor& grad) {
  const int device = static_cast<int>(ctx->saved_data["device"].toInt());
  const int64_t n = weight.size(0), k = weight.size(1), n8 = round8(n);
  const int64_t m = grad.numel() / n;
  const at::Tensor g = grad.view({m, n});
  // dy zero-padded to (M, N8) as F.pad makes it, in two driver calls: at::constant_pad_nd filled the whole
  // buffer, then copied dy in through a TensorIterator.
  const size_t size = grad.element_size();
  at::Tensor padded_grad = at::empty({m, n8}, grad.options());
  copy_rows(g.data_ptr(), n * size, padded_grad.data_ptr(), n8 * size, n * size, m, device);
  zero_columns_16(static_cast<char*>(padded_grad.data_ptr()) + n * size, n8 * size, n8 - n, m, device);
  at::Tensor grad_x, grad_weight, grad_bias;
  if (ctx->needs_input_grad(0)) {  // (M, N8) . (N8, K), the weight's N rows read as N8
    grad_x = at::empty(x.sizes(), x.options());
    launch(*reinterpret_cast<const Plan*>(ctx->saved_data["grad_x"].toInt()), device, padded_grad.data_ptr(),
           weight.data_ptr(), grad_x.data_ptr(), nullptr);
  }
  if (ctx->needs_input_grad(1)) {  // (N8, M) . (M, K), its first N rows: a contiguous view
    at::Tensor stored = at::empty({n8, k}, x.options());
    launch(*reinterpret_cast<const Plan*>(ctx->saved_data["grad_weight"].toInt()), device, padded_grad.data_ptr(),
           x.data_ptr(), stored.data_ptr(), nullptr);
    grad_weight = stored.narrow(0, 0, n);
  }
  if (ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(2)) grad_bias = g.sum(0);
  return {grad_x, grad_weight, grad_bias};
}

// y = x . weight^T (+ bias) on the operands as they are.
at::Tensor plain_forward(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                         const Plan& forward, int device) {
  at::Tensor out = output_like(x, weight.size(0));
  launch(forward, device, x.data_ptr(), weight.data_ptr(), out.data_ptr(),
         bias.has_value() ? bias->data_ptr() : nullptr);
  return out;
}

// A Linear's autograd node: kPadded for a width that is not a multiple of 8 (padded_forward, padded_grads).
template <bool kPadded>
struct LinearFunction : public torch::autograd::Function<LinearFunction<kPadded>> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const c10::optional<at::Tensor>& bias, const Plan* forward, const Plan* grad_x,
                            const Plan* grad_weight, int64_t device) {
    const int dev = static_cast<int>(device);
    at::Tensor out = kPadded ? padded_forward(x, weight, bias, *forward, dev)
                             : plain_forward(x, weight, bias, *forward, dev);
    ctx->save_for_backward({x, weight});
    save_plans(ctx, grad_x, grad_weight, device, bias.has_value());
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor grad = dense(grads[0], saved[0].scalar_type());
    auto result = kPadded ? padded_grads(ctx, saved[0], saved[1], grad)
                          : linear_grads(ctx, saved[0], saved[1], grad);
    result.resize(7);  // one gradient an input; none for the plans and the device
    return result;
  }
};

// A Linear followed by its GELU, while training: z = x . weight^T + bias on the GEMM (kept for the backward), y =
// gelu(z) on jitops.gelu's kernel; backward dz = gelu'(z) dy, then the Linear's gradients of dz.  The same
// kernels, in the same order, as jitops.linear's Python training path (linear, then jitops.gelu).
struct LinearGeluFunction : public torch::autograd::Function<LinearGeluFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const c10::optional<at::Tensor>& bias, const Plan* forward, const Plan* grad_x,
                            const Plan* grad_weight, ElementwisePlan gelu, ElementwisePlan gelu_grad,
                            int64_t device) {
    const int dev = static_cast<int>(device);
    at::Tensor z = plain_forward(x, weight, bias, *forward, dev);
    at::Tensor y = at::empty_like(z);
    launch_gelu(gelu, dev, z.numel(), 16 / z.element_size(), {z.data_ptr(), y.data_ptr(), nullptr}, 2);
    ctx->save_for_backward({x, weight, z});
    save_plans(ctx, grad_x, grad_weight, device, bias.has_value());
    ctx->saved_data["gelu_grad"] = reinterpret_cast<int64_t>(gelu_grad.function);
    ctx->saved_data["gelu_grad_block"] = static_cast<int64_t>(gelu_grad.block);
    ctx->saved_data["gelu_grad_per_block"] = gelu_grad.per_block;
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& z = saved[2];
    const ElementwisePlan gelu_grad{reinterpret_cast<void*>(ctx->saved_data["gelu_grad"].toInt()),
                                    static_cast<unsigned>(ctx->saved_data["gelu_grad_block"].toInt()),
                                    ctx->saved_data["gelu_grad_per_block"].toInt()};
    const at::Tensor grad = dense(grads[0], z.scalar_type());
    at::Tensor grad_z = at::empty_like(z);
    launch_gelu(gelu_grad, static_cast<int>(ctx->saved_data["device"].toInt()), z.numel(), 16 / z.element_size(),
                {grad.data_ptr(), z.data_ptr(), grad_z.data_ptr()}, 3);
    auto result = linear_grads(ctx, saved[0], saved[1], grad_z);
    result.resize(9);
    return result;
  }
};
void clear_linear_tables() {
  table.clear();
  gelu_table.clear();
}

// A packed light-GEMM problem (jitops/light_gemm.py's Params, grid and launch facts) under its key.
void offer(int64_t device, bool bf16, bool out_fp32, bool a_kmajor, bool b_kmajor, int64_t m, int64_t n, int64_t k,
           int64_t lda, int64_t ldb, int64_t ldd, int64_t b_rows, int64_t activation, bool bias, int64_t generation,
           int64_t function, std::array<int64_t, 3> grid, int64_t block, int64_t smem,
           std::array<int64_t, 3> address_at, int64_t bias_at, const std::string& params, int64_t slices_bytes,
           int64_t counter_count) {
  TORCH_CHECK(params.size() == kParamsSize, "jitops native offer: Params of ", params.size(), " bytes, expected ",
              kParamsSize);
  auto plan = std::make_unique<Plan>();
  plan->function = reinterpret_cast<void*>(function);
  for (int i = 0; i < 3; ++i) {
    plan->grid[i] = static_cast<unsigned>(grid[i]);
    plan->address_at[i] = static_cast<uint32_t>(address_at[i]);
  }
  plan->block = static_cast<unsigned>(block);
  plan->smem = static_cast<unsigned>(smem);
  plan->bias_at = static_cast<uint32_t>(bias_at);
  TORCH_CHECK(slices_bytes >= 0 && counter_count >= 0 && (slices_bytes == 0) == (counter_count == 0),
              "jitops native offer: bad workspace");
  plan->slices_bytes = slices_bytes;
  plan->counter_count = counter_count;
  std::memcpy(plan->params, params.data(), kParamsSize);
  const Key key = make_key(static_cast<int>(device), bf16 ? at::kBFloat16 : at::kHalf, out_fp32, a_kmajor, b_kmajor,
                           m, n, k, lda, ldb, ldd, static_cast<int>(activation), bias, b_rows);
  std::lock_guard<std::mutex> hold(table_guard);
  renew(generation);
  table[key] = plan.get();
  plans.push_back(std::move(plan));
}

// jitops.gelu's forward or backward kernel for 16-bit tensors of one vector width and index type.
void offer_gelu(int64_t device, bool bf16, bool tanh, int64_t vec, bool int_index, bool backward, int64_t generation,
                int64_t function, int64_t block, int64_t per_block) {
  const uint64_t key = gelu_key(static_cast<int>(device), bf16 ? at::kBFloat16 : at::kHalf, tanh,
                                static_cast<int>(vec), int_index, backward);
  std::lock_guard<std::mutex> hold(table_guard);
  renew(generation);
  gelu_table[key] = ElementwisePlan{reinterpret_cast<void*>(function), static_cast<unsigned>(block), per_block};
}

// A Linear's problem as the Python path keys it, from a call's tensors: false for anything the packed problems
// do not cover (the caller then takes the Python path).
struct LinearCall {
  int device;
  at::ScalarType dtype;
  int64_t m, n, k;
  int64_t lda;  // x's row stride: K when contiguous
  WeightLayout w;
  bool has_bias;
  bool padded;  // N not a multiple of 8 (GPT-2's 50257-wide head): LinearFunction<true>
};

bool linear_call(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                 LinearCall* call) {
  if (!x.is_cuda() || !weight.is_cuda() || x.dim() < 1 || weight.dim() != 2) return false;
  const auto dtype = x.scalar_type();
  if ((dtype != at::kBFloat16 && dtype != at::kHalf) || weight.scalar_type() != dtype) return false;
  const int device = x.get_device();
  if (weight.get_device() != device || !plain(x) || !plain(weight)) return false;
  const bool has_bias = bias.has_value() && bias->defined();
  const int64_t n = weight.size(0), k = weight.size(1);
  if (has_bias && !bias_vector(*bias, n, dtype, device)) return false;
  if (x.size(-1) != k || k % 8 || n == 0 || k == 0) return false;
  // A width that is not a multiple of 8 runs padded, for a contiguous x and a row-major weight (a K that is not a
  // multiple of 8 would pad x too: the Python path serves it).
  const bool padded = n % 8 != 0;
  if (padded && (!x.is_contiguous() || !weight.is_contiguous())) return false;
  // x contiguous, or a 2-D view of rows apart (a classifier's x[:, 0], the class token of each sequence: timm's
  // ViT head), read in place as the Python path reads it (linear._rows_view)
  int64_t lda = k;
  if (!x.is_contiguous()) {
    if (x.dim() != 2 || x.stride(1) != 1 || x.stride(0) < k) return false;
    lda = x.stride(0);
  }
  const int64_t m = x.numel() / k;
  if (m == 0 || m > INT32_MAX || round8(n) > INT32_MAX || k > INT32_MAX) return false;
  const int64_t s0 = weight.stride(0), s1 = weight.stride(1);
  WeightLayout w;
  if (s1 == 1 && s0 >= k) {
    w = {true, s0};
  } else if (s0 == 1 && s1 >= n) {
    w = {false, s1};
  } else {
    return false;
  }
  if (w.ld % 8 || lda % 8 || !aligned(x.data_ptr()) || !aligned(weight.data_ptr())) return false;
  if (c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getDevice().index() != device) return false;
  *call = LinearCall{device, dtype, m, n, k, lda, w, has_bias, padded};
  return true;
}

// A padded call (linear_call's `padded`) through LinearFunction<true>, or None: no activation (a GELU's or ReLU's
// padded training path stays in Python), and the driver's 2-D copy and fill handed over.
py::object padded_linear(const LinearCall& call, const at::Tensor& x, const at::Tensor& weight,
                         const c10::optional<at::Tensor>& bias, int64_t activation) {
  if (activation != 0 || !driver.memcpy_2d || !driver.memset_2d_16) return miss();
  const int device = call.device;
  const int64_t m = call.m, n8 = round8(call.n), k = call.k;
  const int64_t n = call.n;
  const auto maybe_bias = call.has_bias ? bias : c10::optional<at::Tensor>();
  const Plan* forward = find(forward_key(device, call.dtype, m, n8, k, k, call.w, 0, call.has_bias, n));
  if (!forward) return miss();
  const bool grad = at::GradMode::is_enabled() &&
                    (x.requires_grad() || weight.requires_grad() || (call.has_bias && bias->requires_grad()));
  if (!grad) return hit(padded_forward(x, weight, maybe_bias, *forward, device));
  const Plan* grad_x = x.requires_grad() ? find(grad_x_key(device, call.dtype, m, n8, k, call.w, n)) : nullptr;
  const Plan* grad_weight =
      weight.requires_grad() ? find(grad_weight_key(device, call.dtype, m, n8, k, k, false)) : nullptr;
  if ((x.requires_grad() && !grad_x) || (weight.requires_grad() && !grad_weight)) return miss();
  return hit(LinearFunction<true>::apply(x, weight, maybe_bias, forward, grad_x, grad_weight,
                                         static_cast<int64_t>(device)));
}

// y = x . weight^T (+ bias) through the offered problems, or None: the caller then takes the Python path.
py::object linear(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                  int64_t activation, int64_t generation) {
  if (generation != table_generation.load(std::memory_order_relaxed) || !driver.launch) return miss();
  LinearCall call;
  if (!linear_call(x, weight, bias, &call)) return miss();
  if (call.padded) return padded_linear(call, x, weight, bias, activation);
  const int device = call.device;
  const auto dtype = call.dtype;
  const int64_t m = call.m, n = call.n, k = call.k;
  const WeightLayout w = call.w;
  const bool has_bias = call.has_bias;

  const bool grad = at::GradMode::is_enabled() &&
                    (x.requires_grad() || weight.requires_grad() || (has_bias && bias->requires_grad()));
  // While training, a GELU runs after the GEMM (which keeps its input for the backward), as in linear.py; a
  // ReLU's training path (its mask from the output) stays in Python.
  const bool gelu_pair = grad && (activation == kGelu || activation == kGeluTanh);
  if (grad && activation != 0 && !gelu_pair) return miss();
  const Key fkey = forward_key(device, dtype, m, n, k, call.lda, w, gelu_pair ? 0 : static_cast<int>(activation),
                               has_bias);
  const Plan* forward = find(fkey);
  if (!forward) return miss();
  const auto maybe_bias = has_bias ? bias : c10::optional<at::Tensor>();
  if (!grad) return hit(plain_forward(x, weight, maybe_bias, *forward, device));
  // The backward's problems, fetched now: a call runs here only if its whole step can.
  const bool transposed = !w.row_major;
  const Plan* grad_x = x.requires_grad() ? find(grad_x_key(device, dtype, m, n, k, w)) : nullptr;
  const Plan* grad_weight = weight.requires_grad()
                                ? find(grad_weight_key(device, dtype, m, n, k, call.lda, transposed))
                                : nullptr;
  if ((x.requires_grad() && !grad_x) || (weight.requires_grad() && !grad_weight)) return miss();
  at::Tensor out;
  if (gelu_pair) {  // fresh z, y and (dense) dy: 16-byte aligned, the widest vectors
    ElementwisePlan gelu, gelu_grad;
    const bool tanh = activation == kGeluTanh;
    if (!find_gelu(device, dtype, x.element_size(), m * n, 0, tanh, false, &gelu) ||
        !find_gelu(device, dtype, x.element_size(), m * n, 0, tanh, true, &gelu_grad)) {
      return miss();
    }
    out = LinearGeluFunction::apply(x, weight, maybe_bias, forward, grad_x, grad_weight, gelu, gelu_grad,
                                    static_cast<int64_t>(device));
  } else {
    out = LinearFunction<false>::apply(x, weight, maybe_bias, forward, grad_x, grad_weight,
                                       static_cast<int64_t>(device));
  }
  return hit(out);
}

}  // namespace jitops_host
