"""Loading cubins and launching them on torch's current stream; calling host libraries through ctypes.

Measured on the H100 (with probes since deleted; git log -- benchmarks/ has them):
per-call cost of a launch, 1-element tensors, each with a torch.empty_like of 1.7 us, torch.add = 6.4 us:
    cupy Function(...) with numpy scalars        10.1 us
    cupy Function(...) with Python ints           8.0 us
    ctypes cuLaunchKernel, packed parameters      9.3 us
    cupy_backends driver.launchKernel, packed     6.8 us   <- the steady-state launcher here
But CuPy's driver binding imports all of CuPy on its first call (its library loader logs through
cupy._environment): 120 ms in a fresh process on that box, where loading a cubin and launching it take 2 ms.
So the one-time calls (module load, function lookup, attributes) go to libcuda directly through ctypes
(libcuda.so.1 is already loaded by torch), launches start on ctypes, and after 100 launches a background
thread imports CuPy's binding; once it is there, every launcher switches to it.  A fresh process's first
kernels therefore cost milliseconds (an import running beside them would slow them through the GIL: 5.9 ms
instead of 2.4 ms a kernel, measured), and hot code gets CuPy's cheaper launch.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import struct
import threading
from typing import Any, Callable, Iterator, Sequence

import torch

from .specs import PARAM_KINDS

_CUDA_ERROR_INVALID_CONTEXT = 201
# Launches through ctypes before CuPy's binding is imported in the background (see the module docstring).
_TIER_UP_LAUNCHES = 100
_MAX_STATIC_SMEM = 48 * 1024
_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_CU_EVENT_DISABLE_TIMING = 2
_FUNC_ATTRIBUTES = {"MAX_THREADS_PER_BLOCK": 0, "SHARED_SIZE_BYTES": 1, "CONST_SIZE_BYTES": 2,
                    "LOCAL_SIZE_BYTES": 3, "NUM_REGS": 4, "PTX_VERSION": 5, "BINARY_VERSION": 6,
                    "MAX_DYNAMIC_SHARED_SIZE_BYTES": 8}


class DriverError(RuntimeError):
    """A CUDA driver call failed; `status` is the CUresult."""

    def __init__(self, call: str, status: int) -> None:
        self.status = status
        name = ctypes.c_char_p()
        try:
            _Driver.get().lib.cuGetErrorName(status, ctypes.byref(name))
        except Exception:  # noqa: BLE001 - the message is best effort
            pass
        label = name.value.decode() if name.value else f"error {status}"
        super().__init__(f"{call} failed: {label} ({status})")


class _Driver:
    """libcuda through ctypes, plus the launcher every CudaFunction uses (swapped to CuPy's when imported)."""

    _instance: "_Driver | None" = None
    _guard = threading.Lock()
    # Held while something wraps `launch` to watch it (jitops.native's launch count for a recorded run); the tier-up
    # below takes it to swap the launcher, so it never swaps one out from under a watcher.  Swapped mid-run, the
    # watcher missed launches and dropped the run's recording, and the problem stayed on the Python path.
    launcher_lock = threading.RLock()

    def __init__(self) -> None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise RuntimeError(f"jitops: cannot load the CUDA driver (libcuda.so.1): {exc}") from None
        void_p, uint = ctypes.c_void_p, ctypes.c_uint
        lib.cuModuleLoadData.argtypes = [ctypes.POINTER(void_p), ctypes.c_char_p]
        lib.cuModuleGetFunction.argtypes = [ctypes.POINTER(void_p), void_p, ctypes.c_char_p]
        lib.cuFuncSetAttribute.argtypes = [void_p, ctypes.c_int, ctypes.c_int]
        lib.cuFuncGetAttribute.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int, void_p]
        lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        lib.cuCtxGetCurrent.argtypes = [ctypes.POINTER(void_p)]
        lib.cuCtxSetCurrent.argtypes = [void_p]
        lib.cuDeviceGet.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
        lib.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(void_p), ctypes.c_int]
        lib.cuDevicePrimaryCtxRelease.argtypes = [ctypes.c_int]
        lib.cuLaunchKernel.argtypes = [void_p, uint, uint, uint, uint, uint, uint, uint, void_p, void_p, void_p]
        lib.cuEventCreate.argtypes = [ctypes.POINTER(void_p), uint]
        lib.cuEventRecord.argtypes = [void_p, void_p]
        lib.cuStreamWaitEvent.argtypes = [void_p, void_p, uint]
        for fn in (lib.cuModuleLoadData, lib.cuModuleGetFunction, lib.cuFuncSetAttribute, lib.cuFuncGetAttribute,
                   lib.cuLaunchKernel, lib.cuGetErrorName, lib.cuCtxGetCurrent, lib.cuCtxSetCurrent, lib.cuDeviceGet,
                   lib.cuDevicePrimaryCtxRetain, lib.cuDevicePrimaryCtxRelease, lib.cuEventCreate, lib.cuEventRecord,
                   lib.cuStreamWaitEvent):
            fn.restype = ctypes.c_int
        self.lib = lib
        ctypes_launch = lib.cuLaunchKernel
        launches = [0]

        def launch_with_ctypes(*args: Any) -> None:
            status = ctypes_launch(*args)
            if status:
                raise DriverError("cuLaunchKernel", status)
            launches[0] += 1
            if launches[0] == _TIER_UP_LAUNCHES:
                self._start_cupy_import()

        self.launch = launch_with_ctypes

    def _start_cupy_import(self) -> None:
        """Tier up: a process that launches often gets CuPy's cheaper launch.  The import runs in a thread,
        after the process has shown it is hot, so no warm start pays for it."""
        importer = threading.Thread(target=self._adopt_cupy_launch, name="jitops-cupy-import", daemon=True)
        importer.start()
        # A fork while that thread holds an import lock would leave the child waiting on a lock nobody holds
        # (DataLoader workers fork): forks wait for the import to finish (~120 ms, once).
        os.register_at_fork(before=lambda: importer.join(timeout=10))

    def _adopt_cupy_launch(self) -> None:
        try:
            from cupy_backends.cuda.api import driver

            driver.ctxGetCurrent()  # its first call loads libcuda (and imports CuPy): do it here, not on a launch
        except Exception:  # noqa: BLE001 - without CuPy, ctypes keeps launching
            return
        self.swap_launcher(driver.launchKernel)

    def swap_launcher(self, launch: Any) -> None:
        """Launch through `launch` from now on, once no one watches the launcher (launcher_lock)."""
        with self.launcher_lock:
            self.launch = launch  # one attribute store: launchers read it on every call

    @classmethod
    def get(cls) -> "_Driver":
        if cls._instance is None:
            with cls._guard:
                if cls._instance is None:
                    cls._instance = _Driver()
        return cls._instance

    def check(self, call: str, status: int) -> None:
        if status:
            raise DriverError(call, status)


