"""Issue 22, "the first hour": one public name per op everywhere, `make run`'s prewarm covering what it runs,
skips as one line, bad input (archs, export paths, read-only roots) as clear errors, remedies that repeat the
flags in use, --version and a help that points at something that exists.  All on the CPU."""
from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import jitops
from cache_tools import manifest as manifest_module
from cache_tools.common import UsageError, os_error_message
from jitops.backends import toolkit

from cache_tools_helpers import GELU_ITEM, cli, cli_json, entry_dirs, write_manifest

REPO = Path(__file__).resolve().parent.parent
LAYER_NORM = {"op": "layer_norm", "dtypes": ["bf16"], "shapes": [[[4096, 1024], [1024], [1024]]],
              "kwargs": {"normalized_shape": [1024]}}
HAS_CUDA_COMPILER = toolkit.nvrtc_archs() is not None or toolkit.nvcc_archs() is not None


def plan(*items, archs=("sm_80",), strict=True):
    calls = []
    for index, item in enumerate(items):
        calls += manifest_module.parse_item(item, archs, f"ops[{index}]")
    return manifest_module.plan(calls, strict=strict)


def kernels(result) -> set[tuple[str, str]]:
    return {(job.kernel_op, job.request.kernel) for job in result.jobs}


# ---- one name per op ------------------------------------------------------------------------------------------------
def test_a_public_item_builds_the_forward_the_backward_and_the_no_grad_path():
    assert kernels(plan(LAYER_NORM)) == {("layer_norm_inference", "layer_norm_forward"),
                                          ("layer_norm_backward", "layer_norm_backward"),
                                          ("layer_norm_backward", "layer_norm_reduce_partials")}
    assert all(job.op == "layer_norm" for job in plan(LAYER_NORM).jobs)
    # "grad": false keeps the no-grad path: the forward kernel alone (layer_norm_inference's)
    assert kernels(plan(dict(LAYER_NORM, grad=False))) == {("layer_norm_inference", "layer_norm_forward")}
    # on the CPU one cxx kernel library serves all three ops
    cpu = plan(dict(LAYER_NORM, dtypes=["fp32"]), archs=("cpu",))
    assert [job.request.kernel for job in cpu.jobs] == ["layer_norm_cpu"]


def test_public_items_of_every_public_op_plan_without_a_gpu():
    items = [
        {"op": "add", "dtypes": ["fp16"], "shapes": [[[256], [256]]]},
        {"op": "gelu", "dtypes": ["bf16"], "shapes": [[[64, 64]]], "kwargs": {"approximate": "tanh"}},
        {"op": "gemm", "dtypes": ["bf16"], "shapes": [[[512, 256], [256, 128], None]]},
        {"op": "conv2d", "dtypes": ["fp16"], "shapes": [[[2, 64, 14, 14], [64, 64, 3, 3], None]],
         "kwargs": {"padding": [1, 1]}},
        {"op": "grouped_gemm", "dtypes": ["bf16"], "shapes": [[[[32, 64], [96, 64]], [[64, 48], [64, 48]]]]},
    ]
    found = kernels(plan(*items, archs=("sm_90a",)))
    assert {op for op, _ in found} >= {"add", "gelu", "gelu_backward", "gemm", "conv2d", "conv2d_input_grad",
                                       "conv2d_weight_grad", "grouped_gemm_list"}


def test_grouped_gemm_items_take_the_list_form_offsets_or_sizes():
    ragged = {"op": "grouped_gemm", "dtypes": ["bf16"], "shapes": [[[9216, 2048], [64, 2048, 1024], [64]]]}
    with_sizes = dict(ragged, shapes=[[[9216, 2048], [64, 2048, 1024], None]], kwargs={"sizes": [144] * 64})
    by_offsets, by_sizes = plan(ragged, archs=("sm_90a",)), plan(with_sizes, archs=("sm_90a",))
    assert {j.request for j in by_offsets.jobs} == {j.request for j in by_sizes.jobs}
    def forms(item):  # (LIGHT_GROUPED, A K-major, B K-major) of each light kernel the item builds
        return {tuple(int(dict(j.request.defines)[name]) for name in ("LIGHT_GROUPED", "LIGHT_A_KMAJOR",
                                                                     "LIGHT_B_KMAJOR"))
                for j in plan(item, archs=("sm_90a",)).jobs if j.request.kernel == "gemm_sm90_light"}

    # y = x @ w and dx = dy @ w^T (ragged M), dw = x^T @ dy (ragged K)
    assert forms(ragged) == {(1, 1, 0), (1, 1, 1), (2, 0, 0)}
    listed = {"op": "grouped_gemm", "dtypes": ["bf16"], "shapes": [[[[32, 64], [96, 64]], [[64, 48], [64, 48]]]]}
    assert forms(listed) == {(3, 1, 0), (3, 1, 1), (3, 0, 0)}  # the list form: its forward and both gradients
    assert forms(dict(listed, grad=False)) == {(3, 1, 0)}  # the no-grad path: the forward alone


