"""The image's workload: runs the ops and fails if anything had to compile (it cannot: JITOPS_OFFLINE=1)."""
import torch

import jitops

device = "cuda" if torch.cuda.is_available() else "cpu"
dtype = torch.bfloat16 if device == "cuda" else torch.float32
x = torch.randn(4096, 8192, device=device, dtype=dtype)
y = jitops.gelu(x, approximate="tanh")
torch.testing.assert_close(y, torch.nn.functional.gelu(x, approximate="tanh"), atol=2e-2, rtol=2e-2)
print(f"{device}: {jitops.stats.as_dict()}")
assert jitops.stats.compiles == 0, "the image compiled at run time"