def _bind_context(device_index: int) -> None:
    """Make the device's primary context current on this thread.

    torch creates the primary context but a thread that has made no runtime call yet (autograd's device
    threads, user threads) has no current context, and driver calls then fail with CUDA_ERROR_INVALID_CONTEXT.
    torch.cuda.set_device skips its cudaSetDevice when the device already reads as current (device 0 in a
    fresh thread: seen in autograd's backward thread on the H100, where a CUTLASS host library's
    cuTensorMapEncodeTiled failed with 201), so the primary context is bound through the driver if needed."""
    torch.cuda.set_device(device_index)
    lib = _Driver.get().lib
    current = ctypes.c_void_p()
    if lib.cuCtxGetCurrent(ctypes.byref(current)) == 0 and current.value:
        return
    device, context = ctypes.c_int(), ctypes.c_void_p()
    _Driver.get().check("cuDeviceGet", lib.cuDeviceGet(ctypes.byref(device), device_index))
    _Driver.get().check("cuDevicePrimaryCtxRetain", lib.cuDevicePrimaryCtxRetain(ctypes.byref(context), device))
    _Driver.get().check("cuCtxSetCurrent", lib.cuCtxSetCurrent(context))
    lib.cuDevicePrimaryCtxRelease(device)  # torch holds its own reference: the context stays


_threads = threading.local()


def ensure_context(device_index: int) -> None:
    """Before host code (a CudaLibrary) calls the CUDA runtime or driver: make sure this thread has a current
    context for the device.  Checked once per thread and device (0.05 us after that)."""
    if getattr(_threads, "device", None) == device_index:
        return
    lib = _Driver.get().lib
    current = ctypes.c_void_p()
    if lib.cuCtxGetCurrent(ctypes.byref(current)) != 0 or not current.value:
        _bind_context(device_index)
    _threads.device = device_index


_SM_COUNTS: dict[int, int] = {}


