"""cache_tools: prewarm, list, verify, prune, explain, info and the command line itself.

Most tests use NVRTC kernels (well under a second each, no GPU); the CPU (cxx) path is covered in
test_cache_tools_deploy.py, which shares the session cache with the other CPU tests."""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import filelock
import pytest
import torch

import jitops
from cache_tools import manifest as manifest_module
from cache_tools.common import UsageError, parse_age, parse_size
from cache_tools.progress import Progress
from jitops.specs import Target

from cache_tools_helpers import GELU_ITEM, cli, cli_json, entry_dirs, snapshot, write_manifest

REPO = Path(__file__).resolve().parent.parent
ADD_ITEM = {"op": "add", "dtypes": ["fp16"], "shapes": [[[256], [256]]]}

# ---- ops that exist only for these tests --------------------------------------------------------------------------
# A load_inline CUDA kernel: cannot be built where torch has no CUDA (this CPU-only test machine).
_CUDA_EXT = jitops.CppExtension("tools_cuda_ext", jitops.Source.inline("tools_cuda_ext.cu", "// device code\n"),
                                functions=("run",), cuda=True)
cuda_ext = jitops.op("cachetoolstest::cuda_ext(Tensor x) -> Tensor", shape_class=lambda x: x.dtype,
                     cuda=jitops.Impl(lambda cls, target: {"ext": _CUDA_EXT.bind(jitops.shapes.dtype_name(cls))},
                                      lambda k, x: x),
                     fake=lambda x: torch.empty_like(x))
# An NVRTC kernel that does not compile.
_BROKEN = jitops.CudaKernel("tools_broken", jitops.Source.inline("tools_broken", "this is not CUDA;\n"),
                            "broken<{T}>", "ptr")
broken = jitops.op("cachetoolstest::broken(Tensor x) -> Tensor", shape_class=lambda x: x.dtype,
                   cuda=jitops.Impl(lambda cls, target: {"k": _BROKEN.bind(jitops.shapes.dtype_name(cls), T="float")},
                                    lambda k, x: x),
                   fake=lambda x: torch.empty_like(x))


@pytest.fixture(scope="module")
def base_cache(tmp_path_factory) -> Path:
    """Three NVRTC entries for sm_80 (gelu bf16 and fp32, add fp16), compiled once for this module."""
    root = tmp_path_factory.mktemp("base") / "cache"
    manifest = write_manifest(root.parent / "m.json", GELU_ITEM, ADD_ITEM, archs=["sm_80"])
    assert jitops_cache("prewarm", "--manifest", manifest, "--cache-dir", root, "--no-progress") == 0
    assert len(entry_dirs(root)) == 3
    return root


def jitops_cache(*argv) -> int:
    from cache_tools.cli import main
    return main([str(a) for a in argv])


@pytest.fixture
def cache(base_cache, tmp_path) -> Path:
    """A private copy of the base cache."""
    root = tmp_path / "cache"
    shutil.copytree(base_cache, root)
    return root


# ---- prewarm -------------------------------------------------------------------------------------------------------
def test_prewarm_manifest_compiles_then_reports_already_cached(tmp_path, capsys):
    manifest = write_manifest(tmp_path / "m.json", GELU_ITEM, archs=["sm_90a"])
    root = tmp_path / "cache"
    code, out, err = cli(capsys, "prewarm", "--manifest", manifest, "--cache-dir", root)
    assert code == 0, err
    assert "arch" in out and "compiled" in out and "already cached" in out and "cannot build here" in out
    assert "[1/2] compiled" in err and "[2/2] compiled" in err  # plain progress lines: stderr is not a terminal
    assert len(entry_dirs(root)) == 2
    code, report = cli_json(capsys, "prewarm", "--manifest", manifest, "--cache-dir", root)
    assert code == 0 and report["ok"]
    assert [r["outcome"] for r in report["results"]] == ["cached", "cached"]
    assert report["summary"][-1] == {"arch": "total", "compiled": 0, "cached": 2, "failed": 0, "unbuildable": 0,
                                     "skipped": 0, "seconds": report["summary"][-1]["seconds"]}
    # gelu uses no arch-specific instructions: built for the portable sm_90, which an sm_90 device loads
    assert {r["arch"] for r in report["results"]} == {"sm_90"}


def test_prewarm_command_line_arch_overrides_the_manifest(tmp_path, capsys):
    manifest = write_manifest(tmp_path / "m.json", dict(GELU_ITEM, dtypes=["fp16"]), archs=["sm_90a"])
    code, report = cli_json(capsys, "prewarm", "--manifest", manifest, "--cache-dir", tmp_path / "c",
                            "--arch", "sm_80", "--arch", "sm_86")
    assert code == 0
    assert sorted(r["arch"] for r in report["results"]) == ["sm_80", "sm_86"]


