# %% [markdown]
# # Your own op: a CUDA kernel in a cell
#
# We write a small physics step as a CUDA kernel, make it a differentiable PyTorch op with `jitops.op`, check it
# with jitops' op tester, and then edit the kernel and watch the next call recompile.
#
# The op advances particles by one time step under gravity (semi-implicit Euler comes later; we start with the
# plain explicit step):
#
# $$x_{t+1} = x_t + v_t\,\Delta t, \qquad v_{t+1} = v_t + a\,\Delta t, \qquad a = (0, 0, -g)$$
#
# `x` and `v` are tensors of shape `(n, 3)` and get gradients. `gravity` and `dt` are plain Python floats:
# parameters of the step, not inputs to differentiate, so they get no gradient.
#
# The CUDA kernel runs where there is a GPU. So that this notebook also runs (and is tested) on machines
# without one, the op has a CPU twin: the same update compiled as C++ by the machine's C++ compiler. On a GPU
# both run; without one, the CUDA kernel is still compiled (NVRTC needs no GPU), just not launched.

# %%
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

# An empty cache for this notebook alone, so that every run shows the compiles below.  In your own work leave
# JITOPS_CACHE_DIR unset (the cache then lives in ~/.cache/jitops).
CACHE = Path(tempfile.mkdtemp(prefix="jitops-custom-op-"))
os.environ["JITOPS_CACHE_DIR"] = str(CACHE)
os.environ["JITOPS_PROGRESS_SECONDS"] = "0"  # announce every compile, however short

import jitops
from jitops.testing import check_op

GPU = torch.cuda.is_available()
print(f"GPU: {torch.cuda.get_device_name()}" if GPU else
      "No GPU here: the CUDA kernel will be compiled but not run; its C++ twin runs on the CPU.")

# %% [markdown]
# ## The kernel
#
# The update itself is written once, as a function that compiles for the GPU (`__host__ __device__`) and for
# the CPU alike. It is the part we will edit later, so it lives in its own string.

# %%
PHYSICS = r"""
// One coordinate of one particle, one step of explicit Euler.  A: the arithmetic type (float or double).
template <typename A>
HOST_DEVICE inline void particle_update(A x, A v, A accel, A dt, A& x_next, A& v_next) {
  x_next = x + v * dt;
  v_next = v + accel * dt;
}
"""

# %% [markdown]
# The CUDA kernel: one thread per coordinate. It is a template over the element type `T`; `jitops/common.cuh`
# (shipped with jitops) gives `acc_t<T>` (float for fp32, fp16 and bf16, double for fp64) and `load_as` /
# `store_as`, which convert bf16 and fp16 through float. `gravity` and `dt` arrive as kernel arguments, so
# changing them never recompiles.

# %%
CUDA_KERNEL = r"""
template <typename T>
__global__ void particle_step(const T* x, const T* v, T* x_next, T* v_next, double gravity, double dt,
                              long long n) {
  using A = jitops::acc_t<T>;
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= n) return;
  A accel = (i % 3 == 2) ? A(-gravity) : A(0);  // gravity pulls along -z, the third coordinate
  A xn, vn;
  particle_update<A>(jitops::load_as<A>(x[i]), jitops::load_as<A>(v[i]), accel, A(dt), xn, vn);
  x_next[i] = jitops::store_as<T>(xn);
  v_next[i] = jitops::store_as<T>(vn);
}
"""


def cuda_source(physics):
    return '#include "jitops/common.cuh"\n#define HOST_DEVICE __host__ __device__\n' + physics + CUDA_KERNEL


# %% [markdown]
# Its CPU twin: the same update in a loop over the coordinates, parallelised with ATen's `parallel_for` (on
# torch's own threads). `SCALAR_T` is a macro the shape class sets (`-DSCALAR_T=double`). `particle_step` is a
# plain C function over data pointers, which the compiled library exports (`JITOPS_CPU_EXPORT`) and Python
# calls through ctypes: no torch/extension.h, so it compiles in about a second.

# %%
CPU_LOOP = r"""
JITOPS_CPU_EXPORT void particle_step(const SCALAR_T* px, const SCALAR_T* pv, SCALAR_T* pxn, SCALAR_T* pvn,
                                     double gravity, double dt, int64_t n) {
  at::parallel_for(0, n, 16384, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      SCALAR_T accel = (i % 3 == 2) ? SCALAR_T(-gravity) : SCALAR_T(0);
      particle_update<SCALAR_T>(px[i], pv[i], accel, SCALAR_T(dt), pxn[i], pvn[i]);
    }
  });
}
"""


