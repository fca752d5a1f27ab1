"""`pip wheel .` gives one pure-Python wheel that ships the kernel sources inside jitops, and an installed wheel
computes the same cache keys as a source checkout."""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(REPO)],
                   check=True, timeout=600)
    wheels = list(out.glob("*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_one_pure_python_wheel(wheel):
    assert wheel.name.endswith("-py3-none-any.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.endswith((".so", ".pyd", ".pyc", ".cubin"))]


def test_kernel_sources_ship_inside_jitops_and_no_top_level_kernels_module(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {n.removeprefix("jitops/kernels/") for n in names if n.startswith("jitops/kernels/")}
    in_repo = {p.relative_to(REPO / "kernels").as_posix() for p in (REPO / "kernels").rglob("*") if p.is_file()}
    assert in_repo and in_repo <= shipped
    assert not [n for n in names if n.split("/")[0] == "kernels"]
    top_level = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top_level == {"jitops", "cache_tools"}


def test_installed_wheel_finds_its_kernels_and_computes_the_same_keys(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, timeout=300)
    code = ("import jitops, json; from jitops.specs import kernels_root, Target; from jitops.runtime import runtime;"
            "from jitops.ops.gelu import GELU_FORWARD;"
            "r = GELU_FORWARD.bind('bf16', T='__nv_bfloat16', VEC=8, APPROX=1, I='int');"
            "print(json.dumps([str(kernels_root()), runtime.key_for(r, Target.parse('sm_90'))[0].request_hash]))")
    import json
    import os
    env = dict(os.environ, PYTHONPATH=str(target))
    root, request_hash = json.loads(subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path,
                                                   capture_output=True, text=True, check=True).stdout)
    assert root == str(target / "jitops" / "kernels")
    from jitops.ops.gelu import GELU_FORWARD
    from jitops.runtime import runtime
    from jitops.specs import Target
    here = runtime.key_for(GELU_FORWARD.bind("bf16", T="__nv_bfloat16", VEC=8, APPROX=1, I="int"),
                           Target.parse("sm_90"))[0].request_hash
    assert request_hash == here
