// jitops.conv2d's section of the C++ host path (host_path.cpp): a convolution's forward and its backward (dgrad,
// wgrad, dbias) as a C++ autograd node, for channels_last 16-bit tensors.
//
// The launches are the Python path's, recorded for one exact problem (recipe.h): jitops/ops/conv2d_run.py offers
// an operator's run (fprop, dgrad or wgrad) when it only allocated, viewed and launched (native.Recording's watch):
// one kernel or CUTLASS library call (a light strided dgrad: all its phases in one), and for a split wgrad its
// reduction kernel (a folded one, the stem's: its im2col and unfolding kernels).  Keyed by device, dtype, operator,
// the sizes of x and the filter, stride, padding, dilation and whether a bias is added.  Operators whose Python
// path copies or reduces through torch (padded channels, CUTLASS's strided dgrad phases, split fprops) are never
// offered: a call that needs one returns None and takes the Python path.
#pragma once

#include "common.h"
#include "recipe.h"

namespace jitops_host {

enum ConvOperator : int8_t { kFprop = 0, kDgrad = 1, kWgrad = 2 };

// Slots of a call's tensors in its recipes (conv2d_run.py's offers).
enum FpropSlot { kConvX = 0, kConvWeight, kConvBias, kConvY, kFpropSlots };
enum DgradSlot { kDgradGrad = 0, kDgradWeight, kDgradX, kDgradSlots };
enum WgradSlot { kWgradGrad = 0, kWgradX, kWgradWeight, kWgradSlots };

struct ConvKey {
  int64_t n, c, h, w, k, r, s;
  int32_t stride[2], padding[2], dilation[2];
  int32_t device;
  int8_t dtype, op, bias;
};

struct ConvGeometry {
  std::array<int64_t, 2> stride, padding, dilation;
};

ConvKey conv_key(ConvOperator op, int device, at::ScalarType dtype, at::IntArrayRef x_size, at::IntArrayRef w_size,
                 const ConvGeometry& g, bool bias) {
  ConvKey key;
  std::memset(&key, 0, sizeof(ConvKey));  // the padding takes part in the comparison and the hash
  key.n = x_size[0], key.c = x_size[1], key.h = x_size[2], key.w = x_size[3];
  key.k = w_size[0], key.r = w_size[2], key.s = w_size[3];
  for (int i = 0; i < 2; ++i) {
    key.stride[i] = static_cast<int32_t>(g.stride[i]);
    key.padding[i] = static_cast<int32_t>(g.padding[i]);
    key.dilation[i] = static_cast<int32_t>(g.dilation[i]);
  }
  key.device = device, key.dtype = static_cast<int8_t>(dtype), key.op = op, key.bias = op == kFprop && bias;
  return key;
}

RecipeTable<ConvKey> conv_recipes;

bool channels_last_dense(const at::Tensor& t) {
  return t.dim() == 4 && t.is_contiguous(at::MemoryFormat::ChannelsLast) && aligned(t.data_ptr());
}

at::Tensor channels_last_empty(at::IntArrayRef size, const at::Tensor& like) {
  return at::empty(size, like.options().memory_format(at::MemoryFormat::ChannelsLast));
}

int64_t output_size(int64_t size, int64_t kernel, int64_t stride, int64_t padding, int64_t dilation) {
  return (size + 2 * padding - dilation * (kernel - 1) - 1) / stride + 1;
}

// y's sizes (N, K, P, Q) for x (N, C, H, W) and the filter (K, C, R, S).
std::vector<int64_t> conv_output_size(const at::Tensor& x, const at::Tensor& weight, const ConvGeometry& g) {
  return {x.size(0), weight.size(0),
          output_size(x.size(2), weight.size(2), g.stride[0], g.padding[0], g.dilation[0]),
          output_size(x.size(3), weight.size(3), g.stride[1], g.padding[1], g.dilation[1])};
}

struct ConvFunction : public torch::autograd::Function<ConvFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const c10::optional<at::Tensor>& bias, const Recipe* fprop, const Recipe* dgrad,
                            const Recipe* wgrad, std::vector<int64_t> output, int64_t device) {
    at::Tensor y = channels_last_empty(output, x);
    replay(*fprop, static_cast<int>(device), {x.data_ptr(), weight.data_ptr(), address_of(bias), y.data_ptr()},
           x.options());
    const bool need_dx = x.requires_grad(), need_dw = weight.requires_grad();
    // As the Python node: x only for dweight, the filter only for dx.
    ctx->save_for_backward({need_dw ? x : at::Tensor(), need_dx ? weight : at::Tensor()});
    ctx->saved_data["dgrad"] = reinterpret_cast<int64_t>(dgrad);
    ctx->saved_data["wgrad"] = reinterpret_cast<int64_t>(wgrad);
    ctx->saved_data["device"] = device;
    ctx->saved_data["x_size"] = x.sizes().vec();
    ctx->saved_data["w_size"] = weight.sizes().vec();
    ctx->saved_data["need"] = static_cast<int64_t>(need_dx) | static_cast<int64_t>(need_dw) << 1 |
                              static_cast<int64_t>(bias.has_value() && bias->requires_grad()) << 2;
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const int64_t need = ctx->saved_data["need"].toInt();
    const int device = static_cast<int>(ctx->saved_data["device"].toInt());
    const at::Tensor& raw = grads[0];
    // The kernels read dy as channels_last memory, 16-byte aligned (a copy otherwise, as _nhwc makes).
    at::Tensor grad = raw.contiguous(at::MemoryFormat::ChannelsLast);
    if (!aligned(grad.data_ptr())) grad = grad.clone(at::MemoryFormat::ChannelsLast);
    at::Tensor dx, dw, db;
    if (need & 1) {
      dx = channels_last_empty(ctx->saved_data["x_size"].toIntVector(), grad);
      replay(*reinterpret_cast<const Recipe*>(ctx->saved_data["dgrad"].toInt()), device,
             {grad.data_ptr(), saved[1].data_ptr(), dx.data_ptr()}, grad.options());
    }
    if (need & 2) {
      dw = channels_last_empty(ctx->saved_data["w_size"].toIntVector(), grad);
      replay(*reinterpret_cast<const Recipe*>(ctx->saved_data["wgrad"].toInt()), device,
             {grad.data_ptr(), saved[0].data_ptr(), dw.data_ptr()}, grad.options());
    }
    if (need & 4) db = raw.sum({0, 2, 3});  // as the Python node sums the gradient it is given
    return {dx, dw, db, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// An operator's run as the Python path recorded it: `op` 0 fprop, 1 dgrad, 2 wgrad; `x_size` and `w_size` the
// convolution's (N, C, H, W) and (K, C, R, S); geometry pairs; `bias` whether the fprop adds one.
void offer_conv2d(int64_t op, const at::Tensor& sample, std::vector<int64_t> x_size, std::vector<int64_t> w_size,
                  std::array<int64_t, 2> stride, std::array<int64_t, 2> padding, std::array<int64_t, 2> dilation,
                  bool bias, int64_t generation, const std::vector<OfferedLaunch>& launches,
                  const std::vector<std::pair<int64_t, int64_t>>& workspaces) {
  TORCH_CHECK(op >= kFprop && op <= kWgrad && x_size.size() == 4 && w_size.size() == 4,
              "jitops native offer: a conv2d offer needs an operator 0-2 and 4-D sizes");
  const auto which = static_cast<ConvOperator>(op);
  auto recipe = make_recipe(launches, workspaces,
                            which == kFprop ? kFpropSlots : which == kDgrad ? kDgradSlots : kWgradSlots);
  const ConvKey key = conv_key(which, sample.get_device(), sample.scalar_type(), x_size, w_size,
                               ConvGeometry{stride, padding, dilation}, bias);
  std::lock_guard<std::mutex> hold(table_guard);
  renew(generation);
  conv_recipes.add(key, std::move(recipe));
}

// y = conv2d(x, weight, bias, stride, padding, dilation) (groups 1) through the offered problems, or None: the
// caller then takes the Python path.
py::object conv2d(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias_arg,
                  std::array<int64_t, 2> stride, std::array<int64_t, 2> padding, std::array<int64_t, 2> dilation,
                  int64_t generation) {
  if (generation != table_generation.load(std::memory_order_relaxed) || !driver.launch) return miss();
  const auto bias = bias_arg.has_value() && bias_arg->defined() ? bias_arg : c10::optional<at::Tensor>();
  if (!x.is_cuda() || !weight.is_cuda() || !channels_last_dense(x) || !channels_last_dense(weight) || !plain(x) ||
      !plain(weight)) {
    return miss();
  }
  const auto dtype = x.scalar_type();
  const int device = x.get_device();
  if ((dtype != at::kBFloat16 && dtype != at::kHalf) || weight.scalar_type() != dtype ||
      weight.get_device() != device || weight.size(1) != x.size(1)) {
    return miss();
  }
  if (bias.has_value() && !bias_vector(*bias, weight.size(0), dtype, device)) return miss();
  if (c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getDevice().index() != device) return miss();
  const ConvGeometry g{stride, padding, dilation};
  std::vector<int64_t> output = conv_output_size(x, weight, g);
  if (x.numel() == 0 || weight.numel() == 0 || output[2] <= 0 || output[3] <= 0) return miss();
  const Recipe* fprop =
      conv_recipes.find(conv_key(kFprop, device, dtype, x.sizes(), weight.sizes(), g, bias.has_value()));
  if (!fprop) return miss();
  const bool need_dx = x.requires_grad(), need_dw = weight.requires_grad();
  const bool grad = at::GradMode::is_enabled() && (need_dx || need_dw || (bias.has_value() && bias->requires_grad()));
  if (!grad) {
    at::Tensor y = channels_last_empty(output, x);
    replay(*fprop, device, {x.data_ptr(), weight.data_ptr(), address_of(bias), y.data_ptr()}, x.options());
    return hit(y);
  }
  auto find = [&](ConvOperator which) {
    return conv_recipes.find(conv_key(which, device, dtype, x.sizes(), weight.sizes(), g, false));
  };
  const Recipe* dgrad = need_dx ? find(kDgrad) : nullptr;
  const Recipe* wgrad = need_dw ? find(kWgrad) : nullptr;
  if ((need_dx && !dgrad) || (need_dw && !wgrad)) return miss();
  return hit(ConvFunction::apply(x, weight, bias, fprop, dgrad, wgrad, output, static_cast<int64_t>(device)));
}

}  // namespace jitops_host