def test_calls_that_need_no_kernel_on_a_target_say_so(tmp_path, capsys):
    """grouped_gemm has kernels on sm_90a only (torch's loop runs it elsewhere): an item for sm_80 and the CPU
    builds nothing, and prewarm, verify and explain say why instead of an empty table."""
    item = {"op": "grouped_gemm", "dtypes": ["bf16"], "shapes": [[[[32, 64], [96, 64]], [[64, 48], [64, 48]]]]}
    nothing = plan(item, archs=("sm_80", "cpu"))
    assert nothing.jobs == [] and nothing.skipped == []
    assert [(n["op"], n["arch"]) for n in nothing.no_kernel] == [("grouped_gemm", "sm_80"), ("grouped_gemm", "cpu")]
    assert plan(item, archs=("sm_90a",)).no_kernel == [] and plan(LAYER_NORM).no_kernel == []
    line = "grouped_gemm on cpu and sm_80: no compiled kernel needed there (torch's code runs those calls)"
    manifest = write_manifest(tmp_path / "m.json", item, archs=["sm_80", "cpu"])
    code, out, err = cli(capsys, "prewarm", "--manifest", manifest, "--cache-dir", tmp_path / "c", "--no-progress")
    assert code == 0 and line in out, out
    code, out, err = cli(capsys, "verify", "--manifest", manifest, "--cache-dir", tmp_path / "c")
    assert code == 0 and "0 of 0 kernels cached" in out and line in out, out
    code, out, err = cli(capsys, "explain", "grouped_gemm", "--dtype", "bf16", "--shape", "[[32,64]]", "--shape",
                         "[[64,48]]", "--arch", "sm_80", "--cache-dir", tmp_path / "c")
    assert code == 0 and "no compiled kernel needed there: torch's code runs this call" in out, out


def test_internal_names_stay_accepted_and_build_exactly_that_call():
    backward = {"op": "layer_norm_backward", "dtypes": ["bf16"],
                "shapes": [[[4096, 1024], [4096, 1024], [2, 4096], [1024]]], "kwargs": {"normalized_shape": [1024]}}
    (call,) = manifest_module.parse_item(backward, ("sm_80",), "ops[0]")
    assert (call.op, call.kernel_op) == ("layer_norm", "layer_norm_backward")
    assert {op for op, _ in kernels(plan(backward))} == {"layer_norm_backward"}
    same = dict(backward, op="layer_norm", kernel_op="layer_norm_backward")
    assert kernels(plan(same)) == kernels(plan(backward))
    assert call.item()["op"] == "layer_norm" and call.item()["kernel_op"] == "layer_norm_backward"


@pytest.mark.parametrize("item, words", [
    (dict(LAYER_NORM, kernel_op="gelu_backward"), ["'gelu_backward' is not an op of layer_norm",
                                                   "layer_norm_forward, layer_norm_inference, layer_norm_backward"]),
    (dict(LAYER_NORM, kernel_op="layer_norm_forward", grad=True), ["drop one of them"]),
    (dict(LAYER_NORM, grad="yes"), ['"grad" must be true']),
    (dict(LAYER_NORM, op="layernorm"), ["unknown op 'layernorm'", "known ops: add, ", ", layer_norm",
                                        "(and the ops inside them: conv2d_input_grad"]),
])
def test_bad_public_items_are_bad_input(item, words):
    with pytest.raises(UsageError) as info:
        plan(item)
    for word in words:
        assert word in str(info.value), str(info.value)


def test_misses_are_recorded_and_explained_under_the_public_name(fresh_cache, tmp_path):
    """A JITOPS_RECORD line names the public op and the op that missed (replayed exactly); CacheMissError
    names both and its remedy repeats the cache directory in use."""
    record = tmp_path / "misses.jsonl"
    x = torch.randn(5, 7)
    with jitops.config.scope(offline=True, record=record):
        with pytest.raises(jitops.CacheMissError) as info:
            jitops.layer_norm(x, (7,))
        with pytest.raises(jitops.CacheMissError):
            jitops.layer_norm(x.requires_grad_(), (7,))
    message = str(info.value)
    assert "op 'layer_norm' (through its op layer_norm_inference)" in message
    assert f"prewarm --cache-dir {fresh_cache} --arch cpu --manifest M.json" in message  # the flags in use
    assert f"prewarm --cache-dir {fresh_cache} --record misses.jsonl" in message
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    assert [(line["op"], line["kernel_op"]) for line in lines] == [("layer_norm", "layer_norm_inference"),
                                                                   ("layer_norm", "layer_norm_forward")]
    calls = manifest_module.load_record(record)
    assert [c.kernel_op for c in calls] == ["layer_norm_inference", "layer_norm_forward"]
    assert [j.request.kernel for j in manifest_module.plan(calls).jobs] == ["layer_norm_cpu"]


