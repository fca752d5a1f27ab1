"""jitops' C++ host path: kernels/host/host_path.cpp, built once per machine and torch version.

A jitops.linear or jitops.layer_norm call on CUDA (and its backward) costs a Python autograd node and the Python
around each launch; that host time, not the GPU's, kept patched models behind eager (docs/architecture.md, "Where
a step's host time goes").  The extension runs the same kernels with the same arguments from C++: the public
functions ask it first (`host.module.linear(...)`, `host.module.layer_norm(...)`), and it answers None for
anything it does not cover, so the Python path stays the reference and the fallback.  Calls that reach torch's
dispatcher instead (torch.compile's graphs, the profiler) meet its kernels at the BackendSelect key
(kernels/host/dispatch.h), which serve the same offered problems and pass every other call on to the Python
implementation.

How problems get there: the Python path offers what it launched, once per problem and config generation.  A
light-GEMM launch offers its packed problem (`offer_light`); jitops.gelu its kernels (`offer_gelu`);
jitops.layer_norm records its launch sequence for the exact problem (`Recording`, `offer_recording`).  A model's
first training step runs in Python and offers its forward and backward problems; from the second step on, those
calls run in C++.

The build: a CppExtension through the runtime (cached like any kernel, a disk hit imports the .so), started in
the background by the first light launch, never blocking a call (about a minute of C++ compile on a 2-core
machine).  JITOPS_NATIVE_HOST=0 turns it off.  `wait()` blocks until it is loaded (benchmarks, tests).
"""
from __future__ import annotations

import concurrent.futures
import ctypes
import logging
import struct
import threading
from typing import Any, Callable, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .config import config
from .launch import CudaFunction, HostLibrary, _Driver
from .specs import CppExtension, Source, Target

log = logging.getLogger("jitops")

HOST_PATH = CppExtension("host_path", Source.file("host/host_path.cpp"), functions=(),
                           options=("-O2",))
_CPU = Target("cpu")


class _Host:
    """The extension once loaded (`module`, None until then) and its build."""

    def __init__(self) -> None:
        self.module: Any = None
        # The runtime (jitops/__init__ hands it over: this module sits at launch's layer, below the runtime),
        # which builds and caches the extension like any kernel.
        self.runtime: Any = None
        self._future: Any = None
        self._guard = threading.RLock()  # start() may run the done-callback itself

    def start(self) -> None:
        """Load the extension from the cache, or start its build in the background (once a process; offline:
        a cache hit only)."""
        if self._future is not None or self.module is not None or self.runtime is None or not config.native_host:
            return
        with self._guard:
            if self._future is not None or self.module is not None:
                return
            runtime = self.runtime
            if config.offline:
                self._future = concurrent.futures.Future()
                try:
                    self._future.set_result(runtime.get_kernel(HOST_PATH.bind(), _CPU, None, build=False))
                except Exception as error:  # noqa: BLE001 - a miss or a bad entry: the Python path serves
                    self._future.set_exception(error)
            else:
                self._future = runtime.submit(HOST_PATH.bind(), _CPU, None)
            self._future.add_done_callback(self._loaded)

    def _loaded(self, future: Any) -> None:
        """The future's done-callback, and wait()'s (result() can return before the callbacks have run)."""
        if future.exception() is not None or future.result() is None:  # calls stay on the Python path
            return
        with self._guard:
            if self.module is None:
                module = future.result()
                _give_driver(module)
                # torch.compile's graphs and the profiler call the ops through the dispatcher: its kernels
                # (dispatch.h) serve the offered problems there too, under the generation Python says is current.
                config.on_generation(module.set_generation)
                module.register_dispatch()
                self.module = module

    def wait(self) -> Any:
        """Start the build if needed and block until the extension is loaded; the module, or None if it
        cannot be built here (the runtime logged why) or JITOPS_NATIVE_HOST=0."""
        self.start()
        if self._future is not None:
            try:
                self._future.result()
            except Exception as error:  # noqa: BLE001 - the Python path serves every call
                log.debug("jitops' C++ host path is not available: %s", error)
                return None
            self._loaded(self._future)
        return self.module