def test_prewarm_yaml_manifest(tmp_path, capsys):
    pytest.importorskip("yaml")
    manifest = tmp_path / "m.yaml"
    manifest.write_text("archs: [sm_80]\nops:\n  - op: gelu\n    dtypes: [fp16]\n    shapes: [[[64, 64]]]\n"
                        "    kwargs: {approximate: none}\n")
    code, report = cli_json(capsys, "prewarm", "--manifest", manifest, "--cache-dir", tmp_path / "c")
    assert code == 0 and [r["label"] for r in report["results"]] == ["jitops::gelu_forward<__half, 8, 0, int>",
                                                                      "jitops::gelu_backward<__half, 8, 0, int>"]


def test_yaml_manifest_without_pyyaml_says_what_to_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "yaml", None)
    manifest = tmp_path / "m.yml"
    manifest.write_text("ops: []\n")
    code, out, err = cli(capsys, "prewarm", "--manifest", manifest, "--cache-dir", tmp_path / "c")
    assert code == 2 and "pip install pyyaml" in err


def test_prewarm_all_builtin_builds_every_prewarm_item(tmp_path, capsys):
    from jitops.ops import PREWARM

    target = Target.parse("sm_80")
    expected = set()
    for item in PREWARM:  # public ops: each item builds its calls' kernels and their backward's
        public = jitops.find_public(item["op"])
        for dtype in item["dtypes"]:
            for index, shapes in enumerate(item["shapes"]):
                strides = item["strides"][index] if "strides" in item else None
                entry, shapes, kwargs = public.form(shapes, item.get("kwargs", {}))
                args = entry.example_args(dtype, shapes, kwargs, strides)
                for op, op_args in public.calls(entry, args):
                    expected |= {r.label() for r in op.requests_for(op_args, target).values()}
    assert any("backward" in label for label in expected)
    code, report = cli_json(capsys, "prewarm", "--all-builtin", "--arch", "sm_80", "--cache-dir", tmp_path / "c",
                            "--jobs", "2")
    assert code == 0
    assert {r["label"] for r in report["results"]} == expected
    assert {r["outcome"] for r in report["results"]} == {"compiled"}
    assert report["jobs"] == 2


def test_all_builtin_follows_jitops_ops_prewarm(tmp_path, capsys, monkeypatch):
    """Teammates' ops add their items to jitops.ops.PREWARM; --all-builtin must just iterate it."""
    import jitops.ops

    monkeypatch.setattr(jitops.ops, "PREWARM", [dict(ADD_ITEM, dtypes=["bf16"])])
    code, report = cli_json(capsys, "prewarm", "--all-builtin", "--arch", "sm_80", "--cache-dir", tmp_path / "c")
    assert code == 0 and [r["label"] for r in report["results"]] == ["jitops::add_forward<__nv_bfloat16, 8>"]


def test_prewarm_list_names_every_kernel_and_builds_nothing(tmp_path, capsys):
    """--list: the kernels a source covers, with the public op, the op asking and the shape class; no compiler
    runs and the cache stays untouched, even for an arch this machine could not build for."""
    manifest = write_manifest(tmp_path / "m.json", dict(GELU_ITEM, dtypes=["bf16", "fp16"]),
                              {"op": "layer_norm", "dtypes": ["bf16"],
                               "shapes": [[[64, 512], [512], [512]]], "kwargs": {"normalized_shape": [512]}})
    cache = tmp_path / "c"
    code, listed = cli_json(capsys, "prewarm", "--manifest", manifest, "--arch", "sm_90a", "--list",
                            "--cache-dir", cache)
    assert code == 0 and not cache.exists()
    kernels = listed["kernels"]
    assert {k["op"] for k in kernels} == {"gelu", "layer_norm"} and not any(k["cached"] for k in kernels)
    # layer_norm's public item covers the no-grad path and the backward (a kernel two ops share is listed once)
    assert {"layer_norm_backward", "layer_norm_inference"} <= {k["kernel_op"] for k in kernels if k["op"] == "layer_norm"}
    assert all(k["arch"].startswith("sm_90") and "Class" in k["shape_class"] for k in kernels)
    # after a real prewarm of the same manifest, the list says every kernel is cached
    assert cli_json(capsys, "prewarm", "--manifest", manifest, "--arch", "sm_90a", "--cache-dir", cache)[0] == 0
    code, listed = cli_json(capsys, "prewarm", "--manifest", manifest, "--arch", "sm_90a", "--list",
                            "--cache-dir", cache)
    assert code == 0 and len(listed["kernels"]) == len(kernels) and all(k["cached"] for k in listed["kernels"])
    code, text, _ = cli(capsys, "prewarm", "--manifest", manifest, "--arch", "sm_90a", "--list", "--cache-dir", cache)
    assert code == 0 and f"{len(kernels)} kernels on" in text and "nothing was built" in text


def test_all_builtin_on_cpu_skips_what_the_cpu_path_does_not_build(capsys, monkeypatch, tmp_path):
    import jitops.ops

    monkeypatch.setattr(jitops.ops, "PREWARM", [dict(GELU_ITEM, dtypes=["i32", "i64"])])
    code, report = cli_json(capsys, "prewarm", "--all-builtin", "--arch", "cpu", "--cache-dir", tmp_path / "c")
    assert code == 0 and report["results"] == []
    assert len(report["skipped"]) == 2
    assert all("on cpu; supported there: float32, float64, float16, bfloat16" in s["reason"]
               for s in report["skipped"])