def test_every_kernel_request_names_the_public_op_and_the_op_that_asked():
    """The runtime learns who asks for a kernel from a MissContext (what meta.json's op/kernel_op, JITOPS_RECORD
    lines, progress lines and CacheMissError say); one method makes it, so jitops.prefetch's requests name
    layer_norm, not layer_norm_forward, as the op's own calls do."""
    context = jitops.find("layer_norm_backward").miss_context("cls", {"op": "layer_norm"})
    assert (context.op, context.kernel_op, context.manifest_item) == ("layer_norm", "layer_norm_backward",
                                                                      {"op": "layer_norm"})
    made = [path.relative_to(REPO).as_posix() for path in (REPO / "jitops").rglob("*.py")
            if "MissContext(" in path.read_text().replace("class MissContext(", "")]
    assert made == ["jitops/op.py"], made
    assert (REPO / "jitops" / "op.py").read_text().count("MissContext(") == 1


def test_prefetch_asks_for_kernels_under_the_public_name(monkeypatch):
    """jitops.prefetch on a model with fake CUDA parameters (no GPU: the target is given, nothing compiles):
    its requests name layer_norm, with the op that asked as detail (it named layer_norm_forward as the op)."""
    import concurrent.futures
    import sys

    from torch import nn
    from torch._subclasses.fake_tensor import FakeTensorMode

    from jitops import Target
    from jitops.runtime import runtime

    class Norm(nn.Module):
        def __init__(self, weight):
            super().__init__()
            self.weight = weight

        def forward(self, x):
            return jitops.layer_norm(x, (16,), self.weight)

    with FakeTensorMode():
        weight = nn.Parameter(torch.empty(16, device="cuda", dtype=torch.bfloat16))
        x = torch.empty(8, 16, device="cuda", dtype=torch.bfloat16)
    asked = []

    def submit(request, target, index, context, *rest):
        asked.append((context.op, context.kernel_op, request.kernel))
        done = concurrent.futures.Future()
        done.set_result(None)
        return done

    monkeypatch.setattr(sys.modules["jitops.op"].Op, "target", lambda self, device_type, index: Target.parse("sm_90a"))
    monkeypatch.setattr(runtime, "get_kernel", lambda request, target, index, context, build=True: None)
    monkeypatch.setattr(runtime, "submit", submit)
    with jitops.config.scope(offline=False):
        report = jitops.prefetch(Norm(weight), x, wait=False)
    assert report.skipped is None and report.submitted == len(asked) == 3, report
    assert sorted(asked) == [("layer_norm", "layer_norm_backward", "layer_norm_backward"),
                             ("layer_norm", "layer_norm_backward", "layer_norm_param_grads"),
                             ("layer_norm", "layer_norm_forward", "layer_norm_forward")]


def test_list_shows_the_public_op_with_the_internal_op_as_detail(tmp_path, capsys):
    cache = tmp_path / "cache"
    item = {"op": "gelu", "dtypes": ["fp32"], "shapes": [[[64, 64]]], "kwargs": {"approximate": "tanh"}}
    assert cli(capsys, "prewarm", "--manifest", write_manifest(tmp_path / "m.json", item, archs=["sm_80"]),
               "--cache-dir", cache, "--no-progress")[0] == 0
    code, out, err = cli(capsys, "list", "--cache-dir", cache)
    rows = [line.split()[:3] for line in out.splitlines()[3:5]]
    assert rows == [["gelu", "gelu_forward", "sm_80"], ["gelu", "(gelu_backward)", "gelu_backward"]]
    code, result = cli_json(capsys, "list", "--cache-dir", cache, "--op", "gelu_backward")
    assert [(r["op"], r["kernel_op"]) for r in result["entries"]] == [("gelu", "gelu_backward")]
    # An entry written before public names kept only the op that asked: shown the same way.
    entry = next(p for p in entry_dirs(cache) if "gelu_backward" in p.name)
    meta = json.loads((entry / "meta.json").read_text())
    del meta["kernel_op"]
    meta["op"] = "gelu_backward"
    (entry / "meta.json").write_text(json.dumps(meta))
    code, result = cli_json(capsys, "list", "--cache-dir", cache, "--op", "gelu")
    assert sorted((r["op"], r["kernel_op"]) for r in result["entries"]) == [("gelu", "gelu"),
                                                                           ("gelu", "gelu_backward")]


