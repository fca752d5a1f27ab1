"""jitops.linear's C++ host path on a machine without a GPU: the extension builds through the runtime (cached,
a second process imports it), answers None for what it does not cover (CPU tensors, a stale config
generation), leaves jitops.linear's results to the Python path, and stays off with JITOPS_NATIVE_HOST=0.  Its
launches are tested on the GPU (tests/test_native_gpu.py)."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import jitops
from jitops import native


@pytest.fixture(scope="module")
def module():
    built = native.wait()
    assert built is not None, "the C++ host path did not build (see the jitops log)"
    return built


def test_cpu_tensors_are_left_to_the_python_path(module):
    x, w, b = torch.randn(4, 16), torch.randn(8, 16), torch.randn(8)
    before = native.counters()
    assert module.linear(x, w, b, 0, jitops.config.generation) is None
    assert native.counters()["native_misses"] == before["native_misses"] + 1
    torch.testing.assert_close(jitops.linear(x, w, b), torch.nn.functional.linear(x, w, b))
    assert native.counters()["native_calls"] == before["native_calls"]


def test_not_tensors_get_the_python_path_error(module):
    with pytest.raises((TypeError, ValueError), match="linear"):
        jitops.linear([1.0, 2.0], torch.randn(8, 2))


def test_an_offer_with_params_of_the_wrong_size_is_refused(module):
    with pytest.raises(RuntimeError, match="Params of 10 bytes, expected 448"):
        module.offer(0, True, False, True, True, 64, 64, 64, 64, 64, 64, 0, 0, False, jitops.config.generation,
                     0, (1, 1, 1), 384, 1024, (0, 128, 256), 384, b"0" * 10, 0, 0)


def test_an_offer_with_a_bad_workspace_is_refused(module):
    with pytest.raises(RuntimeError, match="bad workspace"):  # slices without counters
        module.offer(0, True, False, True, True, 64, 64, 64, 64, 64, 64, 0, 0, False, jitops.config.generation,
                     0, (1, 1, 1), 384, 1024, (0, 128, 256), 384, bytes(448), 64, 0)


def test_a_problem_offered_under_another_generation_is_not_used(module):
    # Offered under generation g, asked under g + 1: a miss before any check of the tensors.
    generation = jitops.config.generation
    module.offer(0, True, False, True, True, 64, 64, 64, 64, 64, 64, 0, 0, False, generation, 0, (1, 1, 1), 384,
                 1024, (0, 128, 256), 384, bytes(448), 0, 0)
    assert native.counters()["native_problems"] >= 1
    before = native.counters()["native_misses"]
    assert module.linear(torch.randn(64, 64), torch.randn(64, 64), None, 0, generation + 1) is None
    assert native.counters()["native_misses"] == before + 1


def test_native_host_off_builds_nothing():
    host = native._Host()
    host.runtime = jitops.runtime
    with jitops.config.scope(native_host=False):
        host.start()
        assert host.wait() is None
    assert host.module is None and host._future is None


def test_a_second_process_imports_the_cached_build(module):
    code = ("import jitops, time; from jitops import native; t = time.perf_counter(); m = native.wait(); "
            "print(m is not None, jitops.stats.compiles, round(time.perf_counter() - t, 3))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    loaded, compiles, seconds = out.stdout.split()
    assert loaded == "True" and compiles == "0", out.stdout + out.stderr


def _plan(op: str, shapes, archs=("sm_90a",)):
    from cache_tools import manifest

    item = {"op": op, "dtypes": ["bf16"], "shapes": [shapes], "grad": True}
    return manifest.plan(manifest.parse_item(item, list(archs), "test"))


def test_prewarm_plans_the_host_path_beside_the_light_gemm():
    linear = [[512, 1024], [1024, 1024], [1024]]
    kernels = {job.request.kernel for job in _plan("linear", linear).jobs}
    assert {"gemm_sm90_light", "host_path"} <= kernels
    with jitops.config.scope(native_host=False):
        assert "host_path" not in {job.request.kernel for job in _plan("linear", linear).jobs}
    assert "host_path" not in {job.request.kernel for job in _plan("gelu", [[512, 1024]]).jobs}
    assert "host_path" not in {job.request.kernel for job in _plan("linear", linear, ("sm_80",)).jobs}


def test_gelu_kernels_launched_before_the_extension_loads_are_offered_later(monkeypatch):
    """A GELU launched while the extension still builds is offered at a later launch, not marked as done."""
    from types import SimpleNamespace

    offered = []
    fake = SimpleNamespace(offer_gelu=lambda *args: offered.append(args))
    kernels = SimpleNamespace()
    cls = SimpleNamespace(dtype=torch.bfloat16, approximate="tanh", vec=8, index="int")
    function = SimpleNamespace(handle=1234)
    monkeypatch.setattr(native.host, "module", None)
    native.offer_gelu(kernels, function, cls, 0, False, 1024, 256)
    assert getattr(kernels, "native_offered", None) != jitops.config.generation and not offered
    monkeypatch.setattr(native.host, "module", fake)
    native.offer_gelu(kernels, function, cls, 0, False, 1024, 256)
    assert kernels.native_offered == jitops.config.generation and len(offered) == 1
    assert offered[0][:6] == (0, True, True, 8, True, False) and offered[0][7:] == (1234, 256, 1024)


def _function(signature, handle):
    """A loaded kernel as far as a Recording sees it (CudaFunction's packing, no driver): launches are kept."""
    import struct

    from jitops.launch import PARAM_KINDS, CudaFunction, _field_offsets

    function = object.__new__(CudaFunction)
    function.signature, function.handle, function.label = tuple(signature), handle, f"fake{handle}"
    function._struct = struct.Struct("@" + "".join(PARAM_KINDS[k] for k in signature))
    function._offsets = _field_offsets(signature)
    function.launches = []
    function.launch = lambda grid, block, *args, shared_mem=0: function.launches.append((grid, block, args))
    return function


def test_a_recording_encodes_slots_workspaces_and_literals():
    import struct

    from types import SimpleNamespace

    main = _function(("ptr", "ptr", "ptr", "ptr", "i64", "f64"), 11)
    reduce = _function(("ptr", "ptr", "i64"), 12)
    kernels = SimpleNamespace(main=main, reduce=reduce, shape_class="the class")
    x, y, partial = torch.zeros(4, 8), torch.zeros(4, 8), torch.zeros(2, 3, 8)
    recording = native.Recording(kernels)
    assert recording.shape_class == "the class"
    recording.main.launch((3, 2), 128, x, None, partial, y, 77, 0.5, shared_mem=64)
    recording.reduce.launch(5, (32, 4), partial, y, 9)
    assert len(main.launches) == 1 and len(reduce.launches) == 1   # the launches ran as usual

    launches, workspaces = native.encode(recording, (x, None, y))
    assert workspaces == [(3, partial.numel() * 4)]                 # after the call's three slots
    handle, grid, block, smem, arguments, offsets, pointers = launches[0]
    assert (handle, grid, block, smem) == (11, (3, 2, 1), (128, 1, 1), 64)
    assert offsets == [0, 8, 16, 24, 32, 40]
    assert pointers == [(0, 0), (16, 3), (24, 2)]                   # the None pointer has no entry
    assert struct.unpack("@PPPPqd", arguments) == (0, 0, 0, 0, 77, 0.5)
    assert launches[1][1:3] == ((5, 1, 1), (32, 4, 1)) and launches[1][6] == [(0, 3), (8, 2)]


def test_every_view_of_a_workspace_is_that_workspace():
    # The stem conv's run writes its im2col matrix through the tensor it allocated and its fprop reads it through
    # a permuted view: one workspace, or the replayed fprop reads memory nothing wrote.
    from types import SimpleNamespace

    kernels = SimpleNamespace(write=_function(("ptr", "ptr"), 21), read=_function(("ptr", "ptr"), 22))
    x, y = torch.zeros(2, 4, 6), torch.zeros(2, 4, 6)

    def run(kern, x, y):
        matrix = torch.empty(2, 6, 4)
        kern.write.launch(1, 32, x, matrix)
        kern.read.launch(1, 32, matrix.permute(0, 2, 1), y)
        return y

    recording = native.Recording(kernels)
    recording.watched(run, x, y)
    launches, workspaces = native.encode(recording, (x, y))
    assert workspaces == [(2, 2 * 6 * 4 * 4)]
    assert launches[0][6] == [(0, 0), (8, 2)] and launches[1][6] == [(0, 2), (8, 1)]


def test_a_light_kernels_params_launch_is_kept_with_its_address_fields():
    # A light kernel's host side launches its packed Params itself (jitops/light_conv.py); the Recording keeps
    # the launch as one kernel parameter whose descriptor address fields and bias field the replay fills.
    import struct

    from types import SimpleNamespace

    function = _function((), 31)
    kernels = SimpleNamespace(conv=function)
    params = bytearray(512)
    for at in (0 + 16, 128 + 16, 256 + 16, 384):
        struct.pack_into("<Q", params, at, 0xABCDEF00)   # the last call's addresses, left in the bytes
    struct.pack_into("<i", params, 392, 77)
    owner = SimpleNamespace(function=function, info=SimpleNamespace(threads=384, smem=200000))
    packed = SimpleNamespace(owner=owner, params=params, grid=(132, 1, 1), address_field=16, descriptors=(0, 128, 256),
                             a_descriptors=(0,), bias_field=384)
    x, w, y = torch.zeros(4, 8), torch.zeros(8, 8), torch.zeros(4, 8)
    recording = native.Recording(kernels)
    recording.conv.keep_params_launch(packed, (x, w, y, None))
    launches, workspaces = native.encode(recording, (x, w, None, y))
    assert workspaces == []
    [(handle, grid, block, smem, arguments, fields, pointers)] = launches
    assert (handle, grid, block, smem, fields) == (31, (132, 1, 1), (384, 1, 1), 200000, [0])
    assert pointers == [(16, 0), (144, 1), (272, 3)]                 # the None bias has no entry
    assert all(struct.unpack_from("<Q", arguments, at)[0] == 0 for at in (16, 144, 272, 384))  # zeroed
    assert struct.unpack_from("<i", arguments, 392)[0] == 77 and len(arguments) == 512
    # A strided dgrad's kernel: dy's address goes into each phase's descriptor (light_conv's Phase entries).
    phased = SimpleNamespace(**{**vars(packed), "params": params + bytearray(768), "a_descriptors": (512, 704)})
    recording = native.Recording(kernels)
    recording.conv.keep_params_launch(phased, (x, w, y, y))
    [(*_, arguments, _, pointers)] = native.encode(recording, (x, w, None, y))[0]
    assert pointers == [(528, 0), (720, 0), (144, 1), (272, 3), (384, 3)] and len(arguments) == 1280
    # A driver whose descriptors are patched through cuTensorMapReplaceAddress: nothing a replay can write.
    recording = native.Recording(kernels)
    packed.address_field = None
    recording.conv.keep_params_launch(packed, (x, w, y, None))
    assert recording.launches == []


def test_a_recording_with_a_raw_address_is_not_offered():
    from types import SimpleNamespace

    kernels = SimpleNamespace(main=_function(("ptr", "i64"), 13))
    recording = native.Recording(kernels)
    recording.main.launch(1, 32, 0xDEAD00, 4)
    assert native.encode(recording, ()) is None


def test_layer_norm_offers_are_checked_and_cpu_calls_left_to_python(module):
    generation = jitops.config.generation
    x = torch.randn(4, 8)
    with pytest.raises(RuntimeError, match="pointer field out of range"):
        module.offer_layer_norm(0, x, 4, 8, False, False, 0, 1e-5, False, False, False, False, generation,
                                [(1, (1, 1, 1), (32, 1, 1), 0, bytes(16), [0, 8], [(12, 0)])], [])
    with pytest.raises(RuntimeError, match="bad workspace slot"):
        module.offer_layer_norm(0, x, 4, 8, False, False, 0, 1e-5, False, False, False, True, generation, [],
                                [(1, 64)])
    before = native.counters()["native_misses"]
    assert module.layer_norm(x, 8, None, None, 1e-5, False, generation) is None
    assert native.counters()["native_misses"] == before + 1
    torch.testing.assert_close(jitops.layer_norm(x, 8), torch.nn.functional.layer_norm(x, (8,)))


def test_offers_are_once_per_generation_and_bounded():
    offers = native.Offers(limit=2)
    assert offers.first("a") and not offers.first("a")
    assert offers.first("b") and not offers.first("c")       # the limit: "c" stays on the Python path
    with jitops.config.scope(progress_seconds=5.0):          # another generation starts empty
        assert offers.first("a") and offers.first("c")


def test_a_run_is_recorded_only_the_first_time_its_problem_runs():
    from types import SimpleNamespace

    main = _function(("ptr", "i64"), 21)
    kernels = SimpleNamespace(main=main)
    offers = native.Offers()
    x = torch.zeros(4)

    def run(k, x):
        k.main.launch(1, 32, x, 4)
        return x

    result, recording = native.run_recorded_once(offers, "problem", kernels, run, x)
    assert result is x and len(recording.launches) == 1
    result, recording = native.run_recorded_once(offers, "problem", kernels, run, x)
    assert result is x and recording is None and len(main.launches) == 2   # ran again, not recorded


def _host_call(address=0xC0FFEE):
    """A host-library function as a Recording sees it (launch.host_function's wrapper): calls are kept."""
    from jitops.ops.conv2d import _ARGS

    calls = []

    def jitops_conv2d(*args):
        calls.append(args)
        return 0
    jitops_conv2d.address, jitops_conv2d.arg_kinds, jitops_conv2d.calls = address, _ARGS, calls
    return jitops_conv2d


def _library(**functions):
    from jitops.launch import HostLibrary

    library = object.__new__(HostLibrary)
    library.__dict__.update(functions)
    return library


def test_a_watched_recording_encodes_host_calls_with_the_stream():
    import struct
    from types import SimpleNamespace

    kernels = SimpleNamespace(fprop=_library(jitops_conv2d=_host_call()))
    x, w = torch.zeros(2, 8, 4, 4), torch.zeros(8, 8, 1, 1)
    stream = 0x5EED

    def run(k, x, w):
        y = torch.empty(2, 8, 4, 4)
        k.fprop.jitops_conv2d(x, w, y, None, *range(15), 1, 2, 3, 1, 0, 132, stream)
        return y

    recording = native.Recording(kernels)
    y = recording.watched(run, x, w)
    assert recording.pure and len(kernels.fprop.jitops_conv2d.calls) == 1
    launches, workspaces = native.encode(recording, (x, w, None, y), stream)
    address, grid, block, smem, arguments, kinds, pointers = launches[0]
    assert (address, grid, block, smem, workspaces) == (0xC0FFEE, (0, 0, 0), (0, 0, 0), 0, [])
    assert kinds == [0] * 4 + [1] * 15 + [2] * 3 + [1] * 3 + [0]
    assert pointers == [(0, 0), (8, 1), (16, 3), (200, native.STREAM_SLOT)]
    assert struct.unpack("<26q", arguments)[4:25] == (*range(15), 1, 2, 3, 1, 0, 132)
    assert native.encode(recording, (x, w, None, y), stream=0x0DD) is None   # another stream: not replayable
    stream = 0                                                              # the legacy default stream's handle
    recording = native.Recording(kernels)
    y = recording.watched(run, x, w)
    assert native.encode(recording, (x, w, None, y), stream)[0][0][6][-1] == (200, native.STREAM_SLOT)


def test_a_watched_run_that_copies_or_passes_foreign_tensors_is_not_offered():
    from types import SimpleNamespace

    kernels = SimpleNamespace(fprop=_library(jitops_conv2d=_host_call()))
    x, w, y = torch.zeros(2, 8, 4, 4), torch.zeros(8, 8, 1, 1), torch.zeros(2, 8, 4, 4)
    elsewhere = torch.zeros(2, 8, 4, 4)

    def copying(k, x):
        k.fprop.jitops_conv2d(x.permute(0, 2, 3, 1).contiguous(), w, y, None, *range(15), 1, 2, 3, 1, 0, 1, 7)
        return y

    recording = native.Recording(kernels)
    recording.watched(copying, x)
    assert not recording.pure and native.encode(recording, (x, w, None, y), 7) is None

    def foreign(k, x):  # a tensor the run did not allocate and that is no slot: its contents would be lost
        k.fprop.jitops_conv2d(x, w, elsewhere, None, *range(15), 1, 2, 3, 1, 0, 1, 7)
        return y

    recording = native.Recording(kernels)
    recording.watched(foreign, x)
    assert recording.pure and native.encode(recording, (x, w, None, y), 7) is None


def test_conv2d_offers_are_checked_and_cpu_calls_left_to_python(module):
    generation = jitops.config.generation
    x = torch.randn(2, 8, 4, 4).to(memory_format=torch.channels_last)
    with pytest.raises(RuntimeError, match="not jitops_conv2d's"):
        module.offer_conv2d(0, x, [2, 8, 4, 4], [8, 8, 1, 1], (1, 1), (0, 0), (1, 1), False, generation,
                            [(1, (0, 0, 0), (0, 0, 0), 0, bytes(16), [0, 0], [])], [])
    before = native.counters()["native_misses"]
    w = torch.randn(8, 8, 1, 1).to(memory_format=torch.channels_last)
    assert module.conv2d(x, w, None, (1, 1), (0, 0), (1, 1), generation) is None
    assert native.counters()["native_misses"] == before + 1


DISPATCHED = ("gemm", "linear", "gelu", "gelu_backward", "layer_norm_forward", "layer_norm_inference",
              "layer_norm_backward")


def test_dispatcher_kernels_sit_at_backend_select(module):
    for name in DISPATCHED:
        dump = torch._C._dispatch_dump(f"jitops::{name}")
        assert "BackendSelect: registered at" in dump and "dispatch.h" in dump, dump


def test_dispatched_cpu_and_meta_calls_pass_on_to_python(module):
    # Through torch.ops (torch.compile's graphs call the ops this way): the C++ kernel passes every CPU and meta
    # call on, uncounted, and the Python implementation answers as before.
    before = native.counters()
    a, b, bias = torch.randn(5, 16), torch.randn(16, 8), torch.randn(8)
    torch.testing.assert_close(torch.ops.jitops.gemm(a, b, bias, "relu"), torch.relu(a @ b + bias))
    torch.testing.assert_close(torch.ops.jitops.linear(a, b.t(), bias), torch.nn.functional.linear(a, b.t(), bias))
    torch.testing.assert_close(torch.ops.jitops.gelu(a, "tanh"), torch.nn.functional.gelu(a, approximate="tanh"))
    x = torch.randn(3, 7, 16, requires_grad=True)
    w = torch.randn(16, requires_grad=True)
    y, stats = torch.ops.jitops.layer_norm_forward(x, [16], w, None, 1e-5)
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(x, [16], w, None, 1e-5))
    y.sum().backward()
    assert x.grad.shape == x.shape and w.grad.shape == w.shape
    image, filters = torch.randn(2, 8, 6, 6), torch.randn(4, 8, 3, 3)
    torch.testing.assert_close(torch.ops.jitops.conv2d(image, filters, None, [1, 1], [1, 1], [1, 1]),
                               torch.nn.functional.conv2d(image, filters, padding=1))
    meta = torch.ops.jitops.gemm(a.to("meta"), b.to("meta"))
    assert meta.device.type == "meta" and meta.shape == (5, 8)
    assert native.counters()["native_calls"] == before["native_calls"]
    assert native.counters()["native_misses"] == before["native_misses"]