def test_manifest_call_the_op_rejects_on_cpu_is_bad_input(tmp_path, capsys):
    """example_args(device='cpu') lets the shape class apply its CPU rules, so the op's own message shows."""
    manifest = write_manifest(tmp_path / "m.json", dict(GELU_ITEM, dtypes=["i32"]), archs=["cpu"])
    code, out, err = cli(capsys, "prewarm", "--manifest", manifest, "--cache-dir", tmp_path / "c")
    assert code == 2
    assert "has dtype int32 on cpu; supported there: float32, float64, float16, bfloat16" in err and "ops[0]" in err
    assert not (tmp_path / "c").exists()


def test_prewarm_reports_kernels_that_cannot_be_built_here_by_name(tmp_path, capsys):
    if torch.version.cuda is not None:
        pytest.skip("torch has CUDA here: the load_inline CUDA kernel could be built")
    manifest = write_manifest(tmp_path / "m.json", {"op": "cachetoolstest::cuda_ext", "dtypes": ["fp32"],
                                                    "shapes": [[[8]]]}, dict(GELU_ITEM, dtypes=["fp16"]),
                              archs=["sm_90a"])
    code, out, err = cli(capsys, "prewarm", "--manifest", manifest, "--cache-dir", tmp_path / "c")
    assert code == 1
    assert "cannot build here: tools_cuda_ext[] [sm_90] (op cachetoolstest::cuda_ext): load_inline CUDA kernels need a CUDA " \
           "build of torch" in out
    assert "--skip-unbuildable" in err
    assert len(entry_dirs(tmp_path / "c")) == 1  # the rest was built
    code, report = cli_json(capsys, "prewarm", "--manifest", manifest, "--cache-dir", tmp_path / "c",
                            "--skip-unbuildable")
    assert code == 0 and report["summary"][-1]["unbuildable"] == 1


def test_prewarm_compile_failure_is_reported_with_the_log_and_exits_1(tmp_path, capsys):
    manifest = write_manifest(tmp_path / "m.json", {"op": "cachetoolstest::broken", "dtypes": ["fp32"],
                                                    "shapes": [[[8]]]}, dict(GELU_ITEM, dtypes=["fp16"]),
                              archs=["sm_80"])
    code, out, err = cli(capsys, "prewarm", "--manifest", manifest, "--cache-dir", tmp_path / "c")
    assert code == 1
    assert "FAILED broken<float> [sm_80] (op cachetoolstest::broken" in out and "compiler log" in out
    assert "1 failed" in err
    assert len(entry_dirs(tmp_path / "c")) == 1  # the good kernel still compiled


def test_prewarm_record_replays_the_recorded_calls_exactly(tmp_path, capsys):
    """A JITOPS_RECORD line from a real (offline, so nothing compiles) CPU call, strides included, replays to the
    very requests that call asks for."""
    record = tmp_path / "misses.jsonl"
    x = torch.randn(8, 6, dtype=torch.float64).t()  # non-contiguous
    with jitops.config.scope(cache_dir=tmp_path / "empty", cache_path=(), offline=True, record=record):
        jitops.clear_memory_cache()
        with pytest.raises(jitops.CacheMissError):
            jitops.gelu(x, "tanh")
    jitops.clear_memory_cache()
    line = json.loads(record.read_text().splitlines()[0])
    assert line["archs"] == ["cpu"] and line["strides"] == [[[1, 6]]]
    calls = manifest_module.load_record(record)
    plan = manifest_module.plan(calls)
    assert [j.request for j in plan.jobs] == list(jitops.gelu.op.requests_for((x, "tanh"), Target("cpu")).values())
    # --arch overrides the recorded arch: the same call's GPU kernel, compiled for sm_90a without a GPU
    code, report = cli_json(capsys, "prewarm", "--record", record, "--arch", "sm_90a", "--cache-dir",
                            tmp_path / "c")
    assert code == 0 and [r["label"] for r in report["results"]] == ["jitops::gelu_forward<double, 2, 1, int>"]


USER_OPS = '''
import torch, jitops
SOURCE = """
template <typename T>
__global__ void twice(const T* x, T* out, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) out[i] = x[i] + x[i];
}
"""
KERNEL = jitops.CudaKernel("user_twice", jitops.Source.inline("user_twice", SOURCE), "twice<{T}>", "ptr ptr i64")
twice = jitops.op("userlib::twice(Tensor x) -> Tensor", shape_class=lambda x: x.dtype,
                  cuda=jitops.Impl(lambda cls, target: {"k": KERNEL.bind("fp32", T="float")}, lambda k, x: x),
                  fake=lambda x: torch.empty_like(x))
'''