def test_verify_and_explain_name_the_public_op_with_the_op_that_asks(tmp_path, capsys):
    cache = tmp_path / "cache"
    manifest = write_manifest(tmp_path / "m.json", LAYER_NORM, archs=["sm_80"])
    code, out, err = cli(capsys, "verify", "--manifest", manifest, "--cache-dir", cache)
    missing = [line for line in out.splitlines() if line.startswith("  MISSING")]
    assert code == 1 and len(missing) == 3, out
    assert sum("(op layer_norm, through layer_norm_inference, " in line for line in missing) == 1
    assert sum("(op layer_norm, through layer_norm_backward, " in line for line in missing) == 2
    argv = ["explain", "layer_norm", "--dtype", "bf16", "--shape", "4096x1024", "--shape", "1024", "--shape", "1024",
            "--kwarg", "normalized_shape=[1024]", "--arch", "sm_80", "--cache-dir", cache]
    code, out, err = cli(capsys, *argv)
    assert code == 0 and out.startswith("layer_norm bf16 shapes [[4096, 1024], [1024], [1024]]"), out
    headers = [line.split(":")[0].strip() for line in out.splitlines() if "shape class:" in line]
    assert headers == ["layer_norm_inference", "layer_norm_backward"], out
    code, reports = cli_json(capsys, *argv)
    assert [r["call"]["op"] for r in reports] == ["layer_norm"]
    assert [k["kernel_op"] for k in reports[0]["kernels"]] == ["layer_norm_inference", "layer_norm_backward",
                                                               "layer_norm_backward"]


def test_errors_name_the_public_op_and_the_argument():
    with pytest.raises(ValueError, match=r"jitops.grouped_gemm: arguments 'As' and 'Bs' are empty lists"):
        jitops.grouped_gemm([], [])
    with pytest.raises(ValueError, match=r"jitops.grouped_gemm: arguments 'As' and 'Bs' hold no tensors"):
        jitops.find("grouped_gemm_list").function([], [])  # the op itself names its public function
    x, w = torch.randn(6, 4), torch.randn(2, 4, 3)
    with pytest.raises(ValueError, match=r"argument 'sizes' has shape \(3,\); expected \(2,\): one group size per "
                                         r"group"):
        jitops.grouped_gemm(x, w, sizes=[2, 3, 1])
    with pytest.raises(ValueError, match=r"argument 'sizes' does not add up.*the sizes must add up to it"):
        jitops.grouped_gemm(x, w, sizes=[2, 3])
    public = jitops.find_public("layer_norm")
    with pytest.raises(ValueError, match=r"^jitops.layer_norm: 1 shape given for 3 tensor arguments \(x, weight, "
                                         r"bias\): give one shape per tensor argument"):
        public.entries[1].example_args("fp32", [[4, 4]], {"normalized_shape": [4]})
    assert jitops.find("layer_norm_backward").label == "jitops.layer_norm_backward"  # its own arguments