def sm_count(device_index: int) -> int:
    """Multiprocessors of a device (132 on the H100), read once."""
    count = _SM_COUNTS.get(device_index)
    if count is None:
        count = _SM_COUNTS[device_index] = torch.cuda.get_device_properties(device_index).multi_processor_count
    return count


# Pinned buffers that captured CUDA graphs copy from on every replay (host_to_device).
_CAPTURED_HOST_COPIES: list[torch.Tensor] = []


def host_to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`host` (a CPU tensor) on `device`, copied from pinned memory: no wait for the stream.  Under CUDA-graph
    capture the pinned copy is kept for the process: the graph's replays copy from it again, and torch's
    pinned-memory cache would otherwise hand it to a later call, whose data a replay would then read."""
    if device.type != "cuda":
        return host.to(device)
    pinned = host.pin_memory()
    copied = pinned.to(device, non_blocking=True)
    if torch.cuda.is_current_stream_capturing():
        _CAPTURED_HOST_COPIES.append(pinned)
    return copied


_GRID_CAPS: dict[tuple[int, int], int] = {}
# Grids of at most this many blocks are under every cap the ops use (8 or 16 blocks an SM) on a GPU with at least
# 16 SMs, so small calls, where every query shows, launch them without asking the device for its SM count.  (On
# a smaller GPU such a grid only exceeds a cap that is there for speed: grid-stride loops stay correct.)
UNCAPPED_GRID = 128


def elementwise_grid(vectors: int, block: int, device_index: int, waves: int = 8) -> int:
    """Blocks for a grid-stride loop over `vectors` (>= 1) items: enough to fill the device `waves` times over,
    never more than there is work for.  (Runs every call: one dict lookup, no min/max calls.)"""
    cap = _GRID_CAPS.get((device_index, waves))
    if cap is None:
        cap = _GRID_CAPS[(device_index, waves)] = sm_count(device_index) * waves
    blocks = (vectors + block - 1) // block
    return blocks if blocks < cap else cap


def current_stream(device_index: int) -> int:
    """The raw cudaStream_t of torch's current stream on a device (0.09 us)."""
    return torch._C._cuda_getCurrentRawStream(device_index)


class SideStreams:
    """A few streams of one device for work that may overlap, forked from a caller's stream and joined back into
    it through the driver (cuEventRecord, cuStreamWaitEvent): torch's Python stream API (torch.cuda.stream(),
    Stream.wait_stream) cost about 25 us a fork or join on the H100's host, through torch.cuda's device-index
    lookups, 8 of them a strided dgrad.  Fork and join work under CUDA graph capture (the side streams join the
    capture through the event)."""

    COUNT = 4  # at most this many in flight; more pieces of work share them
    _per_device: dict[int, "SideStreams"] = {}
    _guard = threading.Lock()

    def __init__(self, device_index: int) -> None:
        ensure_context(device_index)
        self.device_index = device_index
        self._torch_streams = [torch.cuda.Stream(device_index) for _ in range(self.COUNT)]  # kept alive
        self.streams = [s.cuda_stream for s in self._torch_streams]
        driver = _Driver.get()
        self._lib, self._check = driver.lib, driver.check
        self._lock = threading.Lock()
        self._events = []
        for _ in range(self.COUNT + 1):  # one to fork, one per stream to join
            event = ctypes.c_void_p()
            self._check("cuEventCreate", self._lib.cuEventCreate(ctypes.byref(event), _CU_EVENT_DISABLE_TIMING))
            self._events.append(event.value)

    @classmethod
    def of(cls, device_index: int) -> "SideStreams":
        streams = cls._per_device.get(device_index)
        if streams is None:
            with cls._guard:
                streams = cls._per_device.get(device_index)
                if streams is None:
                    streams = cls._per_device[device_index] = SideStreams(device_index)
        return streams

    @contextlib.contextmanager
    def forked(self, stream: int, count: int) -> Iterator[list[int]]:
        """`count` raw streams (repeating after COUNT) that run after what `stream` has queued so far; at exit
        `stream` waits for everything queued on them.  One fork at a time per device, since the events are shared
        (a thread's fork recorded between another's fork and its waits would move that one's starting point)."""
        with self._lock:
            ensure_context(self.device_index)
            lib, check, fork = self._lib, self._check, self._events[0]
            used = self.streams[:min(count, self.COUNT)]
            check("cuEventRecord", lib.cuEventRecord(fork, stream))
            for side in used:
                check("cuStreamWaitEvent", lib.cuStreamWaitEvent(side, fork, 0))
            try:
                yield [used[i % len(used)] for i in range(count)]
            finally:
                for side, event in zip(used, self._events[1:]):
                    check("cuEventRecord", lib.cuEventRecord(event, side))
                    check("cuStreamWaitEvent", lib.cuStreamWaitEvent(stream, event, 0))