def _give_driver(module: Any) -> None:
    """libcuda's entry points as addresses: the extension needs no CUDA headers or libraries to build (a
    CPU-only torch builds it too), and calls the same driver as jitops.launch."""
    if not torch.cuda.is_available():
        return
    lib = _Driver.get().lib

    def address(name: str) -> int:
        return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value or 0

    module.set_driver(address("cuLaunchKernel"), address("cuCtxGetCurrent"), address("cuCtxSetCurrent"),
                      address("cuDeviceGet"), address("cuDevicePrimaryCtxRetain"), address("cuMemcpy2DAsync_v2"),
                      address("cuMemsetD2D16Async"), address("cuStreamIsCapturing"))


host = _Host()


def offer_light(cls: Any, packed: Any, device: int) -> None:
    """Hand a packed light-GEMM problem (light_gemm._Packed, just launched by the Python path) to the
    extension, keyed as the extension keys its calls.  A kernel with the fused epilogue and an activation
    serves calls with and without a bias (a null bias pointer); otherwise the bias decides the kernel."""
    module = host.module
    if module is None:
        host.start()
        return
    generation = config.generation
    packed.offered = generation
    if not config.native_host:  # a JITOPS_NATIVE_HOST=0 scope: the table stays stale, every call misses
        return
    field = packed.address_field
    if field is None:  # descriptors patched through the driver: only the Python path knows how
        return
    m, n, k, lda, ldb, ldd, activation, _, b_rows = packed.problem
    info = packed.owner.info
    address_at = (packed.descriptors[0] + field, packed.descriptors[1] + field, packed.descriptors[2] + field)
    for with_bias in ((False, True) if activation else (bool(cls.fused),)):
        module.offer(device, cls.dtype is torch.bfloat16, cls.out_dtype is torch.float32, cls.a_kmajor,
                     cls.b_kmajor, m, n, k, lda, ldb, ldd, b_rows, activation, with_bias, generation,
                     packed.owner.function.handle, packed.grid, info.threads, info.smem, address_at,
                     packed.bias_field, bytes(packed.params), *packed.workspace)


def offer_gelu(kernels: Any, function: Any, cls: Any, device: int, backward: bool, per_block: int, block: int) -> None:
    """Hand jitops.gelu's forward or backward kernel (16-bit classes: the Linear+GELU pairs the extension runs
    while training) to the extension, once per config generation."""
    module = host.module
    if module is None:  # not loaded yet: offered by a later launch (light launches start the build)
        return
    generation = config.generation
    kernels.native_offered = generation
    if cls.dtype not in (torch.bfloat16, torch.float16) or not config.native_host:
        return
    module.offer_gelu(device, cls.dtype is torch.bfloat16, cls.approximate == "tanh", cls.vec, cls.index == "int",
                      backward, generation, function.handle, block, per_block)


class _RecordedFunction:
    """A CudaFunction whose launches run as usual and are kept by the Recording."""

    def __init__(self, function: Any, launches: list) -> None:
        self._function = function
        self._launches = launches

    def __getattr__(self, name: str) -> Any:
        return getattr(self._function, name)

    def launch(self, grid: Any, block: Any, *args: Any, shared_mem: int = 0) -> None:
        self._function.launch(grid, block, *args, shared_mem=shared_mem)
        self._launches.append((self._function, grid, block, args, shared_mem))

    def keep_params_launch(self, packed: Any, tensors: tuple) -> None:
        """Keep a launch that the kernel's host side made itself (a light kernel's packed Params, launched with
        `tensors` (A, B, D, bias) in its descriptors), when a replay can write those addresses as plain fields.
        Otherwise it is not kept, and the launch count leaves the recording unoffered."""
        if packed.address_field is not None:
            info = packed.owner.info
            self._launches.append((_ParamsLaunch(packed), packed.grid, info.threads, tensors, info.smem))