DIFFERENTIABLE = ("gemm", "linear", "gelu", "layer_norm_forward", "conv2d")


def _python_autograd_calls(fn) -> list[str]:
    """The frames of torch.library's Python autograd kernel that fn runs through."""
    calls = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_name in ("autograd_impl", "forward_no_grad"):
            calls.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls


def test_autograd_kernels_in_cpp_take_the_calls_that_record_no_gradient(module):
    """A compiled graph calls the ops through the dispatcher with no gradient to record: those calls go below
    autograd in C++, without torch.library's Python autograd kernel; a call that records one still takes it, with
    the same gradients."""
    for name in DIFFERENTIABLE:
        dump = torch._C._dispatch_dump(f"jitops::{name}")
        assert "AutogradCPU: registered at" in dump and "AutogradCUDA: registered at" in dump, dump
    x, w, b = (torch.randn(*shape, dtype=torch.float64, requires_grad=True) for shape in ((4, 16), (8, 16), (8,)))
    with torch.no_grad():
        assert _python_autograd_calls(lambda: torch.ops.jitops.linear(x, w, b, "gelu")) == []
    assert _python_autograd_calls(lambda: torch.ops.jitops.gemm(x.detach(), w.detach().t(), None, None, None)) == []
    assert _python_autograd_calls(lambda: torch.ops.jitops.linear(x, w, b, "gelu")) == ["autograd_impl"]
    torch.autograd.gradcheck(lambda *t: torch.ops.jitops.linear(*t, "gelu_tanh"), (x, w, b))
    torch.autograd.gradcheck(lambda t: torch.ops.jitops.gelu(t, "none"), (x,))
    y, _ = torch.ops.jitops.layer_norm_forward(x, [16], None, None, 1e-5)
    want = torch.nn.functional.layer_norm(x, [16], eps=1e-5)
    torch.testing.assert_close(torch.autograd.grad((y * y).sum(), x)[0], torch.autograd.grad((want * want).sum(), x)[0])