def cpu_source(physics):
    return '#include <ATen/Parallel.h>\n#include "cpu/export.h"\n#define HOST_DEVICE\n' + physics + CPU_LOOP


# %% [markdown]
# ## The op
#
# `jitops.op` takes a `torch.library` schema and five small functions:
#
# - **shape_class** checks the inputs and returns what changes the compiled code: here only the dtype (sizes,
#   `gravity` and `dt` are runtime arguments);
# - **kernels** names the kernels one shape class needs: a `CudaKernel` (NVRTC) or a `CppLibrary` (the C++
#   compiler), bound to the shape class. `entry` names the template instantiation; `signature` gives the
#   kernel's parameter kinds;
# - **run** allocates the outputs and launches: `k.step(grid, block, *kernel arguments)` on the GPU
#   (tensors pass their data pointer), `k.step.particle_step(...)` on the CPU;
# - **fake** gives outputs of the right shape without computing anything (for `torch.compile` and `opcheck`);
# - **setup_context** and **backward**: the step is linear in `x` and `v`, so its backward is two lines of
#   torch. It returns one gradient per tensor argument; jitops gives `gravity` and `dt` none.
#
# The declaration is a function of the physics source so that we can re-declare the op after editing it. In
# your own notebook you would simply edit the cell and run it again.

# %%
def shape_class(x, v, gravity, dt):
    jitops.shapes.check_same_shape("particle_step", ("x", x), ("v", v))
    jitops.shapes.check_same_dtype("particle_step", ("x", x), ("v", v))
    if x.dim() != 2 or x.shape[1] != 3:
        raise ValueError(f"particle_step: x has shape {tuple(x.shape)}; expected (n, 3)")
    allowed = (torch.float32, torch.float64) if x.is_cpu else (torch.float32, torch.float16, torch.bfloat16,
                                                                torch.float64)
    jitops.shapes.check_dtype("particle_step", "x", x, allowed)
    return x.dtype