class _ParamsLaunch:
    """A kernel of one Params parameter (the light kernels: TMA descriptors, then a bias pointer) as `encode` packs
    a launch: four pointer arguments, the descriptors' address fields and the bias field, in one kernel parameter,
    the whole struct."""

    signature = ("ptr", "ptr", "ptr", "ptr")
    fields = [0]

    def __init__(self, packed: Any) -> None:
        self.handle = packed.owner.function.handle
        self._params = bytes(packed.params)
        field = packed.address_field
        # Each argument's fields: A's descriptors (a strided dgrad's phases have one each), B's, D's, the bias.
        self._offsets = [tuple(offset + field for offset in packed.a_descriptors),
                         (packed.descriptors[1] + field,), (packed.descriptors[2] + field,), (packed.bias_field,)]

    def packed(self, *values: int) -> tuple[bytes, list[tuple[int, ...]]]:
        params = bytearray(self._params)
        for offsets, value in zip(self._offsets, values):
            for offset in offsets:
                struct.pack_into("<Q", params, offset, value)
        return bytes(params), self._offsets


class _RecordedLibrary:
    """A host library (HostLibrary: nvcc-built CUTLASS host code) whose function calls run as usual and are kept
    by the Recording."""

    def __init__(self, library: Any, launches: list) -> None:
        self._library = library
        self._launches = launches

    def __getattr__(self, name: str) -> Any:
        function = getattr(self._library, name)
        if getattr(function, "address", None) is None:
            return function

        def call(*args: Any) -> Any:
            result = function(*args)
            self._launches.append((function, None, None, args, 0))
            return result
        return call


class _Allocations(TorchDispatchMode):
    """Watches a recorded run's aten ops: which tensors it allocated (`empty` and friends: workspaces, outputs)
    and whether it did anything else that moves data (a copy or a sum the recording would not replay)."""

    def __init__(self) -> None:
        super().__init__()
        self.addresses: set[int] = set()
        self.pure = True

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func in _ALLOCATIONS:
            self.addresses.add(out.data_ptr())
        elif not (func.is_view or func in _METADATA):
            self.pure = False
        return out


_aten = torch.ops.aten
_ALLOCATIONS = {_aten.empty.memory_format, _aten.empty_strided.default, _aten.new_empty.default,
                _aten.empty_like.default}
_METADATA = {_aten.detach.default, _aten.sym_size.int, _aten.sym_stride.int, _aten.sym_numel.default,
             _aten.sym_storage_offset.default, _aten.is_contiguous.default, _aten.is_contiguous.memory_format}


class _LaunchCount:
    """Counts every launch through jitops.launch's driver while a recorded run runs (CudaFunction's and the light
    GEMM's launches; not cuLaunchKernelEx's, not a host library's own): a launch that did not go through the
    Recording's wrappers (a kernel reached some other way) would be missing from the replay, so such a
    recording is not offered.  Recordings take turns (the driver's launcher lock, re-entrant for a recorded run
    inside another, which also keeps the CuPy tier-up from swapping the launcher mid-count), and a launch by another
    thread meanwhile is counted too, which only costs that problem its offer."""

    _turn = _Driver.launcher_lock

    def __init__(self) -> None:
        self.count: int | None = None  # None: no driver in this process (nothing can have launched)
        self._driver: Any = None

    def __enter__(self) -> "_LaunchCount":
        self._turn.acquire()
        try:
            driver = _Driver._instance
            if driver is None and torch.cuda.is_available():
                driver = _Driver.get()
        except RuntimeError:  # no libcuda: nothing can launch through it
            driver = None
        except BaseException:
            self._turn.release()
            raise
        if driver is not None:
            self._driver, self._original, self.count = driver, driver.launch, 0

            def counting(*args: Any) -> Any:
                result = self._original(*args)
                # Counted once it went through: a first launch on a thread without a context fails and is
                # retried (launch.py's _launch_failed), one launch of the Recording's.
                self.count += 1  # type: ignore[operator]
                return result
            self._counting = driver.launch = counting
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            # The tier-up waits for the lock to swap the launcher (launch.py), so ours is still the one there.
            if self._driver is not None and self._driver.launch is self._counting:
                self._driver.launch = self._original
        finally:
            self._turn.release()