def test_record_of_a_users_op_replays_with_import(tmp_path):
    """Ops outside the jitops namespace are recorded by qualified name; --import declares them for the replay."""
    assert broken.op.manifest_item((torch.empty(3),))["op"] == "cachetoolstest::broken"
    assert jitops.gelu.op.manifest_item((torch.empty(3), "none"))["op"] == "gelu"
    (tmp_path / "userlib_ops.py").write_text(USER_OPS)
    record = tmp_path / "misses.jsonl"
    record.write_text(json.dumps({"op": "userlib::twice", "dtypes": ["fp32"], "shapes": [[[16]]], "kwargs": {},
                                  "archs": ["sm_80"]}) + "\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(tmp_path)]),
               JITOPS_CACHE_DIR=str(tmp_path / "c"))
    command = [sys.executable, "-m", "cache_tools", "prewarm", "--record", str(record), "--json"]
    without = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert without.returncode == 2 and "needs --import MODULE" in without.stderr
    done = subprocess.run(command + ["--import", "userlib_ops"], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert [r["label"] for r in json.loads(done.stdout)["results"]] == ["twice<float>"]


def test_parallel_prewarm_uses_the_jobs(tmp_path, capsys):
    manifest = write_manifest(tmp_path / "m.json", dict(GELU_ITEM, dtypes=["fp32", "fp16", "bf16", "fp64"]),
                              archs=["sm_80"])
    code, report = cli_json(capsys, "prewarm", "--manifest", manifest, "--cache-dir", tmp_path / "c", "--jobs", "4")
    assert code == 0 and report["jobs"] == 4 and len(report["results"]) == 4
    # Four compiles in threads: the wall time is below the sum of the compiles' times.
    assert report["wall_seconds"] < sum(r["seconds"] for r in report["results"])


def test_progress_redraws_one_line_on_a_terminal():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    progress = Progress(2, stream=stream)
    progress.start(0, "k0")
    progress.finish(0, "k0", "compiled", "sm_90", 0.1)
    progress.finish(1, "k1", "failed", "sm_90", 0.1)
    progress.close()
    text = stream.getvalue()
    assert "\r" in text and "\n" not in text and "2/2" in text and "1 compiled" in text and "1 failed" in text


# ---- list ----------------------------------------------------------------------------------------------------------
def test_list_table_and_json(cache, capsys):
    code, out, err = cli(capsys, "list", "--cache-dir", cache)
    assert code == 0
    header = out.splitlines()[1]
    for column in ("op", "kernel", "arch", "dtype", "shape class", "size", "compile s", "last used"):
        assert column in header
    assert "gelu_forward" in out and "add_forward" in out and "3 entries" in out
    code, listing = cli_json(capsys, "list", "--cache-dir", cache)
    rows = listing["entries"]
    assert len(rows) == 3
    gelu = next(r for r in rows if r["dtype"] == "bf16" and r["op"] == "gelu")
    assert gelu["kernel"] == "gelu_forward" and gelu["arch"] == "sm_80" and gelu["backend"] == "nvrtc"
    assert "approximate='tanh'" in gelu["shape_class"]
    assert gelu["size"] > 1000 and gelu["compile_seconds"] > 0 and gelu["last_used"] > 0
    assert gelu["toolchain"]["nvrtc"]
    # --op and --arch filter; sm_80 entries are not sm_90's
    assert {r["op"] for r in cli_json(capsys, "list", "--cache-dir", cache, "--op", "add")[1]["entries"]} == {"add"}
    assert cli_json(capsys, "list", "--cache-dir", cache, "--arch", "sm_90a")[1]["entries"] == []


def test_list_names_unreadable_entries(cache, capsys):
    (entry_dirs(cache)[0] / "meta.json").write_text("{not json")
    code, out, err = cli(capsys, "list", "--cache-dir", cache)
    assert code == 0 and "2 entries" in out and "1 unreadable entries" in out and "meta.json is unreadable" in out


def test_last_used_is_the_runtime_stamp(cache, capsys):
    entry = entry_dirs(cache)[0]
    stamp = time.time() - 5 * 86400
    os.utime(entry / "last_used", (stamp, stamp))
    rows = cli_json(capsys, "list", "--cache-dir", cache)[1]["entries"]
    assert any(abs(r["last_used"] - stamp) < 1 for r in rows)
    assert "5 d ago" in cli(capsys, "list", "--cache-dir", cache)[1]


# ---- verify --------------------------------------------------------------------------------------------------------
def _corrupt(entry: Path) -> None:
    binary = entry / "kernel.cubin"
    data = bytearray(binary.read_bytes())
    data[len(data) // 2] ^= 0xFF
    binary.write_bytes(bytes(data))


def test_verify_finds_corrupt_entries_and_fix_removes_them(cache, capsys):
    code, out, err = cli(capsys, "verify", "--cache-dir", cache)
    assert code == 0 and "checked 3 entries" in out and "0 corrupt" in out
    bad, truncated, good = entry_dirs(cache)
    _corrupt(bad)
    (truncated / "kernel.cubin").write_bytes((truncated / "kernel.cubin").read_bytes()[:100])
    code, report = cli_json(capsys, "verify", "--cache-dir", cache)
    assert code == 1 and report["checked"] == 3
    reasons = {Path(c["path"]).name: c["reason"] for c in report["corrupt"]}
    assert "sha256 does not match" in reasons[bad.name] and "truncated" in reasons[truncated.name]
    code, out, err = cli(capsys, "verify", "--cache-dir", cache, "--fix")
    assert code == 0 and out.count("[removed]") == 2
    assert entry_dirs(cache) == [good]
    assert not list((cache / "v1" / "tmp").iterdir())  # removed whole: renamed aside, then deleted
    assert cli(capsys, "verify", "--cache-dir", cache)[0] == 0


def test_verify_manifest_coverage(cache, tmp_path, capsys):
    covered = write_manifest(tmp_path / "covered.json", GELU_ITEM, ADD_ITEM, archs=["sm_80"])
    code, out, err = cli(capsys, "verify", "--cache-dir", cache, "--manifest", covered)
    assert code == 0 and "3 of 3 kernels cached" in out
    wider = write_manifest(tmp_path / "wider.json", dict(GELU_ITEM, dtypes=["bf16", "fp16"]), archs=["sm_80"])
    code, out, err = cli(capsys, "verify", "--cache-dir", cache, "--manifest", wider)
    assert code == 1
    assert "1 of 2 kernels cached" in out and "MISSING jitops::gelu_forward<__half, 8, 1, int> [sm_80]" in out
    assert f"jitops-cache prewarm --manifest {wider} --cache-dir {cache}" in out  # the flags in use
    code, report = cli_json(capsys, "verify", "--cache-dir", cache, "--manifest", covered, "--arch", "sm_90a")
    assert code == 1 and len(report["coverage"]["missing"]) == 3  # --arch overrides the manifest's archs


# ---- prune ---------------------------------------------------------------------------------------------------------
def _stamp(entry: Path, days_ago: float) -> None:
    when = time.time() - days_ago * 86400
    os.utime(entry / "last_used", (when, when))


def test_prune_removes_least_recently_used_first_by_the_stamp(cache, capsys):
    oldest, middle, newest = entry_dirs(cache)
    _stamp(oldest, 10)
    _stamp(middle, 5)
    _stamp(newest, 1)
    # The filesystem's atime/mtime say the opposite: prune must not look at them.
    for age, entry in ((1, oldest), (5, middle), (10, newest)):
        when = time.time() - age * 86400
        for path in [entry, *entry.iterdir()]:
            if path.name != "last_used":
                os.utime(path, (when, when))
    sizes = {e: sum(p.stat().st_size for p in e.iterdir()) for e in (oldest, middle, newest)}
    limit = sizes[middle] + sizes[newest]
    code, report = cli_json(capsys, "prune", "--cache-dir", cache, "--max-size", str(limit), "--dry-run")
    assert code == 0 and [Path(r["path"]) for r in report["removed"]] == [oldest]
    assert len(entry_dirs(cache)) == 3  # dry run
    code, out, err = cli(capsys, "prune", "--cache-dir", cache, "--max-size", str(limit))
    assert code == 0 and "removed 1 entries" in out
    assert entry_dirs(cache) == [middle, newest]
    code, report = cli_json(capsys, "prune", "--cache-dir", cache, "--older-than", "3d")
    assert [Path(r["path"]) for r in report["removed"]] == [middle]
    assert entry_dirs(cache) == [newest]
    assert report["kept"] == 1


def test_prune_to_zero_and_quarantined_entries_go_first(cache, capsys):
    quarantine = cache / "v1" / "quarantine" / "gelu_forward-x.123.abc"
    quarantine.mkdir(parents=True)
    (quarantine / "kernel.cubin").write_bytes(b"x" * 10)
    entries = entry_dirs(cache)
    total = sum(sum(p.stat().st_size for p in e.iterdir()) for e in entries)
    code, report = cli_json(capsys, "prune", "--cache-dir", cache, "--max-size", str(total))
    assert [r["kernel"] for r in report["removed"]] == [quarantine.name] and not quarantine.exists()
    code, report = cli_json(capsys, "prune", "--cache-dir", cache, "--max-size", "0")
    assert len(report["removed"]) == 3 and entry_dirs(cache) == []


def test_prune_cleans_stale_temporary_dirs_and_unheld_locks(cache, capsys):
    base = cache / "v1"
    old = time.time() - 2 * 3600
    stale_tmp = base / "tmp" / "gelu_forward-abc.123.deadbeef"
    fresh_tmp = base / "tmp" / "gelu_forward-def.456.feedface"
    for path in (stale_tmp, fresh_tmp):
        path.mkdir(parents=True)
        (path / "kernel.cubin").write_bytes(b"partial")
    os.utime(stale_tmp, (old, old))
    (base / "locks").mkdir(exist_ok=True)
    unheld, held = base / "locks" / "a.lock", base / "locks" / "b.lock"
    for path in (unheld, held):
        path.touch()
        os.utime(path, (old, old))
    lock = filelock.FileLock(str(held))
    lock.acquire()
    try:
        code, report = cli_json(capsys, "prune", "--cache-dir", cache, "--older-than", "365d")
    finally:
        lock.release()
    assert code == 0 and report["removed"] == []
    assert sorted(Path(p).name for p in report["stale_removed"]) == [unheld.name, stale_tmp.name]
    assert fresh_tmp.exists() and held.exists() and len(entry_dirs(cache)) == 3


# ---- explain -------------------------------------------------------------------------------------------------------
def test_explain_a_hit(cache, capsys):
    code, out, err = cli(capsys, "explain", "gelu", "--dtype", "bf16", "--shape", "1024x64", "--kwarg",
                         "approximate=tanh", "--arch", "sm_80", "--cache-dir", cache)
    assert code == 0, err
    assert "shape class: GeluClass(dtype=torch.bfloat16, vec=8, approximate='tanh', index='int')" in out
    assert "kernel forward: jitops::gelu_forward<__nv_bfloat16, 8, 1, int>" in out
    assert "request.arch: sm_80" in out and "request.sources: gelu.cu" in out and "toolchain.nvrtc" in out
    assert "HIT: a call loads this cached entry" in out


def test_explain_a_miss_shows_what_differs_from_the_nearest_entry(cache, capsys):
    code, reports = cli_json(capsys, "explain", "gelu", "--dtype", "bf16", "--shape", "1024x64", "--arch", "sm_80",
                             "--cache-dir", cache)  # approximate defaults to 'none'; the cache has 'tanh'
    kernel = reports[0]["kernels"][0]
    assert kernel["status"] == "miss" and "compiles it" in kernel["verdict"]
    diffs = kernel["nearest"]["differences"]
    assert any(d.startswith("entry: wanted \"jitops::gelu_forward<__nv_bfloat16, 8, 0, int>\"") for d in diffs)
    assert any(d.startswith("shape_class: ") for d in diffs)
    assert kernel["nearest"]["toolchain_differences"] == []
    # A misaligned call: another vector width, so another shape class, and the reason shows
    code, out, err = cli(capsys, "explain", "--item", json.dumps(
        {"op": "gelu", "kernel_op": "gelu", "dtypes": ["bf16"], "shapes": [[[1024, 64]]], "strides": [[[65, 1]]],
         "kwargs": {"approximate": "tanh"}, "archs": ["sm_80"]}), "--cache-dir", cache)
    assert code == 0 and "MISS" not in out  # non-contiguous inputs are copied: same class, a hit


def test_explain_other_arch_and_other_toolchain(cache, capsys):
    code, reports = cli_json(capsys, "explain", "gelu", "--dtype", "fp32", "--shape", "1024,64", "--kwarg",
                             "approximate=tanh", "--arch", "sm_90a", "--cache-dir", cache)
    kernel = reports[0]["kernels"][0]
    assert kernel["status"] == "miss"
    assert "arch: wanted \"sm_90\", cached \"sm_80\"" in kernel["nearest"]["differences"]
    # The same request built by another toolchain: a machine with a compiler builds its own; offline uses it.
    entry = next(e for e in entry_dirs(cache) if e.parent.name == "fp32")
    meta = json.loads((entry / "meta.json").read_text())
    meta["toolchain"] = dict(meta["toolchain"], nvrtc="12.0.0 (wheel)")
    meta["toolchain_hash"] = jitops.keys.digest(meta["toolchain"])
    moved = entry.with_name(entry.name.rsplit("-", 1)[0] + "-" + meta["toolchain_hash"][:8])
    entry.rename(moved)
    (moved / "meta.json").write_text(json.dumps(meta))
    code, reports = cli_json(capsys, "explain", "gelu", "--dtype", "fp32", "--shape", "1024,64", "--kwarg",
                             "approximate=tanh", "--arch", "sm_80", "--cache-dir", cache)
    kernel = reports[0]["kernels"][0]
    assert kernel["status"] == "miss" and kernel["nearest"]["differences"] == []
    assert kernel["nearest"]["toolchain_differences"][0].startswith("toolchain.nvrtc: wanted")
    assert "another toolchain" in kernel["note"]
    with jitops.config.scope(offline=True):
        code, reports = cli_json(capsys, "explain", "gelu", "--dtype", "fp32", "--shape", "1024,64", "--kwarg",
                                 "approximate=tanh", "--arch", "sm_80", "--cache-dir", cache)
    assert reports[0]["kernels"][0]["status"] == "hit" and "another toolchain" in reports[0]["kernels"][0]["verdict"]


def test_explain_names_a_kernel_that_was_never_cached(tmp_path, capsys):
    code, out, err = cli(capsys, "explain", "add", "--dtype", "fp32", "--shape", "7", "--shape", "7", "--arch",
                         "sm_80", "--cache-dir", tmp_path / "empty")
    assert code == 0 and "MISS" in out and "no build of kernel 'add_forward' is cached" in out


# ---- info ----------------------------------------------------------------------------------------------------------
def test_info_shows_roots_counts_and_compilers(cache, capsys):
    code, out, err = cli(capsys, "info", "--cache-dir", cache)
    assert code == 0
    assert str(cache) in out and "writable" in out and "sm_80 3" in out
    assert "nvrtc" in out and "JITOPS_CACHE_DIR" in out
    code, result = cli_json(capsys, "info", "--cache-dir", cache)
    root = result["roots"][-1]
    assert root["path"] == str(cache) and root["entries"] == 3 and root["by_backend"]["nvrtc"]["entries"] == 3
    assert root["size_on_disk"] >= root["entries_size"] > 0
    assert result["compilers"]["nvrtc"] == jitops.backends.toolkit.nvrtc_identity()
    assert result["torch"] == torch.__version__


# ---- the command line ----------------------------------------------------------------------------------------------
SUBCOMMANDS = ["prewarm", "list", "verify", "prune", "export", "import", "explain", "info"]


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_every_subcommand_takes_the_shared_flags(command, capsys):
    code, out, err = cli(capsys, command, "--help")
    assert code == 0
    for flag in ("--cache-dir", "--arch", "--jobs", "--json"):
        assert flag in out


def test_shared_flags_before_or_after_the_subcommand(cache, capsys):
    before = cli_json(capsys, "--cache-dir", cache, "--arch", "sm_80", "list")[1]
    after = cli_json(capsys, "list", "--cache-dir", cache, "--arch", "sm_80")[1]
    assert before == after and len(before["entries"]) == 3


BAD_MANIFESTS = {
    "missing.json": (None, "not found"),
    "bad.json": ("{\"ops\": [", "not valid JSON"),
    "list.json": ("[1, 2]", "a manifest is an object"),
    "noops.json": ("{\"archs\": [\"sm_80\"]}", "has no \"ops\" list"),
    "typo.json": (json.dumps({"ops": [{"op": "gelu", "dtype": ["bf16"], "shapes": [[[8]]]}]}), "unknown key(s) 'dtype'"),
    "unknown_op.json": (json.dumps({"archs": ["sm_80"], "ops": [{"op": "gleu", "dtypes": ["bf16"], "shapes": [[[8]]]}]}),
                        "unknown op 'gleu'; known ops:"),
    "bad_arch.json": (json.dumps({"archs": ["sm_5x"], "ops": [GELU_ITEM]}), "unknown arch 'sm_5x'"),
    "old_arch.json": (json.dumps({"archs": ["sm_60"], "ops": [GELU_ITEM]}), "older than sm_70"),
    "bad_dtype.json": (json.dumps({"archs": ["sm_80"], "ops": [dict(GELU_ITEM, dtypes=["fp8"])]}), "unknown dtype 'fp8'"),
    "bad_shape.json": (json.dumps({"archs": ["sm_80"], "ops": [dict(GELU_ITEM, shapes=[[[-1, 4]]])]}),
                       "non-negative integers"),
    "flat_shape.json": (json.dumps({"archs": ["sm_80"], "ops": [dict(GELU_ITEM, shapes=[4096, 8192])]}),
                        "one call is a list of shapes"),
    "arity.json": (json.dumps({"archs": ["sm_80"], "ops": [dict(ADD_ITEM, shapes=[[[8]]])]}),
                   "1 shape given for 2 tensor arguments (a, b): give one shape per tensor argument"),
    "kwarg.json": (json.dumps({"archs": ["sm_80"], "ops": [dict(GELU_ITEM, kwargs={"approx": "tanh"})]}),
                   "unknown argument(s) ['approx']"),
    "value.json": (json.dumps({"archs": ["sm_80"], "ops": [dict(GELU_ITEM, kwargs={"approximate": "fast"})]}),
                   "'approximate' is 'fast'; use 'none' or 'tanh'"),
    "noarch.json": (json.dumps({"ops": [GELU_ITEM]}), "no arch to build for; give --arch"),
}


@pytest.mark.parametrize("name", sorted(BAD_MANIFESTS))
@pytest.mark.parametrize("command", ["prewarm", "verify"])
def test_bad_manifest_exits_2_with_a_clear_message_and_changes_nothing(name, command, cache, tmp_path, capsys):
    text, message = BAD_MANIFESTS[name]
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    before = snapshot(cache)
    extra = ["--fix"] if command == "verify" else []
    _corrupt(entry_dirs(cache)[0])  # verify --fix must not act on bad input either
    before = snapshot(cache)
    code, out, err = cli(capsys, command, "--manifest", path, "--cache-dir", cache, *extra)
    assert code == 2
    assert f"jitops-cache {command}: error:" in err and message in err, err
    assert snapshot(cache) == before


@pytest.mark.parametrize("argv, message", [
    (["prewarm", "--arch", "sm_90a"], "one of the arguments --manifest --record --all-builtin is required"),
    (["prewarm", "--all-builtin"], "--all-builtin needs --arch"),
    (["prewarm", "--all-builtin", "--arch", "hopper"], "unknown arch 'hopper'"),
    (["prewarm", "--all-builtin", "--arch", "sm_90a", "--jobs", "0"], "must be at least 1"),
    (["list", "--jobs", "many"], "is not a whole number"),
    (["prune"], "--max-size SIZE (e.g. 2G) and/or --older-than AGE"),
    (["prune", "--max-size", "12XB"], "'12XB' is not a size"),
    (["prune", "--max-size=-5G"], "'-5G' is not a size"),
    (["prune", "--older-than", "5"], "'5' is not an age"),
    (["prune", "--older-than", "yesterday"], "'yesterday' is not an age"),
    (["explain", "--arch", "sm_80"], "name the op"),
    (["explain", "gelu", "--arch", "sm_80"], "describe the call"),
    (["explain", "gelu", "--dtype", "bf16", "--shape", "4x4"], "no arch to build for"),
    (["explain", "--item", "{nope", "--arch", "sm_80"], "--item is not JSON"),
    (["explain", "gelu", "--dtype", "bf16", "--shape", "4 by 4", "--arch", "sm_80"], "use sizes like 4096x8192"),
    (["explain", "gelu", "--dtype", "bf16", "--shape", "4x4", "--kwarg", "tanh", "--arch", "sm_80"], "NAME=VALUE"),
    (["explain", "nosuchop", "--dtype", "bf16", "--shape", "4x4", "--arch", "sm_80"], "unknown op 'nosuchop'"),
    (["bogus"], "invalid choice: 'bogus'"),
    (["prewarm", "--all-builtin", "--arch", "sm_80", "--import", "no_such_module"],
     "--import no_such_module: ModuleNotFoundError"),
])
def test_bad_flags_exit_2_with_a_clear_message_and_change_nothing(argv, message, cache, capsys):
    before = snapshot(cache)
    code, out, err = cli(capsys, *argv, "--cache-dir", cache)
    assert code == 2 and message in err, err
    assert snapshot(cache) == before


def test_bad_record_line_names_the_line(cache, tmp_path, capsys):
    record = tmp_path / "r.jsonl"
    record.write_text(json.dumps(dict(GELU_ITEM, archs=["sm_80"])) + "\n{\"op\": \"gelu\", \"dty\n")
    before = snapshot(cache)
    code, out, err = cli(capsys, "prewarm", "--record", record, "--cache-dir", cache)
    assert code == 2 and f"{record}:2: not a JSON object" in err
    assert snapshot(cache) == before


def test_sizes_and_ages():
    assert parse_size("500M") == 500 * 2**20 and parse_size("1.5GiB") == int(1.5 * 2**30)
    assert parse_size("800MB") == 800 * 10**6 and parse_size("4096") == 4096 and parse_size("0") == 0
    assert parse_age("30d") == 30 * 86400 and parse_age("1d12h") == 36 * 3600 and parse_age("90m") == 5400
    for bad in ("", "G", "1.2.3G", "5 parsecs"):
        with pytest.raises(UsageError):
            parse_size(bad)
    for bad in ("", "d", "10", "3x"):
        with pytest.raises(UsageError):
            parse_age(bad)


def test_python_m_cache_tools_and_the_console_script_entry(cache):
    env = dict(os.environ, PYTHONPATH=str(REPO), JITOPS_CACHE_DIR=str(cache))
    out = subprocess.run([sys.executable, "-m", "cache_tools", "list", "--json"], capture_output=True, text=True,
                         env=env, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)["entries"]) == 3  # the default root is the runtime's (JITOPS_CACHE_DIR)
    bad = subprocess.run([sys.executable, "-m", "cache_tools", "prune", "--max-size", "lots"], capture_output=True,
                         text=True, env=env, cwd=REPO, timeout=300)
    assert bad.returncode == 2 and "is not a size" in bad.stderr
    import tomllib

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = scripts["jitops-cache"].partition(":")
    assert callable(getattr(__import__(module, fromlist=[function]), function))


@pytest.mark.parametrize("model", ["gpt2", "llama"])
def test_all_builtin_covers_the_benchmark_models_steps(tmp_path, capsys, model):
    """Issue 18: `prewarm --all-builtin` covers every kernel the bucket rules pick for its dtypes and layouts.
    A training step of bench_models.py's GPT-2 and Llama (their real sizes, on meta tensors: nothing runs) must
    need no sm_90a kernel outside it: GPT-2's Conv1D forwards (x @ w, w stored (K, N), with the bias fused) once
    compiled two in the first patched step on the H200.  (ViT-B/16 and ResNet-50 need timm, which this machine's
    torch cannot import.)"""
    pytest.importorskip("transformers")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import bench_models

    manifest = tmp_path / "step.json"
    manifest.write_text(json.dumps(bench_models.record_manifest([model], False, torch.bfloat16, "sm_90a")))

    def kernels(*source: str) -> dict[str, tuple[str, str]]:
        code, listed = cli_json(capsys, "prewarm", *source, "--arch", "sm_90a", "--list", "--cache-dir",
                                tmp_path / "c")
        assert code == 0
        return {k["entry"]: (k["kernel"], k["shape_class"]) for k in listed["kernels"]}

    step, builtin = kernels("--manifest", str(manifest)), kernels("--all-builtin")
    assert any("light_gemm" in kernel for kernel, _ in step.values())
    missing = [step[entry] for entry in step.keys() - builtin.keys()]
    assert not missing, missing