class _LaunchConfig(ctypes.Structure):
    """cuda.h's CUlaunchConfig: a launch's shape, as cuOccupancyMaxActiveClusters asks for it."""

    _fields_ = [("grid_x", ctypes.c_uint), ("grid_y", ctypes.c_uint), ("grid_z", ctypes.c_uint),
                ("block_x", ctypes.c_uint), ("block_y", ctypes.c_uint), ("block_z", ctypes.c_uint),
                ("shared_mem", ctypes.c_uint), ("stream", ctypes.c_void_p), ("attributes", ctypes.c_void_p),
                ("attribute_count", ctypes.c_uint)]


class CudaFunction:
    """A __global__ function loaded from a cubin into one device's primary context."""

    def __init__(self, cubin: bytes, symbol: str, signature: Sequence[str], device_index: int, label: str) -> None:
        self._driver = driver = _Driver.get()
        self.label = label
        self.device_index = device_index
        self.signature = tuple(signature)
        self._cubin = cubin  # the driver reads the image during the load; keep the bytes alive with the module
        module, function = ctypes.c_void_p(), ctypes.c_void_p()
        with torch.cuda.device(device_index):
            status = driver.lib.cuModuleLoadData(ctypes.byref(module), cubin)
            if status == _CUDA_ERROR_INVALID_CONTEXT:
                _bind_context(device_index)
                status = driver.lib.cuModuleLoadData(ctypes.byref(module), cubin)
            driver.check("cuModuleLoadData", status)
            driver.check("cuModuleGetFunction",
                         driver.lib.cuModuleGetFunction(ctypes.byref(function), module, symbol.encode()))
        self._module = module.value
        self.handle = function.value
        self._struct = struct.Struct("@" + "".join(PARAM_KINDS[k] for k in self.signature))
        self._buffer = ctypes.create_string_buffer(max(self._struct.size, 8))
        base = ctypes.addressof(self._buffer)
        offsets = self._offsets = _field_offsets(self.signature)
        self._pointers = (ctypes.c_void_p * max(len(offsets), 1))(*[base + o for o in offsets])
        self._pointers_address = ctypes.addressof(self._pointers)
        self._lock = threading.Lock()
        self._dynamic_smem_limit = _MAX_STATIC_SMEM
        self._is_ptr = tuple(kind == "ptr" for kind in self.signature)
        self._launches = 0
        # The first launches go through a generic launcher: generating the fast one compiles Python source,
        # 0.18-0.25 ms a kernel on the dev box (about 1 ms under cProfile on the H100 machine's host), which a warm
        # first call (2.7-3.6 ms there, bench_jit_latency.py) should not pay.
        self.launch = self._launch_generic

    def _launch_generic(self, grid: int | tuple[int, ...], block: int | tuple[int, ...], *args: Any,
                        shared_mem: int = 0) -> None:
        """A kernel's first _TIER_UP_LAUNCHES launches: a loop over the arguments (a list built per launch; the
        generated launcher, which then replaces it, packs in one line).  Same stream, packing and errors."""
        self._launches += 1
        if self._launches == _TIER_UP_LAUNCHES:  # once: a caller may hold on to this bound method
            self.launch = self._make_launcher()
        if len(args) != len(self.signature):
            raise TypeError(f"jitops: kernel {self.label} takes {len(self.signature)} arguments "
                            f"({' '.join(self.signature)}), got {len(args)}")
        if shared_mem > self._dynamic_smem_limit:
            self._raise_smem_limit(shared_mem)
        gx, gy, gz = (grid, 1, 1) if type(grid) is int else (tuple(grid) + (1, 1))[:3]
        bx, by, bz = (block, 1, 1) if type(block) is int else (tuple(block) + (1, 1))[:3]
        values = [(a.data_ptr() if isinstance(a, torch.Tensor) else (a or 0)) if is_ptr else a
                  for is_ptr, a in zip(self._is_ptr, args)]
        stream = torch._C._cuda_getCurrentRawStream(self.device_index)
        with self._lock:
            self._struct.pack_into(self._buffer, 0, *values)
            try:
                self._driver.launch(self.handle, gx, gy, gz, bx, by, bz, shared_mem, stream,
                                    self._pointers_address, 0)
            except Exception as exc:  # noqa: BLE001 - _launch_failed re-raises what it cannot mend
                self._launch_failed(exc, (gx, gy, gz), (bx, by, bz), shared_mem, stream)

    def _make_launcher(self) -> Any:
        """A launch function generated for this signature: one line packs every argument (a tensor passes its
        data pointer), no per-argument loop.  Launches on torch's current stream of this device."""
        names = [f"a{i}" for i in range(len(self.signature))]
        values = [f"({n}.data_ptr() if type({n}) is Tensor or isinstance({n}, Tensor) else ({n} or 0))"
                  if kind == "ptr" else n for n, kind in zip(names, self.signature)]
        source = (
            f"def launch(grid, block, {''.join(n + ', ' for n in names)}shared_mem=0):\n"
            f"    if shared_mem > fn._dynamic_smem_limit:\n"
            f"        fn._raise_smem_limit(shared_mem)\n"
            f"    gx, gy, gz = (grid, 1, 1) if type(grid) is int else (tuple(grid) + (1, 1))[:3]\n"
            f"    bx, by, bz = (block, 1, 1) if type(block) is int else (tuple(block) + (1, 1))[:3]\n"
            f"    stream = raw_stream(device)\n"
            f"    with lock:\n"
            f"        pack(buffer, 0, {', '.join(values)})\n"
            f"        try:\n"
            f"            driver.launch(handle, gx, gy, gz, bx, by, bz, shared_mem, stream, pointers, 0)\n"
            f"        except Exception as exc:\n"
            f"            fn._launch_failed(exc, (gx, gy, gz), (bx, by, bz), shared_mem, stream)\n")
        scope = {"Tensor": torch.Tensor, "fn": self, "raw_stream": torch._C._cuda_getCurrentRawStream,
                 "device": self.device_index, "lock": self._lock, "pack": self._struct.pack_into,
                 "buffer": self._buffer, "driver": self._driver, "handle": self.handle,
                 "pointers": self._pointers_address}
        exec(compile(source, f"<jitops launcher {self.label}>", "exec"), scope)  # noqa: S102 - generated
        return scope["launch"]

    def __call__(self, grid: int | tuple[int, ...], block: int | tuple[int, ...], *args: Any,
                 shared_mem: int = 0) -> None:
        """Launch on torch's current stream of this function's device.  Tensors pass their data pointer."""
        if len(args) != len(self.signature):
            raise TypeError(f"jitops: kernel {self.label} takes {len(self.signature)} arguments "
                            f"({' '.join(self.signature)}), got {len(args)}")
        self.launch(grid, block, *args, shared_mem=shared_mem)

    def _launch_failed(self, exc: Exception, grid: tuple[int, ...], block: tuple[int, ...], shared_mem: int,
                       stream: int) -> None:
        """Called with the parameter lock held.  Retries once after binding the context (fresh threads)."""
        if getattr(exc, "status", None) != _CUDA_ERROR_INVALID_CONTEXT:
            raise RuntimeError(f"jitops: launching {self.label} with grid {grid}, block {block}, {shared_mem} B "
                               f"shared memory failed: {exc}") from None
        _bind_context(self.device_index)
        self._driver.launch(self.handle, *grid, *block, shared_mem, stream, self._pointers_address, 0)

    def _raise_smem_limit(self, shared_mem: int) -> None:
        ensure_context(self.device_index)
        with torch.cuda.device(self.device_index):
            self._driver.check("cuFuncSetAttribute", self._driver.lib.cuFuncSetAttribute(
                self.handle, _CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared_mem))
        self._dynamic_smem_limit = shared_mem

    def packed(self, *values: Any) -> tuple[bytes, list[int]]:
        """The arguments as a launch packs them (pointers as addresses) and each one's offset: a launch that
        jitops' C++ host path replays (native.Recording)."""
        return self._struct.pack(*values), self._offsets

    def _ready_for_occupancy(self, shared_mem: int) -> None:
        """The driver's occupancy calculators need a current context and the kernel's dynamic shared memory
        allowed."""
        ensure_context(self.device_index)  # autograd's device threads start with none (CUDA_ERROR_INVALID_CONTEXT)
        if shared_mem > self._dynamic_smem_limit:
            self._raise_smem_limit(shared_mem)

    def max_active_blocks(self, block: int, shared_mem: int = 0) -> int:
        """Blocks of `block` threads and `shared_mem` bytes of dynamic shared memory that one multiprocessor holds
        at once (the driver's occupancy calculator): a persistent grid is this times the SM count."""
        self._ready_for_occupancy(shared_mem)
        lib = self._driver.lib
        occupancy = lib.cuOccupancyMaxActiveBlocksPerMultiprocessor
        occupancy.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
        occupancy.restype = ctypes.c_int
        count = ctypes.c_int()
        with torch.cuda.device(self.device_index):
            self._driver.check("cuOccupancyMaxActiveBlocksPerMultiprocessor",
                               occupancy(ctypes.byref(count), self.handle, block, shared_mem))
        return count.value

    def max_active_clusters(self, cluster: int, block: int, shared_mem: int) -> int:
        """Clusters of `cluster` CTAs (the kernel's compiled-in __cluster_dims__) of `block` threads and `shared_mem`
        bytes that the device runs at once (cuOccupancyMaxActiveClusters): a persistent cluster grid's size.  0
        where the driver cannot say."""
        self._ready_for_occupancy(shared_mem)
        occupancy = self._driver.lib.cuOccupancyMaxActiveClusters
        occupancy.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p, ctypes.POINTER(_LaunchConfig)]
        occupancy.restype = ctypes.c_int
        count = ctypes.c_int()
        config = _LaunchConfig(cluster, 1, 1, block, 1, 1, shared_mem, None, None, 0)
        with torch.cuda.device(self.device_index):
            status = occupancy(ctypes.byref(count), self.handle, ctypes.byref(config))
        return count.value if status == 0 else 0

    def attribute(self, name: str) -> int:
        """A function attribute, e.g. attribute('NUM_REGS') or attribute('LOCAL_SIZE_BYTES')."""
        ensure_context(self.device_index)
        value = ctypes.c_int()
        self._driver.check("cuFuncGetAttribute", self._driver.lib.cuFuncGetAttribute(
            ctypes.byref(value), _FUNC_ATTRIBUTES[name], self.handle))
        return value.value

    def __repr__(self) -> str:
        return f"CudaFunction({self.label}, cuda:{self.device_index})"