def test_a_compiled_patched_models_step_runs_no_python_autograd(module):
    """A patched GPT-2 compiled (aot_eager: its graphs call the ops through the dispatcher as inductor's do): the
    same loss and gradients as the model uncompiled, and once compiled, a step's jitops calls pass no Python
    autograd kernel (before the Autograd-key kernels, each of them did)."""
    pytest.importorskip("transformers")
    import test_patch

    model, reference, inputs = test_patch._pair("gpt2", torch.float32)
    jitops.patch(model)
    jitops.patch(reference)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")

    def step(net):
        loss, _ = test_patch._loss(net, inputs)
        loss.backward()
        return loss

    torch.testing.assert_close(step(compiled), step(reference), rtol=2e-5, atol=2e-5)
    for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=2e-4, atol=2e-4 * max(q.grad.abs().max().item(), 1e-3),
                                   msg=name)
    assert _python_autograd_calls(lambda: step(compiled)) == []


@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_ops_with_cpp_autograd_kernels_pass_opcheck(module, name):
    a, w, b = torch.randn(5, 16, requires_grad=True), torch.randn(8, 16, requires_grad=True), torch.randn(8)
    args = {"gemm": (a, w.t(), b, "relu", None), "linear": (a, w, b, "gelu"), "gelu": (a, "tanh"),
            "layer_norm_forward": (a.view(5, 2, 8), [8], b.requires_grad_(), None, 1e-5),
            "conv2d": (torch.randn(2, 8, 6, 6, requires_grad=True), torch.randn(4, 8, 3, 3), None, [1, 1], [1, 1],
                       [1, 1])}[name]
    torch.library.opcheck(getattr(torch.ops.jitops, name).default, args)


