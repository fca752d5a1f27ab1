// jitops' C++ host path (jitops/native.py builds it with load_inline and hands it the driver): the launches of
// jitops.linear (linear.h), jitops.layer_norm (layer_norm.h) and jitops.conv2d (conv2d.h), and their backwards
// as C++ autograd nodes; and linear's and layer_norm's problems served to torch's dispatcher (dispatch.h:
// torch.compile's graphs, the profiler).
//
// Why: on the H100 machine's host a Linear's forward + backward through Python cost 397-589 us against torch's
// 254-466, mostly the Python around each launch and the Python autograd node, and host-bound models (Llama,
// ViT-B/16) ran behind eager (docs/architecture.md, "Where a step's host time goes").  Here a call is a few
// checks, one hash lookup, its allocations and its cuLaunchKernels; its backward a torch::autograd::Function that
// launches the same way (Llama, all Linears: x0.87-0.99 of eager before, x1.21-1.22 after).
//
// What runs is exactly what the Python path runs: Python offers each problem it launched (its packed Params, or
// its recorded launch sequence) once; a call whose forward (and, when a gradient is to be recorded, backward)
// problems were all offered takes this path, any other returns None and the caller takes the Python path, which
// launches and offers them.  The tables are dropped when jitops.config changes (its generation), since a scope may
// pick other kernels for the same problem.
#include "common.h"
#include "conv2d.h"
#include "dispatch.h"
#include "layer_norm.h"
#include "linear.h"
#include "recipe.h"

namespace jitops_host {

// Offered under another config generation: what the tables hold may be stale (caller holds table_guard).
void renew(int64_t generation) {
  if (generation != table_generation.load()) {
    clear_linear_tables();
    layer_norm_recipes.current.clear();
    conv_recipes.current.clear();
    table_generation = generation;
  }
}

}  // namespace jitops_host

using namespace jitops_host;

// ---- the module's functions --------------------------------------------------------------------------------
void set_driver(int64_t launch_kernel, int64_t ctx_get_current, int64_t ctx_set_current, int64_t device_get,
                int64_t primary_ctx_retain, int64_t memcpy_2d, int64_t memset_2d_16, int64_t stream_is_capturing) {
  driver.launch = reinterpret_cast<LaunchKernel>(launch_kernel);
  driver.ctx_get = reinterpret_cast<CtxGetCurrent>(ctx_get_current);
  driver.ctx_set = reinterpret_cast<CtxSetCurrent>(ctx_set_current);
  driver.device_get = reinterpret_cast<DeviceGet>(device_get);
  driver.primary_retain = reinterpret_cast<PrimaryCtxRetain>(primary_ctx_retain);
  driver.memcpy_2d = reinterpret_cast<Memcpy2DAsync>(memcpy_2d);
  driver.memset_2d_16 = reinterpret_cast<Memset2DD16Async>(memset_2d_16);
  driver.is_capturing = reinterpret_cast<StreamIsCapturing>(stream_is_capturing);
}

std::array<int64_t, 3> counters() {
  std::lock_guard<std::mutex> hold(table_guard);
  const size_t problems = table.size() + layer_norm_recipes.current.size() + conv_recipes.current.size();
  return {hits.load(), misses.load(), static_cast<int64_t>(problems)};
}

void reset_counters() {
  hits = 0;
  misses = 0;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("set_driver", &set_driver);
  m.def("offer", &offer);
  m.def("offer_gelu", &offer_gelu);
  m.def("linear", &linear, py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("activation"),
        py::arg("generation"));
  m.def("offer_layer_norm", &offer_layer_norm);
  m.def("layer_norm", &layer_norm, py::arg("x"), py::arg("n"), py::arg("weight"), py::arg("bias"), py::arg("eps"),
        py::arg("rms"), py::arg("generation"));
  m.def("offer_conv2d", &offer_conv2d);
  m.def("conv2d", &conv2d, py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("stride"), py::arg("padding"),
        py::arg("dilation"), py::arg("generation"));
  m.def("register_dispatch", &register_dispatch);
  m.def("set_generation", &set_generation);
  m.def("counters", &counters);
  m.def("reset_counters", &reset_counters);
}