# ---- make run: the prewarm covers what python -m jitops runs --------------------------------------------------------
def test_python_m_jitops_manifest_is_its_own_calls():
    from jitops.__main__ import manifest

    items = manifest(["sm_90a", "cpu"])["ops"]
    assert all(item["grad"] is False for item in items)
    cpu = [i for i in items if i["archs"] == ["cpu"]]
    assert {(i["op"], i["dtypes"][0]) for i in cpu} >= {("add", "fp64"), ("gelu", "fp64"), ("layer_norm", "fp64"),
                                                         ("add", "fp32")}
    builtin = {name for name in jitops.public_names() if "::" not in name}  # not other tests' own ops
    assert {i["op"] for i in cpu} == builtin  # "every public op", as the README says
    calls = []
    for index, item in enumerate(items):
        calls += manifest_module.parse_item(item, (), f"ops[{index}]")
    jobs = manifest_module.plan(calls).jobs
    # and the C++ host path, which serves conv2d's light sm_90a kernels (cache_tools.manifest._with_native_host)
    assert sorted(j.request.kernel for j in jobs if j.arch == "cpu") == sorted(
        ["add_cpu", "gelu_cpu", "layer_norm_cpu"] * 2 + ["host_path"])


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_after_its_prewarm_python_m_jitops_compiles_nothing(session_cache, tmp_path):
    """What `make run` does, on the CPU: the manifest of `python -m jitops`, its prewarm, then the run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JITOPS_")}
    env.update(PYTHONPATH=str(REPO), JITOPS_CACHE_DIR=str(session_cache))
    manifest = tmp_path / "run.json"
    made = subprocess.run([sys.executable, "-m", "jitops", "--manifest", "--arch", "cpu"], capture_output=True,
                          text=True, env=env, cwd=REPO, check=True)
    manifest.write_text(made.stdout)
    prewarm = subprocess.run([sys.executable, "-m", "cache_tools", "prewarm", "--manifest", str(manifest),
                              "--no-progress"], capture_output=True, text=True, env=env, cwd=REPO, timeout=1700)
    assert prewarm.returncode == 0, prewarm.stdout + prewarm.stderr
    ran = subprocess.run([sys.executable, "-m", "jitops", "--device", "cpu"], capture_output=True, text=True,
                         env=env, cwd=REPO, timeout=600)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "'compiles': 0" in ran.stdout and "compiled" not in ran.stdout.split("stats:")[1], ran.stdout


def test_make_run_prewarms_the_manifest_of_what_it_runs():
    run = (REPO / "Makefile").read_text().split("\nrun:", 1)[1].split("\n\n", 1)[0]
    lines = [line.strip() for line in run.splitlines() if line.startswith("\t")]
    assert "-m jitops --manifest --arch $(ARCHS)" in lines[0]
    assert "-m cache_tools prewarm --manifest" in lines[1] and "--all-builtin" not in run
    assert lines[-1].endswith("-m jitops")


# ---- skips, --version, help ---------------------------------------------------------------------------------------------
def test_expected_skips_print_as_one_summary_line(capsys, monkeypatch, tmp_path):
    import jitops.ops

    monkeypatch.setattr(jitops.ops, "PREWARM", [dict(GELU_ITEM, dtypes=["i32", "i64"])])
    code, out, err = cli(capsys, "prewarm", "--all-builtin", "--arch", "cpu", "--cache-dir", tmp_path / "c")
    assert code == 0
    assert "2 combinations skipped: dtype not supported on the target; --verbose lists them" in out
    assert "skipped gelu" not in out
    code, out, err = cli(capsys, "prewarm", "--all-builtin", "--arch", "cpu", "--cache-dir", tmp_path / "c",
                         "--verbose")
    assert out.count("  skipped gelu") == 2 and "has dtype int32 on cpu" in out


def test_kernels_skipped_with_skip_unbuildable_print_as_one_line(capsys, monkeypatch, tmp_path):
    """make run prewarms with --skip-unbuildable: on a machine whose compilers lack an arch those kernels are
    expected, so they are one line (as a real failure, without the flag, each is named)."""
    monkeypatch.setattr(toolkit, "nvrtc_archs", lambda: (75, 80))
    items = [{"op": "add", "dtypes": ["fp16", "bf16"], "shapes": [[[256], [256]]]}]
    manifest = write_manifest(tmp_path / "m.json", *items)
    argv = ["prewarm", "--manifest", manifest, "--arch", "sm_90a", "--cache-dir", tmp_path / "c", "--no-progress"]
    code, out, err = cli(capsys, *argv, "--skip-unbuildable")
    assert code == 0
    assert ("2 kernels cannot be built here (skipped): NVRTC here compiles for sm_75, sm_80, not sm_90; --verbose "
            "lists them") in out, out
    assert "cannot build here: jitops::" not in out
    code, out, err = cli(capsys, *argv, "--skip-unbuildable", "--verbose")
    assert code == 0 and out.count("cannot build here: jitops::add_forward") == 2, out
    code, out, err = cli(capsys, *argv)
    assert code == 1 and out.count("cannot build here: jitops::add_forward") == 2, out


def test_version_and_help_that_points_at_something_that_exists(capsys):
    code, out, err = cli(capsys, "--version")
    assert code == 0 and f"jitops {jitops.__version__}" in out
    for argv in (["--help"], ["prewarm", "--help"], ["verify", "--help"]):
        code, out, err = cli(capsys, *argv)
        assert code == 0 and "docs/" not in out and "manifest format" in out and '"kernel_op"' in out
    assert "layer_norm" in out and "grouped_gemm" in out  # the public ops, from the registry


# ---- bad input ----------------------------------------------------------------------------------------------------------
@pytest.mark.skipif(not HAS_CUDA_COMPILER, reason="no NVRTC or nvcc here to ask which archs they support")
@pytest.mark.parametrize("command", ["prewarm", "verify", "explain", "pull", "manifest-archs"])
def test_an_arch_no_compiler_supports_is_bad_input_and_touches_nothing(command, tmp_path, capsys):
    cache = tmp_path / "cache"
    manifest = write_manifest(tmp_path / "m.json", GELU_ITEM, archs=["sm_80"])
    argv = {"prewarm": ["prewarm", "--manifest", manifest, "--arch", "sm_999"],
            "verify": ["verify", "--manifest", manifest, "--arch", "sm_999"],
            "explain": ["explain", "gelu", "--dtype", "bf16", "--shape", "8x8", "--arch", "sm_999"],
            "pull": ["pull", "--manifest", manifest, "--arch", "sm_999", "--remote", "redis://127.0.0.1:1/0"],
            "manifest-archs": ["prewarm", "--manifest", write_manifest(tmp_path / "bad.json", GELU_ITEM,
                                                                        archs=["sm_80", "sm_999"])]}[command]
    code, out, err = cli(capsys, *argv, "--cache-dir", cache)
    assert code == 2 and "--arch sm_999: no compiler here can build for it" in err and "sm_90" in err, err
    assert not cache.exists()


def test_a_compiler_that_lacks_one_arch_reports_its_kernels_as_unbuildable(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(toolkit, "nvrtc_archs", lambda: (75, 80))
    item = {"op": "add", "dtypes": ["fp16"], "shapes": [[[256], [256]]]}
    code, report = cli_json(capsys, "prewarm", "--manifest", write_manifest(tmp_path / "m.json", item),
                            "--arch", "sm_90a", "--cache-dir", tmp_path / "c")
    assert code == 1
    (result,) = report["results"]
    assert result["outcome"] == "unbuildable" and result["error"] == "NVRTC here compiles for sm_75, sm_80, not sm_90"


def test_export_into_a_missing_directory_is_bad_input_and_an_empty_export_warns(tmp_path, capsys):
    missing = tmp_path / "no" / "such" / "dir" / "k.tar"
    code, out, err = cli(capsys, "export", missing, "--cache-dir", tmp_path / "cache")
    assert code == 2 and f"the directory {missing.parent} does not exist" in err and "mkdir -p" in err
    assert not (tmp_path / "no").exists()
    code, out, err = cli(capsys, "export", tmp_path / "empty.tar", "--cache-dir", tmp_path / "cache")
    assert code == 0 and "warning: no entries to export" in err and (tmp_path / "empty.tar").is_file()


def test_an_export_that_cannot_be_written_where_named_is_bad_input(tmp_path, capsys, monkeypatch):
    """The archive's directory is checked before any entry is read: a file in its place, a read-only
    filesystem; the remedy is about the archive's path, not --cache-dir."""
    from cache_tools import common

    cache = tmp_path / "cache"
    assert cli(capsys, "prewarm", "--manifest", write_manifest(tmp_path / "m.json", GELU_ITEM, archs=["sm_80"]),
               "--cache-dir", cache, "--no-progress")[0] == 0
    a_file = tmp_path / "m.json"
    code, out, err = cli(capsys, "export", a_file / "k.tar", "--cache-dir", cache)
    assert code == 2 and f"cannot write {a_file / 'k.tar'}: {a_file} is a file, not a directory" in err, err
    assert "mkdir" not in err
    shipped = tmp_path / "ship"
    shipped.mkdir()
    real = os.statvfs

    class ReadOnly:
        def __init__(self, path):
            self.f_flag = real(path).f_flag | (os.ST_RDONLY if Path(path) == shipped else 0)

    monkeypatch.setattr(common.os, "statvfs", ReadOnly)
    code, out, err = cli(capsys, "export", shipped / "k.tar", "--cache-dir", cache)
    assert code == 2 and f"{shipped} is on a read-only filesystem; write the file to a writable directory" in err
    assert "--cache-dir" not in err and list(shipped.iterdir()) == []


