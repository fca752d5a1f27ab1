"""Loading cubins and launching them on torch's current stream; calling host libraries through ctypes.

Why the raw driver call: per-call cost on the lent H100 (2026-11-22, benchmarks/probe_launch_paths.py,
1-element tensors, torch.add = 6.4 us in the same run):
    cupy Function(...) with numpy scalars        10.1 us
    cupy Function(...) with Python ints           8.0 us
    ctypes cuLaunchKernel, packed parameters      9.3 us
    cupy_backends driver.launchKernel, packed     6.8 us   <- used here
(each including a torch.empty_like of 1.7 us).  cupy_backends also imports in 13 ms where `import cupy`
takes 126-178 ms, which matters for the warm-start budget of 5 ms a kernel.
"""
from __future__ import annotations

import ctypes
import struct
import threading
from typing import Any, Sequence

import torch

from .specs import PARAM_KINDS

_CUDA_ERROR_INVALID_CONTEXT = 201
_MAX_STATIC_SMEM = 48 * 1024


def _driver():
    from cupy_backends.cuda.api import driver

    return driver


def _bind_context(device_index: int) -> None:
    """Make the device's primary context current on this thread.

    torch creates the primary context but a thread that has made no runtime call yet (autograd's device
    threads, user threads) has no current context, and driver calls then fail with CUDA_ERROR_INVALID_CONTEXT.
    """
    from cupy_backends.cuda.api import runtime

    if torch.cuda.current_device() == device_index:
        runtime.setDevice(device_index)
    else:
        with torch.cuda.device(device_index):
            runtime.setDevice(device_index)


_SM_COUNTS: dict[int, int] = {}


def sm_count(device_index: int) -> int:
    """Multiprocessors of a device (132 on the lent H100), read once."""
    count = _SM_COUNTS.get(device_index)
    if count is None:
        count = _SM_COUNTS[device_index] = torch.cuda.get_device_properties(device_index).multi_processor_count
    return count


def elementwise_grid(vectors: int, block: int, device_index: int, waves: int = 8) -> int:
    """Blocks for a grid-stride loop over `vectors` items: enough to fill the device `waves` times over,
    never more than there is work for."""
    return max(1, min((vectors + block - 1) // block, sm_count(device_index) * waves))


def current_stream(device_index: int) -> int:
    """The raw cudaStream_t of torch's current stream on a device (0.09 us)."""
    return torch._C._cuda_getCurrentRawStream(device_index)


class CudaFunction:
    """A __global__ function loaded from a cubin into one device's primary context."""

    def __init__(self, cubin: bytes, symbol: str, signature: Sequence[str], device_index: int, label: str) -> None:
        driver = _driver()
        self.label = label
        self.device_index = device_index
        self.signature = tuple(signature)
        with torch.cuda.device(device_index):
            try:
                self._module = driver.moduleLoadData(cubin)
            except driver.CUDADriverError as exc:
                if getattr(exc, "status", None) != _CUDA_ERROR_INVALID_CONTEXT:
                    raise
                _bind_context(device_index)
                self._module = driver.moduleLoadData(cubin)
            self.handle = driver.moduleGetFunction(self._module, symbol)
        self._launch = driver.launchKernel
        self._driver_error = driver.CUDADriverError
        self._struct = struct.Struct("@" + "".join(PARAM_KINDS[k] for k in self.signature))
        self._buffer = ctypes.create_string_buffer(max(self._struct.size, 8))
        base = ctypes.addressof(self._buffer)
        offsets = _field_offsets(self.signature)
        self._pointers = (ctypes.c_void_p * max(len(offsets), 1))(*[base + o for o in offsets])
        self._pointers_address = ctypes.addressof(self._pointers)
        self._lock = threading.Lock()
        self._dynamic_smem_limit = _MAX_STATIC_SMEM
        self.launch = self._make_launcher()

    def _make_launcher(self) -> Any:
        """A launch function generated for this signature: one line packs every argument (a tensor passes its
        data pointer), no per-argument loop.  Launches on torch's current stream of this device."""
        names = [f"a{i}" for i in range(len(self.signature))]
        values = [f"({n}.data_ptr() if isinstance({n}, Tensor) else ({n} or 0))" if kind == "ptr" else n
                  for n, kind in zip(names, self.signature)]
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
            f"            launch_kernel(handle, gx, gy, gz, bx, by, bz, shared_mem, stream, pointers, 0)\n"
            f"        except driver_error as exc:\n"
            f"            fn._launch_failed(exc, (gx, gy, gz), (bx, by, bz), shared_mem, stream)\n")
        scope = {"Tensor": torch.Tensor, "fn": self, "raw_stream": torch._C._cuda_getCurrentRawStream,
                 "device": self.device_index, "lock": self._lock, "pack": self._struct.pack_into,
                 "buffer": self._buffer, "launch_kernel": self._launch, "handle": self.handle,
                 "pointers": self._pointers_address, "driver_error": self._driver_error}
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
        self._launch(self.handle, *grid, *block, shared_mem, stream, self._pointers_address, 0)

    def _raise_smem_limit(self, shared_mem: int) -> None:
        driver = _driver()
        with torch.cuda.device(self.device_index):
            driver.funcSetAttribute(self.handle, driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared_mem)
        self._dynamic_smem_limit = shared_mem

    def attribute(self, name: str) -> int:
        """A function attribute, e.g. attribute('NUM_REGS') or attribute('LOCAL_SIZE_BYTES')."""
        driver = _driver()
        return driver.funcGetAttribute(getattr(driver, f"CU_FUNC_ATTRIBUTE_{name}"), self.handle)

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


class HostFunction:
    """An extern "C" function of a host library.  Tensors pass their data pointer."""

    def __init__(self, fn: Any, name: str, arg_kinds: Sequence[str], ret_kind: str) -> None:
        fn.argtypes = [_CTYPES[k] for k in arg_kinds]
        fn.restype = _CTYPES[ret_kind]
        self._fn, self.name = fn, name
        self._is_ptr = tuple(k == "ptr" for k in arg_kinds)

    def __call__(self, *args: Any) -> Any:
        values = [(a.data_ptr() if isinstance(a, torch.Tensor) else a) if is_ptr else a
                  for is_ptr, a in zip(self._is_ptr, args)]
        return self._fn(*values)


class HostLibrary:
    """A shared library built by the nvcc backend; its functions are attributes."""

    def __init__(self, path: str, signatures: Sequence[tuple[str, Sequence[str], str]]) -> None:
        self._lib = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)  # local: two builds of one template never clash
        self.path = path
        for name, arg_kinds, ret_kind in signatures:
            setattr(self, name, HostFunction(getattr(self._lib, name), name, arg_kinds, ret_kind))
