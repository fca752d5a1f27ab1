"""The disk key changes when any component changes and is stable across processes."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

import jitops
from jitops.keys import FORMAT_VERSION, CacheKey, explain_difference
from jitops.runtime import runtime
from jitops.specs import Source, Target
from jitops.ops.gelu import GELU_FORWARD

import fakes

SM90 = Target.parse("sm_90a")


def gelu_request(**overrides):
    params = dict(T="__nv_bfloat16", VEC=8, APPROX=1, I="int")
    params.update(overrides)
    return GELU_FORWARD.bind("bf16", **params)


def key_of(request, target=SM90) -> CacheKey:
    return runtime.key_for(request, target)[0]


def test_key_is_deterministic_within_a_process():
    assert key_of(gelu_request()).full == key_of(gelu_request()).full


def test_key_is_stable_across_processes():
    code = ("import jitops; from jitops.runtime import runtime; from jitops.specs import Target; "
            "from jitops.ops.gelu import GELU_FORWARD; "
            "r = GELU_FORWARD.bind('bf16', T='__nv_bfloat16', VEC=8, APPROX=1, I='int'); "
            "print(runtime.key_for(r, Target.parse('sm_90a'))[0].full)")
    outputs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).parent.parent).stdout.strip() for _ in range(2)}
    assert outputs == {key_of(gelu_request()).full}


@pytest.mark.parametrize("change", [
    pytest.param(lambda: gelu_request(VEC=4), id="shape class"),
    pytest.param(lambda: gelu_request(T="__half"), id="dtype template"),
    pytest.param(lambda: replace(gelu_request(), dtype="fp16"), id="dtype layer"),
    pytest.param(lambda: replace(gelu_request(), options=("--use_fast_math",)), id="flags"),
    pytest.param(lambda: replace(gelu_request(), kernel="gelu_forward2"), id="kernel name"),
    pytest.param(lambda: replace(gelu_request(), entry="jitops::gelu_forward<__nv_bfloat16, 8, 0, int>"),
                 id="entry"),
    pytest.param(lambda: replace(gelu_request(), backend="nvcc"), id="backend"),
])
def test_key_changes_with_each_request_component(change):
    assert key_of(change()).request_hash != key_of(gelu_request()).request_hash


def test_key_changes_with_arch():
    base = key_of(gelu_request(), Target.parse("sm_90"))
    assert key_of(gelu_request(), Target.parse("sm_80")).request_hash != base.request_hash
    assert key_of(gelu_request(), Target.parse("sm_80")).arch == "sm_80"


def test_arch_specific_kernels_get_the_a_target():
    request = replace(gelu_request(), arch_specific=True)
    assert key_of(request).arch == "sm_90a"
    assert key_of(gelu_request()).arch == "sm_90"  # plain kernels run on any sm_90 part


def test_key_covers_included_headers(tmp_path, monkeypatch):
    """Editing a header under kernels/ that a source includes (even transitively) changes the key."""
    root = tmp_path / "kernels"
    (root / "sub").mkdir(parents=True)
    (root / "top.cu").write_text('#include "sub/a.cuh"\n__global__ void k() {}\n')
    (root / "sub" / "a.cuh").write_text('#include "b.cuh"\n')
    (root / "sub" / "b.cuh").write_text("// version 1\n")
    monkeypatch.setattr("jitops.specs.kernels_root", lambda: root)
    source = Source.file("top.cu")
    before = source.closure()
    assert set(before) == {"top.cu", "sub/a.cuh", "sub/b.cuh"}
    (root / "sub" / "b.cuh").write_text("// version 2\n")
    after = source.closure()
    assert after["sub/b.cuh"] != before["sub/b.cuh"] and after["top.cu"] == before["top.cu"]


def test_inline_sources_hash_their_text_and_the_shipped_headers_they_include():
    a = Source.inline("k", '#include "jitops/common.cuh"\n// a\n')
    b = Source.inline("k", '#include "jitops/common.cuh"\n// b\n')
    assert "jitops/common.cuh" in a.closure()
    assert a.closure()["<inline>/k.cu"] != b.closure()["<inline>/k.cu"]


def test_key_covers_cutlass_version_for_cutlass_sources():
    source = Source.inline("c", "#include <cutlass/cutlass.h>\n")
    request = replace(gelu_request(), source=source)
    assert key_of(request).request["cutlass"] == jitops.backends.toolkit.cutlass_version()
    assert key_of(gelu_request()).request["cutlass"] is None  # no CUTLASS include, no CUTLASS component


def test_key_covers_compiler_identity_and_environment(monkeypatch):
    echo = fakes.install()
    request = fakes.request()
    first = key_of(request)
    echo.toolchain_identity = {"echo": "2.0"}
    second = key_of(request)
    assert second.toolchain_hash != first.toolchain_hash
    assert second.request_hash == first.request_hash  # same request, another compiler
    monkeypatch.setenv("JITOPS_TEST_ECHO_FLAG", "-O1")
    assert key_of(request).request_hash != first.request_hash


def test_key_components_are_stored_as_json_and_explain_a_miss():
    key = key_of(gelu_request())
    assert key.request["format"] == FORMAT_VERSION
    json.dumps(key.request)  # everything in the key is JSON
    other = key_of(gelu_request(VEC=4))
    diff = explain_difference(other.request, key.request)
    assert any(line.startswith("shape_class") for line in diff)
    assert any(line.startswith("entry") for line in diff)


def test_nvrtc_toolchain_identity_is_cheap_and_names_the_version():
    identity = runtime.key_for(gelu_request(), SM90)[0].toolchain
    assert identity["nvrtc"][0].isdigit()
    assert "cuda_headers" in identity


def test_remembered_closure_sees_an_edit_of_the_same_size(tmp_path, monkeypatch):
    """The closure walk is remembered per process and re-checked by file stamps; an old header rewritten with
    content of the same size (new mtime) is hashed again, and a just-written one is never remembered."""
    import os

    root = tmp_path / "kernels"
    root.mkdir()
    header = root / "h.cuh"
    (root / "k.cu").write_text('#include "h.cuh"\n')
    header.write_text("// one\n")
    old = 1_000_000_000
    for path in (header, root / "k.cu"):
        os.utime(path, (old, old))  # old files: the walk is remembered
    monkeypatch.setattr("jitops.specs.kernels_root", lambda: root)
    source = Source.file("k.cu")
    first = source.closure()
    assert jitops.specs._CLOSURES.get((source, str(root))) is not None
    header.write_text("// two\n")  # same size, fresh mtime
    second = source.closure()
    assert second["h.cuh"] != first["h.cuh"]
    assert jitops.specs._CLOSURES[(source, str(root))].digests["h.cuh"] == first["h.cuh"]  # racy: not stored
    header.write_text("// six\n")  # a second same-size write right away: still seen
    assert source.closure()["h.cuh"] not in (first["h.cuh"], second["h.cuh"])