class Recording:
    """A loaded kernel set whose launches (and host-library calls) run as usual and are kept: handed to an op's
    run function in place of the kernels, it records one call's launch sequence, which `offer_recording` gives
    the C++ host path to replay on later calls of the same problem.  `record()` runs the op and counts the
    driver's launches meanwhile (each must be one the Recording kept); `watched()` also runs it under a dispatch
    mode that notes what the run allocated and whether it did anything but allocate, view and launch (a copy or a
    reduction through torch, which a replay would leave out).  Either failing, nothing is offered."""

    def __init__(self, kernels: Any) -> None:
        self._kernels = kernels
        self.launches: list = []
        self.allocated: set[int] | None = None  # addresses of the run's allocations, when watched
        self.pure = True                          # False: the watched run moved data outside its launches
        self.driver_launches: int | None = None   # the driver's launches during record()/watched(), if counted

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._kernels, name)
        if isinstance(value, CudaFunction):
            return _RecordedFunction(value, self.launches)
        if isinstance(value, HostLibrary):
            return _RecordedLibrary(value, self.launches)
        return value

    def record(self, run: Callable[..., Any], *args: Any) -> Any:
        """run(self, *args), counting the driver's launches."""
        with _LaunchCount() as counted:
            result = run(self, *args)
        self.driver_launches = counted.count
        return result

    def watched(self, run: Callable[..., Any], *args: Any) -> Any:
        """record(), under the allocation watch; the recording is then offerable only if it stayed pure."""
        watch = _Allocations()
        with watch:
            result = self.record(run, *args)
        self.allocated = watch.addresses if watch.pure else None
        self.pure = watch.pure
        return result

    def complete(self) -> bool:
        """Whether every driver launch of the run is one the recording kept (True when they were not counted)."""
        kept = sum(1 for launch in self.launches if launch[1] is not None)  # host calls launch on their own
        return self.driver_launches is None or self.driver_launches == kept


def _triple(size: Any) -> tuple[int, int, int]:
    return (size, 1, 1) if type(size) is int else tuple((tuple(size) + (1, 1))[:3])  # type: ignore[return-value]


STREAM_SLOT = -2  # kernels/host/recipe.h's kStreamSlot: the current stream, in a host call's arguments
_HOST_KINDS = {"ptr": 0, "i32": 1, "i64": 2}  # recipe.h's HostKind


def _fields_of(offsets: int | tuple[int, ...]) -> tuple[int, ...]:
    """An argument's offsets in a packed launch: one, or several fields that take the same pointer."""
    return offsets if isinstance(offsets, tuple) else (offsets,)