def test_an_export_that_fails_half_way_names_the_archive_and_leaves_nothing(tmp_path, capsys, monkeypatch):
    from cache_tools import archive

    cache = tmp_path / "cache"
    assert cli(capsys, "prewarm", "--manifest", write_manifest(tmp_path / "m.json", GELU_ITEM, archs=["sm_80"]),
               "--cache-dir", cache, "--no-progress")[0] == 0
    written = []

    def full_disk(tar, name, data, mtime):
        if written:
            raise OSError(errno.ENOSPC, "No space left on device")
        written.append(name)

    monkeypatch.setattr(archive, "_add", full_disk)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    code, out, err = cli(capsys, "export", out_dir / "k.tar", "--cache-dir", cache)
    assert code == 1, err
    assert (f"cannot write {out_dir / 'k.tar'}: No space left on device; the disk is full: free space there or "
            "write the file to another disk") in err
    assert "--cache-dir" not in err and "Traceback" not in err and list(out_dir.iterdir()) == []


def test_paths_that_are_files_where_a_directory_belongs_or_the_reverse(tmp_path, capsys):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    code, out, err = cli(capsys, "prewarm", "--manifest", write_manifest(tmp_path / "m.json", GELU_ITEM,
                                                                          archs=["sm_80"]),
                         "--cache-dir", a_file / "cache")
    assert code == 2 and f"the cache root {a_file / 'cache'} cannot be made: {a_file} is a file" in err, err
    code, out, err = cli(capsys, "import", tmp_path, "--cache-dir", tmp_path / "cache")
    assert code == 2 and f"archive {tmp_path} is a directory; give the archive file `export` wrote" in err, err
    assert "Errno" not in err and not (tmp_path / "cache").exists()