def run_cuda(k, x, v, gravity, dt):
    x, v = x.contiguous(), v.contiguous()
    x_next, v_next = torch.empty_like(x), torch.empty_like(v)
    n = x.numel()
    if n:
        k.step((n + 255) // 256, 256, x, v, x_next, v_next, gravity, dt, n)  # grid, block, kernel arguments
    return x_next, v_next


def run_cpu(k, x, v, gravity, dt):
    x, v = x.contiguous(), v.contiguous()
    x_next, v_next = torch.empty_like(x), torch.empty_like(v)
    k.step.particle_step(x, v, x_next, v_next, gravity, dt, x.numel())  # tensors pass their data pointer
    return x_next, v_next


def fake(x, v, gravity, dt):
    return torch.empty_like(x, memory_format=torch.contiguous_format), \
        torch.empty_like(v, memory_format=torch.contiguous_format)


def setup_context(ctx, inputs, output):
    ctx.dt = inputs[3]


def backward(ctx, grad_x_next, grad_v_next):
    # x_next = x + v dt and v_next = v + a dt, in both integration schemes of this notebook
    return grad_x_next, grad_v_next + ctx.dt * grad_x_next


def declare(physics):
    cuda_kernel = jitops.CudaKernel("particle_step", jitops.Source.inline("particle_step.cu", cuda_source(physics)),
                                    entry="particle_step<{T}>", signature="ptr ptr ptr ptr f64 f64 i64")
    cpu_kernel = jitops.CppLibrary("particle_step_cpu", jitops.Source.inline("particle_step.cpp", cpu_source(physics)),
                                   functions={"particle_step": (("ptr", "ptr", "ptr", "ptr", "f64", "f64", "i64"), "void")})
    return jitops.op(
        "physics::particle_step(Tensor x, Tensor v, float gravity, float dt) -> (Tensor, Tensor)",
        shape_class=shape_class,
        cuda=jitops.Impl(lambda dtype, target: {"step": cuda_kernel.bind(jitops.shapes.dtype_name(dtype),
                                                                         T=jitops.cuda_type(dtype))}, run_cuda),
        cpu=jitops.Impl(lambda dtype, target: {"step": cpu_kernel.bind(jitops.shapes.dtype_name(dtype),
                                                                       SCALAR_T=jitops.shapes.CPU_TYPES[dtype])},
                        run_cpu),
        fake=fake, setup_context=setup_context, backward=backward,
        doc="One explicit Euler step of particles under gravity: (x, v) -> (x + v dt, v + a dt).")


particle_step = declare(PHYSICS)
print(particle_step.op, "->", torch.ops.physics.particle_step.default._schema)

# %% [markdown]
# ## Compile the CUDA kernel, GPU or not
#
# NVRTC compiles CUDA C++ to a cubin for any architecture without a GPU: this is what
# `python -m cache_tools prewarm` does on a build machine. Here it compiles the kernel for an A100 (`sm_80`),
# whatever GPU this machine has or lacks, in a fraction of a second: a typo in the CUDA source shows up even on
# a laptop.

# %%
def compile_cuda_kernel(op_function, arch, dtype="fp32"):
    """Compile (or find in the cache) the CUDA kernels that one call of the op needs on `arch`."""
    op = op_function.op
    target = jitops.Target.parse(arch)
    example = op.example_args(dtype, [[1, 3], [1, 3]], {"gravity": 9.81, "dt": 0.01})  # meta tensors
    return {name: jitops.runtime.prewarm(request, target) for name, request in op.requests_for(example, target).items()}


jitops.reset_stats()
print("sm_80, fp32:", compile_cuda_kernel(particle_step, "sm_80"))
print(jitops.stats)

# %% [markdown]
# ## Run it
#
# A hundred particles, thrown up and sideways. The first call compiles for this shape class: the CUDA kernel
# for this GPU's architecture, or, without a GPU, the C++ twin (about a second on a small machine). On the CPU
# we use float64: the op tester's gradcheck below needs it, so one compile serves both.

# %%
DEVICE = "cuda" if GPU else "cpu"
DTYPE = torch.float32 if GPU else torch.float64
GRAVITY, DT = 9.81, 0.01

generator = torch.Generator().manual_seed(0)
x0 = torch.zeros(100, 3, dtype=DTYPE).to(DEVICE)
v0 = (torch.rand(100, 3, generator=generator, dtype=DTYPE) * torch.tensor([2.0, 2.0, 10.0], dtype=DTYPE)).to(DEVICE)

jitops.reset_stats()
start = time.perf_counter()
x1, v1 = particle_step(x0, v0, GRAVITY, DT)
print(f"first call on {DEVICE}: {time.perf_counter() - start:.2f} s")
print(jitops.stats)
torch.testing.assert_close(x1, x0 + v0 * DT)
torch.testing.assert_close(v1[:, 2], v0[:, 2] - GRAVITY * DT)

# %% [markdown]
# ## Gradients through a trajectory
#
# Chain 100 steps (one second) and ask how the final height depends on the launch velocity. For explicit
# Euler, $z_N = z_0 + N\,\Delta t\,v_{z,0} - \tfrac{N(N-1)}{2}\,g\,\Delta t^2$, so
# $\partial z_N / \partial v_{z,0} = N\,\Delta t = 1$ for every particle, whatever the gravity. Each of the 100
# calls after the first is a memory hit, and `gravity` got no gradient because it is not a tensor.

# %%
def fly(particle_step, x, v, steps=100):
    for _ in range(steps):
        x, v = particle_step(x, v, GRAVITY, DT)
    return x, v


jitops.reset_stats()
v_launch = v0.clone().requires_grad_()
x_end, _ = fly(particle_step, x0, v_launch)
x_end[:, 2].sum().backward()
print("d z_end / d v_launch, first particles:\n", v_launch.grad[:3])
print(jitops.stats)
torch.testing.assert_close(v_launch.grad[:, 2], torch.ones(100, dtype=DTYPE, device=DEVICE))

# %% [markdown]
# ## Check it with the op tester
#
# `jitops.testing.check_op` runs the op against a reference written in plain torch (computed in float64 on the
# CPU), over dtypes and samples: forward, backward against the reference's gradients, the same with
# non-contiguous inputs, `torch.library.opcheck` (schema, fake kernel, autograd registration) and, for float64,
# `torch.autograd.gradcheck` against finite differences.
#
# On the CPU this checks the C++ twin in float64. The CUDA kernel is checked on a GPU (next cell).

# %%
def reference(x, v, gravity, dt):
    accel = torch.tensor([0.0, 0.0, -gravity], dtype=x.dtype, device=x.device)
    return x + v * dt, v + accel * dt


def samples(dtype, device):
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(n, 3, generator=generator, dtype=dtype).to(device),
             torch.randn(n, 3, generator=generator, dtype=dtype).to(device), gravity, dt)
            for n, gravity, dt in ((1, 9.81, 0.01), (7, 1.62, 0.1), (1000, 3.71, 0.02))]


