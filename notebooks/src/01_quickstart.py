# %% [markdown]
# # jitops quickstart: compile once, reuse everywhere
#
# A jitops op carries its own kernel source. The first call for a new **shape class** (the few input facts that
# change the compiled code: dtype, vector width from the alignment, a mode argument...) compiles the kernel and
# stores the binary in an on-disk cache. Every later call finds it: in this process through a dictionary lookup,
# in a new process by loading it from disk.
#
# This notebook shows, with the `jitops.stats` counters at each step:
#
# 1. the first call does not wait for its compile: in a notebook jitops compiles in the background
#    (`JITOPS_COMPILE=background`) and runs torch's own implementation meanwhile; the second call, once the
#    kernel is ready, runs it;
# 2. a fresh Python process finds the kernel on disk (a *disk hit*) and compiles nothing;
# 3. gradients flow through jitops ops like through any PyTorch op;
# 4. `python -m cache_tools list` shows what the cache holds.
#
# It runs on any machine. With a GPU, the CUDA kernels run (NVRTC compiles each in a fraction of a second).
# Without one, jitops' CPU kernels run instead: C++ compiled by the machine's C++ compiler, about a second a
# kernel on a small machine.

# %%
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

# An empty cache for this notebook alone, so that the first call below compiles every time the notebook runs.
# In your own work leave JITOPS_CACHE_DIR unset: the cache then lives in ~/.cache/jitops and outlives restarts.
CACHE = Path(tempfile.mkdtemp(prefix="jitops-quickstart-"))
os.environ["JITOPS_CACHE_DIR"] = str(CACHE)
# Announce every compile, however short. The default (1 s) announces only the slow ones.
os.environ["JITOPS_PROGRESS_SECONDS"] = "0"
# A notebook never stalls on a compile: a call whose kernel is not built yet runs torch's implementation while
# the kernel compiles in a background pool (with a progress bar), and later calls switch to it. Scripts and
# benchmarks keep the default, "blocking", where the first call waits for its kernel.
os.environ["JITOPS_COMPILE"] = "background"

import jitops  # reads its JITOPS_* variables when it uses them: importing it earlier would work as well

if torch.cuda.is_available():
    DEVICE, DTYPE = "cuda", torch.bfloat16
    print(f"GPU: {torch.cuda.get_device_name()}. The CUDA kernels run.")
else:
    DEVICE, DTYPE = "cpu", torch.float32
    print("No GPU here: jitops' CPU kernels (C++ built by the C++ compiler) run instead of the CUDA ones.")
print(f"jitops {jitops.__version__}, torch {torch.__version__}, cache {jitops.config.cache_dir}")


def sync():
    """Wait for the GPU, so that the timings below include the kernel itself."""
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def sh(command, **env):
    """Run a command line as in a terminal (`python` is this notebook's interpreter) with extra environment
    variables, print its output, and return its exit code."""
    args = shlex.split(command)
    if args[0] == "python":
        args[0] = sys.executable
    result = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **env})
    print(result.stdout, end="")
    return result.returncode


# %% [markdown]
# ## 1. The first call does not wait for its compile
#
# `jitops.gelu` maps its input to a shape class and finds no kernel for it in memory or on disk. It hands the
# compile to a background worker and returns torch's own `gelu` at once (`fallbacks` counts such calls); a
# progress bar shows what is compiling. `jitops.wait()` blocks until the compile queue is empty.

# %%
x = torch.randn(1024, 1024, device=DEVICE, dtype=DTYPE)

jitops.reset_stats()
start = time.perf_counter()
y = jitops.gelu(x, approximate="tanh")
sync()
print(f"first call: {time.perf_counter() - start:.3f} s (torch's gelu, while the kernel compiles)")
assert jitops.stats.fallbacks == 1 and jitops.stats.background_compiles >= 1
torch.testing.assert_close(y, F.gelu(x, approximate="tanh"))

start = time.perf_counter()
jitops.wait()
print(f"the compile finished {time.perf_counter() - start:.1f} s later")
y = jitops.gelu(x, approximate="tanh")  # from now on, the compiled kernel
print(jitops.stats)
assert jitops.stats.compiles >= 1 and jitops.stats.fallbacks == 1

# %% [markdown]
# ## 2. The second call is a dictionary lookup
#
# The op keeps the loaded kernels of each shape class it has seen in a dictionary, so the second call costs one
# lookup plus the kernel's own run time (torch's gelu on the same tensor is printed for scale; jitops' CPU
# kernels are plain C++ loops, the CUDA ones are the tuned kernels). `memory_hits` goes up, nothing else does.
# A tensor of another size is in the same shape class (the size is a runtime argument of the kernel), so it
# compiles nothing either.

