"""Bad inputs get errors naming the op and the argument before anything launches; compile failures carry the
compiler log, the options and the numbered source lines."""
from __future__ import annotations

import pytest
import torch

import jitops
from jitops.errors import CompileError
from jitops.runtime import runtime
from jitops.specs import CudaKernel, Source, Target


@pytest.mark.parametrize("call, error, words", [
    (lambda: jitops.add(torch.randn(3), torch.randn(4)), ValueError, ["jitops.add", "'b'", "(4,)", "(3,)",
                                                                      "broadcast"]),
    (lambda: jitops.add(torch.randn(3), torch.ones(3, dtype=torch.int64)), TypeError,
     ["jitops.add", "'b'", "int64", "floating-point"]),
    (lambda: jitops.add(torch.ones(3, dtype=torch.int32), torch.ones(3, dtype=torch.int32)), TypeError,
     ["jitops.add", "'a'", "int32", "float32, float16, bfloat16, float64"]),
    (lambda: jitops.add(torch.randn(3), 2j), TypeError, ["jitops.add", "'b'", "complex"]),
    (lambda: jitops.add(torch.randn(3), torch.randn(3), alpha="2"), TypeError, ["jitops.add", "'alpha'", "str"]),
    (lambda: jitops.add(torch.randn(3), [1.0]), TypeError, ["jitops.add", "'b'", "list"]),
    (lambda: jitops.gelu(torch.ones(3, dtype=torch.int32)), TypeError, ["jitops.gelu", "'x'", "int32", "cpu"]),
    (lambda: jitops.gelu(torch.randn(3), "fast"), ValueError, ["jitops.gelu", "'approximate'", "'fast'", "tanh"]),
    (lambda: jitops.add(torch.randn(3), torch.randn(3, device="meta")), ValueError,
     ["jitops.add", "'b'", "meta", "cpu"]),
    (lambda: jitops.gelu([1.0, 2.0]), TypeError, ["gelu", "x"]),
    (lambda: jitops.gelu(torch.randn(4, 4).to_sparse()), TypeError, ["jitops.gelu", "'x'", "sparse"]),
])
def test_bad_inputs_name_the_op_and_argument(call, error, words):
    with pytest.raises(error) as info:
        call()
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_bad_input_is_caught_before_any_compile(fresh_cache):
    jitops.reset_stats()
    with pytest.raises(ValueError):
        jitops.add(torch.randn(3), torch.randn(4))
    assert jitops.stats.compiles == 0 and not fresh_cache.exists()


def test_bad_input_under_the_dispatcher_path_too():
    x = torch.randn(3, requires_grad=True)  # needs autograd: goes through torch.ops
    with pytest.raises(ValueError, match="jitops.add: argument 'b'"):
        jitops.add(x, torch.randn(4))


BROKEN = """\
#include "jitops/common.cuh"
template <typename T>
__global__ void broken(T* out, long long n) {
  out[0] = undefined_name + 1;
}
"""


def test_nvrtc_compile_error_has_log_options_and_numbered_excerpt(fresh_cache):
    kernel = CudaKernel("broken", Source.inline("broken", BROKEN), "broken<{T}>", "ptr i64")
    with pytest.raises(CompileError) as info:
        runtime.prewarm(kernel.bind("fp32", T="float"), Target.parse("sm_90"))
    error = info.value
    assert "undefined_name" in error.log and "-arch=sm_90" in error.options
    message = str(error)
    assert "broken.cu" in message and "compiling kernel 'broken<float>' for sm_90 with nvrtc failed" in message
    assert "> 4 |   out[0] = undefined_name + 1;" in message  # the line the compiler points at, numbered
    assert "  3 | __global__ void broken(T* out, long long n) {" in message


def test_compile_error_excerpt_for_gcc_style_logs():
    error = CompileError(kernel="k", backend="load_inline", arch="cpu", options=["-O3"],
                         log="main.cpp:2:5: error: 'x' was not declared", source="int a;\nx = 1;\nint b;\n",
                         source_name="main.cpp")
    assert "> 2 | x = 1;" in str(error)


def test_optional_tensor_and_dtype_arguments_are_understood():
    """Tensor? arguments get device checks, manifest shapes and gradient slots; ScalarType? arguments take dtype
    names in manifests."""


    calls = []

    def run(k, x, w, dtype):
        calls.append((w is not None, dtype))
        return x.clone() if w is None else x * w

    declared = jitops.op(
        "jitops_test::scale(Tensor x, Tensor? w=None, ScalarType? dtype=None) -> Tensor",
        shape_class=lambda x, w, dtype: x.dtype,
        cpu=jitops.Impl(lambda cls, target: {}, run),
        fake=lambda x, w, dtype: torch.empty_like(x),
        setup_context=lambda ctx, inputs, output: ctx.save_for_backward(inputs[1]),
        backward=lambda ctx, grad: (grad * ctx.saved_tensors[0], None),
    ).op
    assert [a.kind for a in declared.args] == ["tensor", "optional_tensor", "value"]
    assert declared.args[2].dtype
    with pytest.raises(ValueError, match="argument 'w' is on meta"):
        declared(torch.randn(3), torch.randn(3, device="meta"))
    x = torch.randn(3, requires_grad=True)
    w = torch.full((3,), 2.0)
    declared(x, w).sum().backward()
    assert torch.equal(x.grad, w)
    item = declared.manifest_item((torch.randn(2, 3), None, torch.bfloat16))
    assert item["shapes"] == [[[2, 3], None]] and item["kwargs"] == {"dtype": "bf16"}
    args = declared.example_args("fp32", [[2, 3], None], {"dtype": "bf16"})
    assert args[1] is None and args[2] is torch.bfloat16

