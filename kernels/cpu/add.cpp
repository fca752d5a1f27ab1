// jitops.add on the CPU: out = a + b over contiguous buffers.  SCALAR_T comes from the shape class (-D).
#include <ATen/Parallel.h>

void add_forward(at::Tensor a, at::Tensor b, at::Tensor out) {
  const SCALAR_T* pa = a.data_ptr<SCALAR_T>();
  const SCALAR_T* pb = b.data_ptr<SCALAR_T>();
  SCALAR_T* po = out.data_ptr<SCALAR_T>();
  // 32768 elements a task: below that, threading costs more than it saves.
  at::parallel_for(0, a.numel(), 32768, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) po[i] = pa[i] + pb[i];
  });
}
