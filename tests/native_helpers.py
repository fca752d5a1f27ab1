"""Shared parts of the C++ host path's GPU tests (tests/test_native*_gpu.py)."""
from __future__ import annotations

import pytest
import torch

from jitops import native


def loaded_host_path(needs_sm90: str | None = None):
    """The C++ host path's module, built and loaded; skips without a GPU, and below sm_90 when `needs_sm90` says
    why the test needs it."""
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    if needs_sm90 and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip(needs_sm90)
    module = native.wait()
    assert module is not None, "the C++ host path did not build (see the jitops log)"
    return module


def check_cuda_graph_capture(call, leaves, grad_out) -> None:
    """call() (a jitops op on `leaves`) and its backward: twice on a side stream (the Python path offers, then the
    C++ path runs), then captured in a CUDA graph, which must take the C++ path once and, replayed, give the
    eager bits."""
    def step():
        for t in leaves:
            t.grad = None
        y = call()
        y.backward(grad_out)
        return y

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            eager_y = step().detach().clone()
            eager_grads = [t.grad.clone() for t in leaves]
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    before = native.counters()["native_calls"]
    for t in leaves:
        t.grad = None
    with torch.cuda.graph(graph):
        y = call()
        y.backward(grad_out)
    assert native.counters()["native_calls"] == before + 1
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, eager_y)
    for got, want in zip((t.grad for t in leaves), eager_grads):
        assert torch.equal(got, want)