def test_a_read_only_cache_root_is_bad_input_before_anything_changes(tmp_path, capsys, monkeypatch):
    from cache_tools import common

    cache = tmp_path / "cache"
    assert cli(capsys, "prewarm", "--manifest", write_manifest(tmp_path / "m.json", GELU_ITEM, archs=["sm_80"]),
               "--cache-dir", cache, "--no-progress")[0] == 0
    real = os.statvfs

    class ReadOnly:
        def __init__(self, path):
            self.f_flag = real(path).f_flag | os.ST_RDONLY

    monkeypatch.setattr(common.os, "statvfs", ReadOnly)
    code, out, err = cli(capsys, "prune", "--max-size", "0", "--cache-dir", cache)
    assert code == 2 and f"the cache root {cache} is on a read-only filesystem" in err
    assert "give a writable --cache-dir" in err and "Errno" not in err
    assert len(entry_dirs(cache)) == 2


def test_filesystem_errors_name_the_path_and_the_remedy(tmp_path, capsys, monkeypatch):
    error = OSError(errno.EROFS, "Read-only file system", "/c/v1/sm_80/x", None, "/c/v1/tmp/x.removed")
    assert os_error_message(error) == ("Read-only file system: /c/v1/sm_80/x -> /c/v1/tmp/x.removed; the filesystem "
                                       "is read-only: give a writable --cache-dir (a read-only cache is read, never "
                                       "changed, through JITOPS_CACHE_PATH)")
    assert "the disk is full" in os_error_message(OSError(errno.ENOSPC, "No space left on device", "/c/x"))
    # a file the user named gets a remedy about that file, not about --cache-dir
    denied = OSError(errno.EACCES, "Permission denied", "/ship/k.tar")
    assert os_error_message(denied, "output") == ("Permission denied: /ship/k.tar; permission denied: write the "
                                                  "file to a directory you can write")
    assert os_error_message(denied, "input") == ("Permission denied: /ship/k.tar; permission denied: run as a user "
                                                 "who can read it, or copy it somewhere readable")
    cache = tmp_path / "cache"
    assert cli(capsys, "prewarm", "--manifest", write_manifest(tmp_path / "m.json", GELU_ITEM, archs=["sm_80"]),
               "--cache-dir", cache, "--no-progress")[0] == 0

    def refuse(path, root):
        raise OSError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(jitops.runtime.disk_cache().__class__, "remove", lambda self, path, root: refuse(path, root))
    code, out, err = cli(capsys, "prune", "--max-size", "0", "--cache-dir", cache)
    assert code == 1 and "Permission denied: " + str(cache) in err and "run as the owner" in err
    assert "Errno" not in err


def test_explain_of_a_call_the_op_rejects_says_what_to_change_on_the_command_line(tmp_path, capsys):
    code, out, err = cli(capsys, "explain", "layer_norm_backward", "--dtype", "bf16", "--shape", "4096x1024",
                         "--arch", "sm_80", "--cache-dir", tmp_path / "c")
    assert code == 2 and ("explain: error: layer_norm (layer_norm_backward) bf16 [[4096, 1024]] on sm_80: "
                          "jitops.layer_norm_backward: 1 shape given for 4 tensor arguments (grad, x, stats, weight): "
                          "give one shape per tensor argument, in order") in err, err
    assert "nothing was built" not in err and '"archs"' not in err  # a manifest's words, not explain's
    code, out, err = cli(capsys, "explain", "gelu", "--dtype", "i32", "--shape", "8x8", "--arch", "cpu",
                         "--cache-dir", tmp_path / "c")
    assert code == 2 and "gelu i32 [[8, 8]] on cpu: jitops.gelu: argument 'x' has dtype int32 on cpu" in err, err