def test_the_extension_follows_config_generations():
    seen = []
    jitops.config.on_generation(seen.append)
    try:
        start = jitops.config.generation
        with jitops.config.scope(log_level=jitops.config.log_level):
            inside = jitops.config.generation
        assert seen == [start, inside, jitops.config.generation] and len(set(seen)) == 3
    finally:
        jitops.config._listeners.remove(seen.append)


def test_a_recording_whose_run_launched_around_it_is_not_offered(monkeypatch):
    # The driver counts every launch while a recorded run runs: one the Recording did not keep (a kernel reached
    # some other way) would be missing from the replay.
    from types import SimpleNamespace

    from jitops import launch

    driver = SimpleNamespace(launch=lambda *args: None)
    monkeypatch.setattr(launch._Driver, "_instance", driver)
    main = _function(("ptr", "i64"), 21)
    through_driver = main.launch
    main.launch = lambda grid, block, *args, shared_mem=0: (driver.launch(), through_driver(grid, block, *args))
    kernels = SimpleNamespace(main=main)
    x = torch.zeros(8)

    def kept(k, x):
        k.main.launch(1, 32, x, 8)
        return x

    def around(k, x):
        k.main.launch(1, 32, x, 8)
        driver.launch()  # a launch the recording never saw
        return x

    recording = native.Recording(kernels)
    recording.record(kept, x)
    assert recording.driver_launches == 1 and native.encode(recording, (x,)) is not None
    recording = native.Recording(kernels)
    recording.record(around, x)
    assert recording.driver_launches == 2 and native.encode(recording, (x,)) is None
    original = driver.launch
    recording = native.Recording(kernels)
    recording.watched(around, x)  # the watched path counts too
    assert recording.driver_launches == 2 and native.encode(recording, (x,)) is None
    assert driver.launch is original  # the counting launcher is gone afterwards


