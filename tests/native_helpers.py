"""Shared checks of the C++ host path's GPU tests (tests/test_native_gpu.py, test_native_layer_norm_gpu.py)."""
from __future__ import annotations

import torch

from jitops import native


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
