"""The core's CUDA path on a real GPU: the built-in ops against torch for every dtype, gradients, opcheck,
torch.compile, streams, threads, alignment classes, and cold-then-warm across processes."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import jitops
from jitops.testing import check_compile, check_op
from proc_helpers import child_env

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parent.parent
SIZES = [(1,), (7,), (1000,), (4097,), (3, 5, 7), (0,), (257, 4099)]
CUDA_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def unary(extra):
    def samples(dtype, device):
        g = torch.Generator().manual_seed(0)
        return [(torch.randn(s, generator=g, dtype=torch.float32).to(device, dtype), extra) for s in SIZES]
    return samples


def binary(dtype, device):
    g = torch.Generator().manual_seed(1)
    return [tuple(torch.randn(s, generator=g).to(device, dtype) for _ in range(2)) for s in SIZES]


def test_add_cuda_all_dtypes():
    check_op(jitops.add, torch.add, samples=binary, dtypes=CUDA_DTYPES, device="cuda", compile=True)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_cuda_all_dtypes(approximate):
    check_op(jitops.gelu, lambda x, a: F.gelu(x, approximate=a), samples=unary(approximate),
             dtypes=CUDA_DTYPES, device="cuda", compile=True)


def test_compile_with_inductor():
    x = torch.randn(4096, device="cuda", requires_grad=True)
    check_compile(lambda t: jitops.gelu(jitops.add(t, t), "tanh"), (x,), "add+gelu", backend="inductor")


@pytest.mark.parametrize("offset", [1, 2, 3, 4])
def test_misaligned_views_pick_a_narrower_vector_class(offset):
    base = torch.randn(10_000, device="cuda", dtype=torch.bfloat16)
    x = base[offset:]
    assert x.data_ptr() % 16
    torch.testing.assert_close(jitops.gelu(x, "tanh"), F.gelu(x.float(), approximate="tanh").bfloat16(),
                               rtol=1.6e-2, atol=1.6e-2)


def test_generic_then_generated_launcher_give_the_same_results():
    """A kernel's first launches go through the generic launcher, later ones through the generated one (and
    CuPy's driver binding once imported): every launch along the way computes the same thing."""
    from jitops.launch import _TIER_UP_LAUNCHES

    jitops.clear_memory_cache()
    a = torch.randn(1 << 16, device="cuda", dtype=torch.float16)
    b = torch.randn(1 << 16, device="cuda", dtype=torch.float16)
    first = jitops.add(a, b)
    kernel = jitops.add.op._memo[(0, jitops.add.op.shape_class(a, b))].forward
    assert kernel.launch == kernel._launch_generic
    outputs = [jitops.add(a, b) for _ in range(2 * _TIER_UP_LAUNCHES)]
    assert kernel.launch != kernel._launch_generic
    expected = (a.float() + b.float()).half()
    for out in [first, *outputs]:
        torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_runs_on_torchs_current_stream():
    x = torch.randn(1 << 22, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        y = jitops.gelu(x)
        z = jitops.add(y, y)
    stream.synchronize()
    torch.testing.assert_close(z, 2 * F.gelu(x))


def test_launch_from_a_fresh_thread():
    x = torch.randn(1000, device="cuda")
    jitops.gelu(x)  # loaded on the main thread
    result = {}

    def worker():
        result["y"] = jitops.gelu(x)
        torch.cuda.synchronize()

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    torch.testing.assert_close(result["y"], F.gelu(x))


def test_backward_on_autograd_thread_and_only_needed_grads():
    a = torch.randn(513, device="cuda", requires_grad=True)
    b = torch.randn(513, device="cuda")
    y = jitops.gelu(jitops.add(a, b), "tanh")
    assert y.grad_fn is not None
    y.sum().backward()
    expected = torch.autograd.grad(F.gelu(a + b, approximate="tanh").sum(), a)[0]
    torch.testing.assert_close(a.grad, expected)
    assert b.grad is None


COLD_WARM = r"""
import json, time, torch, jitops
torch.cuda.init(); torch.zeros(1, device="cuda"); torch.cuda.synchronize()
x = torch.randn(1 << 20, device="cuda", dtype=torch.bfloat16)
t0 = time.perf_counter()
y = jitops.gelu(x, "tanh"); torch.cuda.synchronize()
ms = (time.perf_counter() - t0) * 1e3
ok = torch.allclose(y.float(), torch.nn.functional.gelu(x.float(), approximate="tanh"), rtol=2e-2, atol=2e-2)
print(json.dumps({"ok": bool(ok), "ms": ms, **jitops.stats.as_dict()}))
"""


def test_cold_then_warm_in_a_fresh_process(tmp_path):
    env = child_env(JITOPS_CACHE_DIR=str(tmp_path / "cache"))
    runs = [json.loads(subprocess.run([sys.executable, "-c", COLD_WARM], env=env, capture_output=True, text=True,
                                      check=True).stdout.strip().splitlines()[-1]) for _ in range(2)]
    cold, warm = runs
    assert cold["ok"] and warm["ok"]
    assert (cold["compiles"], cold["disk_hits"]) == (1, 0)
    assert (warm["compiles"], warm["disk_hits"]) == (0, 1)


def test_offline_image_runs_prewarmed_cache_with_zero_compiles(tmp_path):
    """Prewarm on this machine into a directory, then a fresh offline process uses it read-only."""
    image = tmp_path / "image"
    code = ("import jitops; from jitops.specs import Target; op = jitops.find('gelu');"
            "args = op.example_args('bf16', [[4096]], {'approximate': 'tanh'});"
            "t = Target.parse('sm_90');"
            "[jitops.runtime.prewarm(r, t) for r in op.requests_for(args, t).values()]")
    subprocess.run([sys.executable, "-c", code], check=True, env=child_env(JITOPS_CACHE_DIR=str(image)))
    env = child_env(JITOPS_CACHE_PATH=str(image), JITOPS_CACHE_DIR=str(tmp_path / "empty"), JITOPS_OFFLINE="1")
    out = subprocess.run([sys.executable, "-c", COLD_WARM.replace("1 << 20", "4096")], env=env, capture_output=True,
                         text=True, check=True).stdout.strip().splitlines()[-1]
    result = json.loads(out)
    assert result["ok"] and result["compiles"] == 0 and result["disk_hits"] == 1


def test_readme_custom_op_example_runs(tmp_path):
    from test_readme import readme_blocks
    namespace: dict = {}
    for block in readme_blocks():
        exec(block, namespace)  # noqa: S102 - the README's own example
