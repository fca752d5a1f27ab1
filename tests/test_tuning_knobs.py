"""Tuning sweeps set an op's constants through config scopes (gelu_tuning, layer_norm_tuning), never module
globals: the values reach the kernels' template arguments and buckets, and bad values are refused."""
from __future__ import annotations

import pytest
import torch

import jitops
from jitops.errors import ConfigError
from jitops.ops import gelu, gelu_plan, layer_norm_plan


def _template(request) -> str:
    return dict(request.params).get("UNROLL", "default")


def test_gelu_tuning_reaches_the_kernel_binding():
    cls = gelu.GeluClass(torch.bfloat16, 8, "tanh", "int")
    assert _template(gelu._bind_cuda(gelu.GELU_FORWARD, cls)) == "default"   # the planned values: template defaults
    with jitops.config.scope(gelu_tuning={"unroll_forward": 2, "fast_tanh": 1}):
        assert gelu_plan.tuning() == gelu_plan.GeluTuning(2, 2, 0, True)
        request = gelu._bind_cuda(gelu.GELU_FORWARD, cls)
        assert dict(request.params)["UNROLL"] == "2" and dict(request.params)["FAST"] == "1"
    assert gelu_plan.tuning() is gelu_plan.PLANNED


def test_a_kernel_set_keeps_the_tuning_it_was_built_with():
    class Loaded:
        pass

    k = Loaded()
    with jitops.config.scope(gelu_tuning={"unroll_backward": 4}):
        assert gelu._tuning_of(k).unroll_backward == 4
    assert gelu._tuning_of(k).unroll_backward == 4   # its kernels were built with 4


def test_layer_norm_tuning_changes_the_buckets():
    planned = layer_norm_plan.forward_class(torch.bfloat16, 8192, 8, 16384, "int")
    try:
        with jitops.config.scope(layer_norm_tuning={"forward_tile_bytes": 32}):
            layer_norm_plan.clear_buckets()
            tuned = layer_norm_plan.forward_class(torch.bfloat16, 8192, 8, 16384, "int")
    finally:
        layer_norm_plan.clear_buckets()
    assert tuned.iters < planned.iters
    assert layer_norm_plan.forward_class(torch.bfloat16, 8192, 8, 16384, "int") == planned


@pytest.mark.parametrize("name,value", [("gelu_tuning", {"unroll": 2}), ("gelu_tuning", {"unroll_forward": -1}),
                                        ("layer_norm_tuning", {"forward_tile_bytes": 1.5}), ("gelu_tuning", [4])])
def test_bad_tuning_values_are_refused(name, value):
    with pytest.raises(ConfigError, match=name):
        with jitops.config.scope(**{name: value}):
            pass
