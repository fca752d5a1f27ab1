// jitops.layer_norm's section of the C++ host path (host_path.cpp): a LayerNorm over the last dimension, its
// forward (with or without the statistics a backward needs) and its backward as a C++ autograd node.
//
// The launches are the Python path's, recorded for one exact problem (recipe.h): jitops/ops/layer_norm_run.py
// offers what it launched, keyed by device, dtype, rows, n, which of weight and bias are given, the pointers'
// alignment (it picks the vector width), eps, whether it is an RMS norm (jitops.rms_norm: the same kernels with
// the mean taken as 0), and for the backward which gradients it computes.  A call whose
// forward (and, when a gradient is to be recorded, backward) problems were offered runs here; anything else (more
// than one normalized dimension, a non-contiguous tensor, no rows) returns None and takes the Python path.
#pragma once

#include "common.h"
#include "recipe.h"

namespace jitops_host {

enum LayerNormStage : int8_t { kForwardWithStats = 0, kInference = 1, kBackward = 2 };

// Slots of a call's tensors in its recipes (layer_norm_run.py's FORWARD_SLOTS and BACKWARD_SLOTS).
enum ForwardSlot { kX = 0, kWeight, kBias, kY, kStats, kForwardSlots };
enum BackwardSlot { kGrad = 0, kSavedX, kSavedStats, kSavedWeight, kGradX, kGradWeight, kGradBias, kBackwardSlots };

struct LayerNormKey {
  int64_t rows, n;
  double eps;
  int32_t device;
  int8_t dtype, stage, has_weight, has_bias, align, need_dx, need_dweight, need_dbias, rms;
};

LayerNormKey layer_norm_key(LayerNormStage stage, int device, at::ScalarType dtype, int64_t rows, int64_t n,
                            bool has_weight, bool has_bias, int64_t align, double eps, bool need_dx,
                            bool need_dweight, bool need_dbias, bool rms) {
  LayerNormKey key;
  std::memset(&key, 0, sizeof(LayerNormKey));  // the padding takes part in the comparison and the hash
  key.rows = rows, key.n = n, key.eps = stage == kBackward ? 0.0 : eps;
  key.device = device, key.dtype = static_cast<int8_t>(dtype), key.stage = stage;
  // The backward reads no bias (its key has only need_dbias).
  key.has_weight = has_weight, key.has_bias = stage != kBackward && has_bias;
  key.align = static_cast<int8_t>(align & 15);
  key.need_dx = need_dx, key.need_dweight = need_dweight, key.need_dbias = need_dbias;
  key.rms = rms;
  return key;
}

RecipeTable<LayerNormKey> layer_norm_recipes;

// Statistics as the Python path keeps them: (2, rows), the mean and 1/sqrt(var + eps) of every row, in float32
// (float64 for float64 inputs).
at::Tensor new_stats(const at::Tensor& x, int64_t rows) {
  return at::empty({2, rows}, x.options().dtype(x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat));
}

struct LayerNormFunction : public torch::autograd::Function<LayerNormFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const c10::optional<at::Tensor>& weight, const c10::optional<at::Tensor>& bias,
                            const Recipe* forward, const Recipe* backward, int64_t device) {
    const int64_t n = x.size(-1);
    at::Tensor y = at::empty(x.sizes(), x.options());
    at::Tensor stats = new_stats(x, x.numel() / n);
    replay(*forward, static_cast<int>(device),
           {x.data_ptr(), address_of(weight), address_of(bias), y.data_ptr(), stats.data_ptr()}, x.options());
    ctx->save_for_backward({x, weight.has_value() ? *weight : at::Tensor(), stats});
    ctx->saved_data["backward"] = reinterpret_cast<int64_t>(backward);
    ctx->saved_data["device"] = device;
    ctx->saved_data["need"] = static_cast<int64_t>(x.requires_grad()) |
                              static_cast<int64_t>(weight.has_value() && weight->requires_grad()) << 1 |
                              static_cast<int64_t>(bias.has_value() && bias->requires_grad()) << 2;
    return y;
  }

  // dx, dweight and dbias as the recorded backward computes them (the ones the forward's inputs needed).
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& stats = saved[2];
    const int64_t need = ctx->saved_data["need"].toInt();
    const bool need_dx = need & 1, need_dweight = need & 2, need_dbias = need & 4;
    const int64_t n = x.size(-1);
    const at::Tensor grad = dense(grads[0], x.scalar_type());
    at::Tensor dx = need_dx ? at::empty(x.sizes(), x.options()) : at::Tensor();
    at::Tensor dweight = need_dweight ? at::empty({n}, x.options()) : at::Tensor();
    at::Tensor dbias = need_dbias ? at::empty({n}, x.options()) : at::Tensor();
    auto address = [](const at::Tensor& t) -> const void* { return t.defined() ? t.data_ptr() : nullptr; };
    replay(*reinterpret_cast<const Recipe*>(ctx->saved_data["backward"].toInt()),
           static_cast<int>(ctx->saved_data["device"].toInt()),
           {grad.data_ptr(), x.data_ptr(), stats.data_ptr(), address(weight), address(dx), address(dweight),
            address(dbias)},
           x.options());
    return {dx, dweight, dbias, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// A LayerNorm's problems as the Python path launched them: `stage` 0 the forward that saves statistics, 1 the
// forward without them, 2 the backward (its `need_*` the gradients it computes).  `sample` gives the device and
// dtype; `align` is the call's pointers OR-ed, modulo 16.
void offer_layer_norm(int64_t stage, const at::Tensor& sample, int64_t rows, int64_t n, bool has_weight,
                      bool has_bias, int64_t align, double eps, bool need_dx, bool need_dweight, bool need_dbias,
                      bool rms, int64_t generation, const std::vector<OfferedLaunch>& launches,
                      const std::vector<std::pair<int64_t, int64_t>>& workspaces) {
  TORCH_CHECK(stage >= kForwardWithStats && stage <= kBackward, "jitops native offer: no layer_norm stage ", stage);
  const auto key_stage = static_cast<LayerNormStage>(stage);
  auto recipe = make_recipe(launches, workspaces, key_stage == kBackward ? kBackwardSlots : kForwardSlots);
  const LayerNormKey key = layer_norm_key(key_stage, sample.get_device(), sample.scalar_type(), rows, n, has_weight,
                                          has_bias, align, eps, need_dx, need_dweight, need_dbias, rms);
  std::lock_guard<std::mutex> hold(table_guard);
  renew(generation);
  layer_norm_recipes.add(key, std::move(recipe));
}

bool layer_norm_param(const c10::optional<at::Tensor>& t, const at::Tensor& x, int64_t n) {
  return !t.has_value() || (t->is_cuda() && t->get_device() == x.get_device() && t->scalar_type() == x.scalar_type() &&
                            t->dim() == 1 && t->size(0) == n && t->stride(0) == 1 && plain(*t));
}

// y = layer_norm(x, (n,), weight, bias, eps) (rms: rms_norm(x, (n,), weight, eps)) through the offered problems,
// or None: the caller then takes the Python path.
py::object layer_norm(const at::Tensor& x, int64_t n, const c10::optional<at::Tensor>& weight_arg,
                      const c10::optional<at::Tensor>& bias_arg, double eps, bool rms, int64_t generation) {
  if (generation != table_generation.load(std::memory_order_relaxed) || !driver.launch) return miss();
  const auto weight = weight_arg.has_value() && weight_arg->defined() ? weight_arg : c10::optional<at::Tensor>();
  const auto bias = bias_arg.has_value() && bias_arg->defined() ? bias_arg : c10::optional<at::Tensor>();
  if (!x.is_cuda() || x.dim() < 1 || n <= 0 || x.size(-1) != n || !x.is_contiguous() || !plain(x)) return miss();
  const auto dtype = x.scalar_type();
  if (dtype != at::kBFloat16 && dtype != at::kHalf && dtype != at::kFloat && dtype != at::kDouble) return miss();
  if (!layer_norm_param(weight, x, n) || !layer_norm_param(bias, x, n)) return miss();
  const int64_t rows = x.numel() / n;
  if (rows == 0) return miss();
  const int device = x.get_device();
  if (c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getDevice().index() != device) return miss();

  const uintptr_t params_align = reinterpret_cast<uintptr_t>(address_of(weight));
  const int64_t align = static_cast<int64_t>(reinterpret_cast<uintptr_t>(x.data_ptr()) | params_align |
                                             reinterpret_cast<uintptr_t>(address_of(bias)));
  const bool need_dx = x.requires_grad(), need_dweight = weight.has_value() && weight->requires_grad(),
             need_dbias = bias.has_value() && bias->requires_grad();
  const bool grad = at::GradMode::is_enabled() && (need_dx || need_dweight || need_dbias);
  const Recipe* forward = layer_norm_recipes.find(layer_norm_key(grad ? kForwardWithStats : kInference, device, dtype,
                                                                 rows, n, weight.has_value(), bias.has_value(), align,
                                                                 eps, false, false, false, rms));
  if (!forward) return miss();
  if (!grad) {
    at::Tensor y = at::empty(x.sizes(), x.options());
    replay(*forward, device, {x.data_ptr(), address_of(weight), address_of(bias), y.data_ptr(), nullptr}, x.options());
    return hit(y);
  }
  // The backward reads dy (dense: 16-byte aligned), x and weight: its alignment is theirs.
  const Recipe* backward = layer_norm_recipes.find(layer_norm_key(
      kBackward, device, dtype, rows, n, weight.has_value(), bias.has_value(),
      static_cast<int64_t>(reinterpret_cast<uintptr_t>(x.data_ptr()) | params_align), eps, need_dx, need_dweight,
      need_dbias, rms));
  if (!backward) return miss();
  return hit(LayerNormFunction::apply(x, weight, bias, forward, backward, static_cast<int64_t>(device)));
}

}  // namespace jitops_host