# %%
jitops.reset_stats()
start = time.perf_counter()
y2 = jitops.gelu(x, approximate="tanh")
sync()
ours = time.perf_counter() - start
start = time.perf_counter()
F.gelu(x, approximate="tanh")
sync()
theirs = time.perf_counter() - start
print(f"second call: {ours * 1e3:.2f} ms; torch's gelu on the same tensor: {theirs * 1e3:.2f} ms")

odd = torch.randn(7, 1000, device=DEVICE, dtype=DTYPE)
jitops.gelu(odd, approximate="tanh")
print(jitops.stats)
assert jitops.stats.compiles == 0 and jitops.stats.memory_hits == 2

reference = F.gelu(x.double(), approximate="tanh")
print(f"largest difference from torch's gelu in float64: {(y2.double() - reference).abs().max().item():.1e}")

# %% [markdown]
# What a hot call costs, on a tensor so small that the kernel itself takes no time: the per-call overhead of
# jitops next to torch's own `gelu`. (jitops' hot path is tuned for CUDA tensors; its CPU kernels are there so
# that everything runs everywhere.)

# %%
tiny = torch.randn(8, device=DEVICE, dtype=DTYPE)


def per_call_us(fn, calls=2000):
    fn()
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - start) / calls * 1e6


ours = per_call_us(lambda: jitops.gelu(tiny, approximate="tanh"))
theirs = per_call_us(lambda: F.gelu(tiny, approximate="tanh"))
print(f"hot call: jitops.gelu {ours:.1f} us, torch gelu {theirs:.1f} us")

# %% [markdown]
# ## 3. A fresh process: a disk hit
#
# A new Python process starts with empty dictionaries, but the kernel is on disk. The process below (the same
# `JITOPS_CACHE_DIR`, inherited through the environment) loads it: `disk_hits` goes up and `compiles` stays 0,
# and the first call takes milliseconds where the compile took seconds. Before loading, jitops checks the
# entry's sha256, so a damaged file is rebuilt rather than run.

# %%
FRESH_PROCESS = """
import json, sys, time
import torch, jitops

device, dtype = sys.argv[1], getattr(torch, sys.argv[2])
x = torch.randn(1024, 1024, device=device, dtype=dtype)  # torch and the GPU are ready before the clock starts
start = time.perf_counter()
y = jitops.gelu(x, approximate="tanh")
if device == "cuda":
    torch.cuda.synchronize()
print(f"first call in a fresh process: {(time.perf_counter() - start) * 1e3:.1f} ms")
print(json.dumps(jitops.stats.as_dict()))
"""
result = subprocess.run([sys.executable, "-c", FRESH_PROCESS, DEVICE, str(DTYPE).removeprefix("torch.")],
                        capture_output=True, text=True)
print(result.stdout + result.stderr, end="")
fresh = json.loads(result.stdout.splitlines()[-1])
assert result.returncode == 0 and fresh["disk_hits"] >= 1 and fresh["compiles"] == 0

# %% [markdown]
# ## 4. Gradients
#
# jitops ops are registered with `torch.library`, with a backward. Autograd records them like any other op (the
# node is named after the op), and the backward is a jitops op too: `jitops.gelu_backward`.
#
# On a GPU the backward is its own NVRTC kernel, so its first use compiles once more (in the background: this
# backward runs torch's gelu backward meanwhile). On the CPU, one compiled C++ extension holds both the forward
# and the backward function, so the backward compiles nothing.

# %%
jitops.reset_stats()
xg = torch.randn(1024, 1024, device=DEVICE, dtype=DTYPE, requires_grad=True)
y = jitops.gelu(xg, approximate="tanh")
print("grad_fn:", y.grad_fn)
y.sum().backward()

x64 = xg.detach().double().requires_grad_()
F.gelu(x64, approximate="tanh").sum().backward()
print(f"largest difference of the gradient from torch's in float64: "
      f"{(xg.grad.double() - x64.grad).abs().max().item():.1e}")
print(jitops.stats)

# %% [markdown]
# ## 5. What the cache holds
#
# `python -m cache_tools` is the command line over the cache (prewarm, list, verify, prune, export/import,
# explain, info). `list` shows one row per compiled kernel: the op, the kernel, the target arch (`cpu` for the
# CPU kernels), the dtype, the shape class, the size on disk, how long it took to compile and when it was
# last used.

# %%
assert sh(f"python -m cache_tools list --cache-dir {CACHE}") == 0

# %% [markdown]
# ## Where next
#
# - `02_custom_op.ipynb`: write your own CUDA kernel in a cell and make it a differentiable, cached op.
# - `03_deploy_prewarm.ipynb`: prewarm a cache on a build machine and run a deployment that never compiles.
# - `04_performance.ipynb`: cold, warm and hot latency, and throughput against torch, from the benchmarks.
#
# This notebook's cache was a temporary directory; the last cell removes it.

# %%
shutil.rmtree(CACHE, ignore_errors=True)
