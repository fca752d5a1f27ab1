"""The deployment flow of examples/deploy/Dockerfile without docker, and prewarm racing normal use.

These build CPU kernels (the cxx backend, about a second each on 2 cores).  The deployment test prewarms into the
session cache, so the CPU op tests that run after it find their kernels there."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cache_tools_helpers import entry_dirs, snapshot, write_manifest
from proc_helpers import child_env

REPO = Path(__file__).resolve().parent.parent

# What the image runs: the built-in ops on the CPU (the runtime stage of a GPU image would run them on the GPU).
# Public ops: each item builds the forward and the backward (gelu's backward is gelu_backward's kernels).
DEPLOY_ITEMS = [
    {"op": "gelu", "dtypes": ["fp32", "fp64"], "shapes": [[[1000, 257]]], "kwargs": {"approximate": a}}
    for a in ("none", "tanh")
] + [
    {"op": "add", "dtypes": ["fp32", "fp64"], "shapes": [[[1000, 257], [1000, 257]]]},
]

RUN_OPS = r"""
import json, torch, torch.nn.functional as F, jitops
ok = True
for dtype in (torch.float32, torch.float64):
    x = torch.randn(1000, 257, dtype=dtype, requires_grad=True)
    y = torch.randn(1000, 257, dtype=dtype)
    for approximate in ("none", "tanh"):
        ok &= torch.allclose(jitops.gelu(x, approximate=approximate), F.gelu(x, approximate=approximate), atol=1e-5)
    jitops.gelu(x, approximate="tanh").sum().backward()
    ok &= torch.allclose(x.grad, torch.autograd.grad(F.gelu(x, approximate="tanh").sum(), x)[0], atol=1e-5)
    ok &= torch.equal(jitops.add(x.detach(), y), x.detach() + y)
print(json.dumps(dict(jitops.stats.as_dict(), ok=bool(ok))))
"""


def _run(argv, env, timeout=1500):
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=timeout)


@pytest.mark.timeout(1800)
def test_prewarmed_directory_serves_an_offline_process_with_zero_compiles(session_cache, tmp_path):
    image_cache = session_cache  # the build stage's /opt/jitops-cache
    manifest = write_manifest(tmp_path / "kernels.json", *DEPLOY_ITEMS, archs=["sm_90a", "cpu"])

    # Build stage (a machine with the toolchain and no GPU): prewarm into the directory, check coverage.
    build = child_env()
    done = _run([sys.executable, "-m", "cache_tools", "prewarm", "--manifest", str(manifest), "--cache-dir",
                 str(image_cache), "--json"], build)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert {r["outcome"] for r in report["results"]} <= {"compiled", "cached"}
    assert {r["arch"] for r in report["results"]} == {"sm_90", "cpu"}
    assert sum(r["backend"] == "cxx" for r in report["results"]) == 4   # gelu_cpu and add_cpu, fp32/fp64
    assert sum(r["backend"] == "nvrtc" for r in report["results"]) == 10  # gelu 4, gelu_backward 4, add 2
    checked = _run([sys.executable, "-m", "cache_tools", "verify", "--manifest", str(manifest), "--cache-dir",
                    str(image_cache)], build)
    assert checked.returncode == 0 and "14 of 14 kernels cached" in checked.stdout, checked.stdout + checked.stderr

    # Runtime stage: the directory as a read-only root, offline, no writable root, and no compiler on PATH.
    before = snapshot(image_cache)
    runtime_env = child_env(JITOPS_CACHE_PATH=str(image_cache), JITOPS_OFFLINE="1", JITOPS_CACHE_DIR="",
                            JITOPS_CUDA_HOME=str(tmp_path / "no-cuda"), PATH=str(tmp_path / "empty-bin"),
                            HOME=str(tmp_path / "home"))
    ran = _run([sys.executable, "-c", RUN_OPS], runtime_env)
    assert ran.returncode == 0, ran.stderr
    stats = json.loads(ran.stdout.strip().splitlines()[-1])
    assert stats["ok"]
    assert stats["compiles"] == 0 and stats["failed_compiles"] == 0 and stats["corrupt_entries"] == 0
    assert stats["disk_hits"] == 4  # gelu_cpu (forward and backward share it) and add_cpu, fp32 and fp64
    # The GPU kernels are there for the GPU image: a call there would find every one of them.
    covered = _run([sys.executable, "-m", "cache_tools", "verify", "--manifest", str(manifest), "--arch", "sm_90a",
                    "--json"], runtime_env)
    assert covered.returncode == 0, covered.stderr
    assert json.loads(covered.stdout)["coverage"] == {"covered": 10, "missing": []}
    assert snapshot(image_cache) == before  # a read-only root is never written: no stamps, no locks
    assert not (tmp_path / "home").exists()  # and nothing went to a default cache dir


PREWARM_WHILE_USED = r"""
import json, sys, torch, jitops
x = torch.linspace(-3, 3, 5000, dtype=torch.float64)
want = torch.nn.functional.gelu(x, approximate="tanh")
ok = True
for _ in range(20):                 # load again and again while the prewarm publishes entries beside
    jitops.clear_memory_cache()
    ok &= torch.allclose(jitops.gelu(x, "tanh"), want, rtol=1e-12, atol=1e-12)