def test_a_run_recorded_once_counts_its_launches():
    from types import SimpleNamespace

    kernels = SimpleNamespace(main=_function(("ptr", "i64"), 22))
    offers = native.Offers()
    x = torch.zeros(8)
    _, recording = native.run_recorded_once(offers, "key", kernels, lambda k, x: k.main.launch(1, 32, x, 8), x)
    # No driver in this process (a CPU machine): nothing is counted and the recording stands on its own.
    assert recording is not None and recording.complete()


def test_a_failed_launch_retried_counts_once(monkeypatch):
    # A thread without a CUDA context: the first try fails, the launcher binds the context and tries again.
    from types import SimpleNamespace

    from jitops import launch

    tries = []

    def driver_launch(*args):
        tries.append(args)
        if len(tries) == 1:
            raise launch.DriverError.__new__(launch.DriverError)

    driver = SimpleNamespace(launch=driver_launch)
    monkeypatch.setattr(launch._Driver, "_instance", driver)
    main = _function(("ptr", "i64"), 23)
    through = main.launch

    def retrying(grid, block, *args, shared_mem=0):
        try:
            driver.launch()
        except launch.DriverError:
            driver.launch()
        through(grid, block, *args)
    main.launch = retrying
    recording = native.Recording(SimpleNamespace(main=main))
    recording.record(lambda k, x: k.main.launch(1, 32, x, 8), torch.zeros(8))
    assert len(tries) == 2 and recording.driver_launches == 1 and recording.complete()