def test_a_prewarm_that_cannot_store_says_where_and_what_to_do(tmp_path, capsys, monkeypatch):
    """The disk fills during a prewarm: each kernel's failure names the cache root, the cause and the remedy
    (it said 'could not store ... in ROOT' alone)."""
    from jitops.cache import disk

    def full(path):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(disk, "_fsync_path", full)
    cache = tmp_path / "cache"
    code, out, err = cli(capsys, "prewarm", "--manifest", write_manifest(tmp_path / "m.json", GELU_ITEM,
                                                                          archs=["sm_80"]),
                         "--cache-dir", cache, "--no-progress")
    assert code == 1
    assert out.count("could not store jitops::gelu_forward<") == 2, out
    assert (f"No space left on device: {cache}; the disk is full: free space there (`prune --max-size SIZE` frees "
            "cache space) or give a --cache-dir on another disk") in out, out
    assert entry_dirs(cache) == [] and "--skip-unbuildable" not in err  # nothing was unbuildable


def test_a_pull_that_cannot_store_says_where_and_what_to_do(tmp_path):
    from types import SimpleNamespace

    from cache_tools import remote

    full = SimpleNamespace(store=lambda key, blobs, meta: None, writable=SimpleNamespace(path=tmp_path),
                           store_error=OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "v1")))
    found = SimpleNamespace(key=SimpleNamespace(kernel="gelu_forward"), blobs={}, meta={"label": "gelu<bf16>"})
    with pytest.raises(OSError) as info:
        remote._store(full, found)
    assert os_error_message(info.value) == (f"could not store gelu<bf16>: No space left on device: {tmp_path}; the "
                                            "disk is full: free space there (`prune --max-size SIZE` frees cache "
                                            "space) or give a --cache-dir on another disk")


def test_remedy_lines_repeat_the_flags_in_use(tmp_path, capsys):
    cache = tmp_path / "my cache"
    manifest = write_manifest(tmp_path / "m.json", GELU_ITEM, archs=["sm_80"])
    code, out, err = cli(capsys, "verify", "--manifest", manifest, "--cache-dir", cache, "--arch", "sm_80")
    assert code == 1
    assert f"prewarm them: jitops-cache prewarm --manifest {manifest} --cache-dir '{cache}' --arch sm_80" in out


# ---- one mechanism for the backward's kernels -----------------------------------------------------------------------
def test_no_op_module_imports_the_runtime():
    for path in (REPO / "jitops" / "ops").glob("*.py"):
        source = path.read_text()
        assert "from ..runtime import" not in source and "jitops.runtime" not in source, path.name


def test_companions_work_on_fake_cpu_tensors_and_follow_needs():
    conv = jitops.conv2d.op
    args = conv.example_args("fp32", [[2, 8, 9, 9], [4, 8, 3, 3], None], {"stride": [2, 2]}, device="cpu")
    calls = conv.companion_calls(args)
    assert [op.name for op, _ in calls] == ["conv2d_input_grad", "conv2d_weight_grad"]
    grad = calls[0][1][0]
    assert grad.is_cpu and tuple(grad.shape) == (2, 4, 4, 4)
    assert [op.name for op, _ in conv.companion_calls(args, needs=(False, True, False))] == ["conv2d_weight_grad"]
    for op, call_args in calls:
        op.shape_class(*call_args)  # the backward's own checks accept them


def test_readme_set_up_gives_times_the_cpu_route_and_the_venv_commands():
    import re

    readme = (REPO / "README.md").read_text()
    setup = readme.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    assert "ARCHS=cpu make run" in setup
    assert "source .venv/bin/activate" in setup and ".venv/bin/jitops-cache" in setup
    rows = [line for line in setup.splitlines() if line.startswith("| `make")]
    assert len(rows) >= 4 and all(re.search(r"\d+(\.\d+)? (s|min)\b", row) for row in rows), rows
    tools = readme.split("## Cache tools", 1)[1].split("\n## ", 1)[0]
    assert ".venv/bin/jitops-cache" in tools


def test_info_lines_its_settings_up(tmp_path, capsys):
    code, out, err = cli(capsys, "info", "--cache-dir", tmp_path / "c")
    lines = [line for line in out.split("\nsettings:\n", 1)[1].splitlines() if line.startswith("  JITOPS_")]
    assert code == 0 and len(lines) > 5
    starts = {len(line) - len(line.split()[-1]) for line in lines if len(line.split()) == 2}
    assert len(starts) == 1, lines  # one column of values, even after JITOPS_REMOTE_MAX_ENTRY_SIZE