print(json.dumps(dict(jitops.stats.as_dict(), ok=bool(ok))))
"""


@pytest.mark.timeout(1800)
def test_prewarm_and_normal_use_at_the_same_time_on_one_cache(tmp_path):
    cache = tmp_path / "shared"
    gpu = [{"op": op, "dtypes": ["fp32", "fp16", "bf16"], "shapes": [shapes], "kwargs": kwargs}
           for op, shapes, kwargs in (("gelu", [[4096]], {"approximate": "tanh"}),
                                      ("gelu_backward", [[4096], [4096]], {"approximate": "tanh"}),
                                      ("add", [[4096], [4096]], {}))]
    manifest = write_manifest(tmp_path / "m.json", *gpu, dict(gpu[0], dtypes=["fp64"], archs=["cpu"]),
                              archs=["sm_80", "sm_90a"])
    env = child_env(JITOPS_CACHE_DIR=str(cache))
    prewarm = subprocess.Popen([sys.executable, "-m", "cache_tools", "prewarm", "--manifest", str(manifest),
                                "--json", "--jobs", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env, cwd=REPO)
    user = subprocess.Popen([sys.executable, "-c", PREWARM_WHILE_USED], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    user_out, user_err = user.communicate(timeout=1500)
    prewarm_out, prewarm_err = prewarm.communicate(timeout=1500)
    assert user.returncode == 0, user_err
    assert prewarm.returncode == 0, prewarm_err
    used = json.loads(user_out.strip().splitlines()[-1])
    report = json.loads(prewarm_out)
    assert used["ok"] and used["failed_compiles"] == 0 and used["corrupt_entries"] == 0
    cpu = [r for r in report["results"] if r["arch"] == "cpu"]
    assert len(cpu) == 1 and len(report["results"]) == 19
    # One compile of the shared kernel between the two processes: the other waited for it, then loaded it.
    assert used["compiles"] + (cpu[0]["outcome"] == "compiled") == 1
    assert len(entry_dirs(cache)) == 19
    from cache_tools.cli import main
    assert main(["verify", "--cache-dir", str(cache)]) == 0
    assert list((cache / "v1" / "tmp").iterdir()) == []


@pytest.mark.timeout(900)
def test_two_prewarms_of_one_manifest_at_once_compile_each_kernel_once(tmp_path):
    cache = tmp_path / "shared"
    items = [{"op": "gelu", "grad": False, "dtypes": ["fp32", "fp16", "bf16"], "shapes": [[[4096]]],
              "kwargs": {"approximate": a}} for a in ("none", "tanh")]
    manifest = write_manifest(tmp_path / "m.json", *items, archs=["sm_80", "sm_90a"])
    env = child_env(JITOPS_CACHE_DIR=str(cache))
    runs = [subprocess.Popen([sys.executable, "-m", "cache_tools", "prewarm", "--manifest", str(manifest), "--json",
                              "--jobs", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                             cwd=REPO) for _ in range(2)]
    reports = []
    for run in runs:
        out, err = run.communicate(timeout=800)
        assert run.returncode == 0, err
        reports.append(json.loads(out))
    outcomes = [r["outcome"] for report in reports for r in report["results"]]
    assert len(outcomes) == 24 and outcomes.count("compiled") == 12 and outcomes.count("cached") == 12
    assert len(entry_dirs(cache)) == 12
    from cache_tools.cli import main
    assert main(["verify", "--cache-dir", str(cache)]) == 0


def test_the_deploy_example_manifest_and_dockerfile_stay_in_step():
    """examples/deploy cannot run here (no docker registry); its manifest must still plan, and the Dockerfile must
    prewarm, verify, and run offline from a read-only root without a compiler."""
    from cache_tools.manifest import load_manifest, plan

    example = REPO / "examples" / "deploy"
    jobs = plan(load_manifest(example / "kernels.json")).jobs
    assert {j.arch for j in jobs} == {"sm_90", "cpu"}
    dockerfile = (example / "Dockerfile").read_text()
    build, runtime_stage = dockerfile.split("AS runtime", 1)
    assert "AS build" in build and "jitops-cache prewarm --manifest" in build and "jitops-cache verify" in build
    assert "COPY --from=build /opt/jitops-cache /opt/jitops-cache" in runtime_stage
    assert "JITOPS_CACHE_PATH=/opt/jitops-cache" in runtime_stage and "JITOPS_OFFLINE=1" in runtime_stage
    assert "-runtime-" in dockerfile.split("AS runtime")[0].splitlines()[-1]  # a base image without nvcc
    assert "g++" not in runtime_stage and "nvcc]" not in runtime_stage
    for name in ("kernels.json", "app.py"):
        assert f"examples/deploy/{name}" in dockerfile and (example / name).is_file()