def test_the_cupy_tier_up_waits_for_a_recorded_runs_launch_count(monkeypatch):
    """The launcher swap (launch.py's tier-up to CuPy's binding, from its import thread) must not land inside a
    recorded run: the count would miss the run's later launches, the recording would be dropped, and its problem
    would stay on the Python path for good (its key already offered).  A conv's second call ran in Python so, once,
    under pytest -n 8 on the H200."""
    import threading

    from jitops import launch

    driver = launch._Driver.__new__(launch._Driver)  # no libcuda: a launcher of our own
    launched: list = []
    driver.launch = lambda *args: launched.append(("ctypes", args))
    monkeypatch.setattr(launch._Driver, "_instance", driver)
    count = native._LaunchCount()
    with count:
        driver.launch(1)
        swapper = threading.Thread(target=driver.swap_launcher,
                                   args=(lambda *args: launched.append(("cupy", args)),))
        swapper.start()
        swapper.join(timeout=0.2)
        assert swapper.is_alive()  # the swap waits for the count to end
        driver.launch(2)
    swapper.join(timeout=5)
    assert not swapper.is_alive()
    assert count.count == 2 and launched == [("ctypes", (1,)), ("ctypes", (2,))]
    driver.launch(3)
    assert launched[-1] == ("cupy", (3,))