def encode(recording: Recording, slots: Sequence[Any], stream: int | None = None) -> tuple[list, list] | None:
    """The recorded launches as the extension takes them: per kernel launch (function, grid, block, shared
    memory, arguments packed with every pointer zero, each argument's offset, [(pointer offset, slot)]); per
    host-library call (function address, (0, 0, 0), (0, 0, 0), 0, every argument as an int64, [], [(offset,
    slot)]); and the workspaces [(slot, bytes)].  A tensor argument is the call's slot it `is` (or whose address
    it has: a view), else a workspace the run allocated (a slot after the call's; its contents are the kernels'
    own).  Every tensor at a workspace's address is that workspace, whichever view passes it: the stem conv's
    im2col matrix is written through one view and read through another, and two slots for it had the fprop read
    uninitialised memory in every replay.  None if the run was watched and did more than allocate, view and
    launch, or passed an address the recording cannot follow: a raw pointer other than a host call's last
    argument equal to `stream` (the stream it ran on), or, when watched, a tensor it did not allocate; or if the
    driver launched more than the recording kept."""
    if not recording.pure or not recording.complete():
        return None
    slot_of = {id(t): i for i, t in enumerate(slots) if t is not None}
    slot_at = {t.data_ptr(): i for i, t in enumerate(slots) if t is not None and t.numel()}
    workspaces: list[tuple[int, int]] = []
    workspace_at: dict[int, int] = {}  # a workspace's address -> its index in `workspaces`
    launches = []
    for function, grid, block, args, shared_mem in recording.launches:
        kinds = function.signature if grid is not None else function.arg_kinds
        values, pointed = [], []
        for index, (kind, arg) in enumerate(zip(kinds, args)):
            if kind != "ptr":
                values.append(arg)
                continue
            values.append(0)
            if arg is None:
                continue
            if not isinstance(arg, torch.Tensor):
                # A host call's last argument, the stream (0 for the legacy default stream): the caller's.
                if grid is None and stream is not None and arg == stream and index == len(kinds) - 1:
                    pointed.append((index, STREAM_SLOT))
                    continue
                return None
            slot = slot_of.get(id(arg))
            address = arg.data_ptr()
            if slot is None:
                slot = slot_at.get(address)
            if slot is None:
                if recording.allocated is not None and address not in recording.allocated:
                    return None
                size = arg.untyped_storage().nbytes()  # the whole allocation, whatever part this view covers
                found = workspace_at.get(address)
                if found is None:
                    found = workspace_at[address] = len(workspaces)
                    workspaces.append((len(slots) + found, size))
                slot, known = workspaces[found]
                workspaces[found] = (slot, max(known, size))
            pointed.append((index, slot))
        if grid is None:  # a host-library call: its arguments as int64s, in order, and their kinds
            launches.append((function.address, (0, 0, 0), (0, 0, 0), 0, struct.pack(f"<{len(values)}q", *values),
                             [_HOST_KINDS[kind] for kind in kinds], [(8 * index, slot) for index, slot in pointed]))
            continue
        arguments, offsets = function.packed(*values)
        fields = getattr(function, "fields", offsets)  # the kernel's parameters (_ParamsLaunch: one struct)
        launches.append((function.handle, _triple(grid), _triple(block), shared_mem, arguments, fields,
                         [(offset, slot) for index, slot in pointed for offset in _fields_of(offsets[index])]))
    return launches, workspaces


class Offers:
    """The problems an op has offered under the current config generation (a later generation starts empty), at
    most `limit` of them: the extension keeps every recipe it is given (a backward node may hold one), so a
    workload of ever new shapes (serving with free sequence lengths) stops offering there and runs its new
    problems on the Python path instead of growing the tables without bound."""

    LIMIT = 4096

    def __init__(self, limit: int = LIMIT) -> None:
        self._generation = -1
        self._keys: set = set()
        self._limit = limit

    def first(self, key: Any) -> bool:
        """Whether `key` is yet to be offered under this generation (and the limit not reached); noted as offered
        from now on."""
        if self._generation != config.generation:
            self._keys = set()
            self._generation = config.generation
        if key in self._keys or len(self._keys) >= self._limit:
            return False
        self._keys.add(key)
        return True


def run_recorded_once(offers: Offers, key: Any, kernels: Any, run: Callable[..., Any], *args: Any
                      ) -> tuple[Any, Recording | None]:
    """run(kernels, *args), recorded the first time `key` is seen under this config generation: (its result, the
    Recording to offer, or None when it was offered before)."""
    if not offers.first(key):
        return run(kernels, *args), None
    recording = Recording(kernels)
    return recording.record(run, *args), recording


def offer_recording(offer: Callable[..., None], recording: Recording, slots: Sequence[Any], *key: Any,
                    stream: int | None = None) -> None:
    """Hand a recorded launch sequence to the extension through `offer` (its op's entry, e.g.
    `module.offer_layer_norm`), under the op's key fields, for the current config generation."""
    encoded = encode(recording, slots, stream)
    if encoded is not None and config.native_host:
        offer(*key, config.generation, *encoded)


def counters() -> dict[str, int]:
    """Calls the extension served, calls it handed back to Python, and problems it holds (zeros before it is
    loaded)."""
    module = host.module
    hits, misses, problems = module.counters() if module is not None else (0, 0, 0)
    return {"native_calls": hits, "native_misses": misses, "native_problems": problems}


def wait() -> Any:
    return host.wait()


__all__ = ["HOST_PATH", "Offers", "Recording", "counters", "encode", "host", "offer_gelu", "offer_light",
           "offer_recording", "run_recorded_once", "wait"]