def _field_offsets(kinds: Sequence[str]) -> list[int]:
    offsets, position = [], 0
    for kind in kinds:
        size = struct.calcsize(PARAM_KINDS[kind])
        position = (position + size - 1) // size * size
        offsets.append(position)
        position += size
    return offsets


_CTYPES = {"ptr": ctypes.c_void_p, "i32": ctypes.c_int32, "u32": ctypes.c_uint32, "i64": ctypes.c_int64,
           "u64": ctypes.c_uint64, "f32": ctypes.c_float, "f64": ctypes.c_double, "void": None}


def host_function(fn: Any, name: str, arg_kinds: Sequence[str], ret_kind: str) -> Callable[..., Any]:
    """An extern "C" function of a host library as a Python function of its arguments; tensors given for `ptr`
    arguments pass their data pointer.  The function is generated for its signature, one expression per
    argument: a generic loop over the arguments cost 0.8 us a call on the dev box, as much as the ctypes call."""
    fn.argtypes = [_CTYPES[k] for k in arg_kinds]
    fn.restype = _CTYPES[ret_kind]
    args = [f"a{i}" for i in range(len(arg_kinds))]
    values = [f"({a}.data_ptr() if isinstance({a}, Tensor) else {a})" if kind == "ptr" else a
              for a, kind in zip(args, arg_kinds)]
    namespace: dict[str, Any] = {"fn": fn, "Tensor": torch.Tensor}
    exec(f"def call({', '.join(args)}):\n    return fn({', '.join(values)})\n", namespace)  # noqa: S102
    call = namespace["call"]
    call.address = ctypes.cast(fn, ctypes.c_void_p).value  # what jitops' C++ host path calls (native.Recording)
    call.arg_kinds = tuple(arg_kinds)
    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"{name}({', '.join(arg_kinds)}) -> {ret_kind}"
    return call


class HostLibrary:
    """A shared library with a C ABI (the nvcc and cxx backends build them); its functions are attributes."""

    def __init__(self, path: str, signatures: Sequence[tuple[str, Sequence[str], str]]) -> None:
        self._lib = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)  # local: two builds of one template never clash
        self.path = path
        for name, arg_kinds, ret_kind in signatures:
            setattr(self, name, host_function(getattr(self._lib, name), name, arg_kinds, ret_kind))