report = check_op(particle_step, reference, samples=samples, dtypes=[torch.float64], device="cpu")
print(report)
print("\n".join(report.checked[:6]), "\n...")

# %%
if GPU:
    report = check_op(particle_step, reference, samples=samples,
                      dtypes=[torch.float32, torch.bfloat16, torch.float16, torch.float64], device="cuda")
    print(report)
else:
    print("No GPU here: skipping the op tester on the CUDA kernel (fp32, bf16, fp16, fp64).")

# %% [markdown]
# ## Edit the kernel, watch it recompile
#
# Explicit Euler moves each particle with its old velocity. Semi-implicit (symplectic) Euler, the usual
# choice in game and robotics physics, updates the velocity first and moves the particle with the new one; on
# oscillating systems it keeps the energy bounded where explicit Euler lets it grow. The edit is one line of
# `PHYSICS`. The backward stays the same: $x_{t+1}$ is still $x_t + v_t\,\Delta t$, plus a term that depends
# only on gravity.
#
# The source is part of the cache key, so the next call misses and compiles: `compiles` goes from 0 to 1 and
# the progress line shows again.

# %%
PHYSICS_SEMI_IMPLICIT = r"""
// One coordinate of one particle, one step of semi-implicit Euler: velocity first, then position.
template <typename A>
HOST_DEVICE inline void particle_update(A x, A v, A accel, A dt, A& x_next, A& v_next) {
  v_next = v + accel * dt;
  x_next = x + v_next * dt;
}
"""
particle_step = declare(PHYSICS_SEMI_IMPLICIT)  # what re-running the edited declaration cell does

jitops.reset_stats()
x1_new, v1_new = particle_step(x0, v0, GRAVITY, DT)
print(jitops.stats)
assert jitops.stats.compiles == 1
print("height after one step, explicit vs semi-implicit:", x1[0, 2].item(), x1_new[0, 2].item(),
      f"(difference g dt^2 = {GRAVITY * DT * DT:g})")


def reference_semi_implicit(x, v, gravity, dt):
    accel = torch.tensor([0.0, 0.0, -gravity], dtype=x.dtype, device=x.device)
    v_next = v + accel * dt
    return x + v_next * dt, v_next


# On the device in use: float64 for gradcheck, and on a GPU float32 too.
print(check_op(particle_step, reference_semi_implicit, samples=samples,
               dtypes=[torch.float32, torch.float64] if GPU else [torch.float64], device=DEVICE))

# %% [markdown]
# The old kernel is still in the cache: its key (the old source) did not change. Going back to it compiles
# nothing. We also forget the kernels held in memory, so the call has to look on disk: a disk hit.

# %%
particle_step = declare(PHYSICS)
jitops.clear_memory_cache()
jitops.reset_stats()
x1_again, _ = particle_step(x0, v0, GRAVITY, DT)
print(jitops.stats)
assert jitops.stats.compiles == 0 and jitops.stats.disk_hits >= 1
torch.testing.assert_close(x1_again, x1)

# %% [markdown]
# ## A compile error points at your line
#
# A typo in the kernel raises `jitops.CompileError` with the compiler's log and the source lines around the
# first error. NVRTC finds it in a fraction of a second, GPU or not.

# %%
broken = declare(PHYSICS.replace("x_next = x + v * dt;", "x_next = x + v * dt"))  # a missing semicolon
try:
    compile_cuda_kernel(broken, "sm_80")
except jitops.CompileError as error:
    print(error)
particle_step = declare(PHYSICS)  # back to the working op

# %% [markdown]
# This notebook's cache was a temporary directory; the last cell removes it.

# %%
shutil.rmtree(CACHE, ignore_errors=True)
