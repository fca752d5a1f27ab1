"""The README's custom-op example: its declaration runs anywhere (and its kernel compiles without a GPU);
test_gpu_core runs the whole example on a GPU."""
from __future__ import annotations

import re
from pathlib import Path

import torch

import jitops
from jitops.specs import Target

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_blocks() -> list[str]:
    """The ```python blocks of the README section 'Your own op'."""
    text = README.read_text()
    section = text.split("## Your own op", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_readme_declaration_runs_and_its_kernel_compiles_without_a_gpu(fresh_cache):
    blocks = readme_blocks()
    assert len(blocks) >= 2
    namespace: dict = {}
    exec(blocks[0], namespace)  # noqa: S102 - the declaration part
    scaled_add = namespace["scaled_add"]
    assert str(torch.ops.mylib.scaled_add.default._schema).startswith("mylib::scaled_add(Tensor x, Tensor y, float")
    op = scaled_add.op
    args = op.example_args("bf16", [[1000], [1000]], {"alpha": 2.0})
    for request in op.requests_for(args, Target.parse("sm_90")).values():
        assert jitops.runtime.prewarm(request, Target.parse("sm_90")) == "compiled"
    exec(blocks[0], namespace)  # re-running the cell re-declares the op without an error
