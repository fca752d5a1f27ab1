"""NVRTC's C API through ctypes, from the library file whose version is the cache key's NVRTC identity.

Why not CuPy's binding (`cupy_backends.cuda.libs.nvrtc`, used before): a process's first compile through it
imported 177 modules, 159 of them CuPy's (its library loader imports `cupy`), while holding
the GIL: 0.197 s for a gelu kernel on the dev box, against 0.124 s and no import through ctypes.  In background
compile mode those imports ran in the worker threads during a notebook's first step (211 new modules on the lent
H100) and held up the calling thread.  A ctypes call releases the GIL for the whole foreign call, dlopen
included, and loads exactly the library that toolkit.nvrtc_identity() describes (CuPy searched on its own).
"""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path

NVRTC_SUCCESS = 0
NVRTC_ERROR_COMPILATION = 6

_p, _int_p, _size_p = ctypes.c_void_p, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_size_t)
_strings = ctypes.POINTER(ctypes.c_char_p)
_PROTOTYPES = {  # name: argument types (every function returns an nvrtcResult but the first)
    "nvrtcGetErrorString": [ctypes.c_int],
    "nvrtcVersion": [_int_p, _int_p],
    "nvrtcGetNumSupportedArchs": [_int_p],
    "nvrtcGetSupportedArchs": [_int_p],
    "nvrtcCreateProgram": [ctypes.POINTER(_p), ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int, _strings, _strings],
    "nvrtcDestroyProgram": [ctypes.POINTER(_p)],
    "nvrtcCompileProgram": [_p, ctypes.c_int, _strings],
    "nvrtcAddNameExpression": [_p, ctypes.c_char_p],
    "nvrtcGetLoweredName": [_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p)],
    "nvrtcGetProgramLogSize": [_p, _size_p],
    "nvrtcGetProgramLog": [_p, ctypes.c_char_p],
    "nvrtcGetCUBINSize": [_p, _size_p],
    "nvrtcGetCUBIN": [_p, ctypes.c_char_p],
    "nvrtcGetPTXSize": [_p, _size_p],
    "nvrtcGetPTX": [_p, ctypes.c_char_p],
}


class NVRTCError(RuntimeError):
    """An NVRTC call failed for another reason than the program's errors (those come back as a log)."""

    def __init__(self, call: str, status: int, text: str) -> None:
        super().__init__(f"jitops: {call} failed: {text} ({status})")
        self.status = status


class Nvrtc:
    """One loaded libnvrtc."""

    def __init__(self, path: Path) -> None:
        self.path = path
        lib = ctypes.CDLL(str(path))
        for name, argtypes in _PROTOTYPES.items():
            function = getattr(lib, name)
            function.argtypes = argtypes
            function.restype = ctypes.c_char_p if name == "nvrtcGetErrorString" else ctypes.c_int
        self._lib = lib

    def call(self, name: str, *args) -> int:
        """lib.name(*args); raises NVRTCError unless it succeeded or reported the program's compile errors."""
        status = getattr(self._lib, name)(*args)
        if status not in (NVRTC_SUCCESS, NVRTC_ERROR_COMPILATION):
            text = self._lib.nvrtcGetErrorString(status)
            raise NVRTCError(name, status, text.decode() if text else "unknown error")
        return status

    def version(self) -> tuple[int, int]:
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.call("nvrtcVersion", ctypes.byref(major), ctypes.byref(minor))
        return major.value, minor.value

    def supported_archs(self) -> tuple[int, ...]:
        count = ctypes.c_int()
        self.call("nvrtcGetNumSupportedArchs", ctypes.byref(count))
        archs = (ctypes.c_int * count.value)()
        self.call("nvrtcGetSupportedArchs", archs)
        return tuple(sorted(archs))

    def program(self, source: str, name: str) -> "Program":
        return Program(self, source, name)


class Program:
    """An nvrtcProgram: `with nvrtc.program(source, name) as p: p.add_name_expression(...); p.compile(...)`."""

    def __init__(self, nvrtc: Nvrtc, source: str, name: str) -> None:
        self._nvrtc = nvrtc
        self._handle = _p()
        nvrtc.call("nvrtcCreateProgram", ctypes.byref(self._handle), source.encode(), name.encode(), 0, None, None)

    def __enter__(self) -> "Program":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._handle:
            self._nvrtc.call("nvrtcDestroyProgram", ctypes.byref(self._handle))
            self._handle = _p()

    def add_name_expression(self, expression: str) -> None:
        self._nvrtc.call("nvrtcAddNameExpression", self._handle, expression.encode())

    def compile(self, options: list[str]) -> bool:
        """Compile with these options: True if it compiled, False if the source has errors (see log())."""
        encoded = [option.encode() for option in options]
        array = (ctypes.c_char_p * len(encoded))(*encoded)
        status = self._nvrtc.call("nvrtcCompileProgram", self._handle, len(encoded), array)
        return status == NVRTC_SUCCESS

    def _blob(self, size_call: str, get_call: str) -> bytes:
        size = ctypes.c_size_t()
        self._nvrtc.call(size_call, self._handle, ctypes.byref(size))
        buffer = ctypes.create_string_buffer(size.value)
        self._nvrtc.call(get_call, self._handle, buffer)
        return buffer.raw

    def log(self) -> str:
        return self._blob("nvrtcGetProgramLogSize", "nvrtcGetProgramLog").rstrip(b"\0").decode(errors="replace")

    def cubin(self) -> bytes:
        return self._blob("nvrtcGetCUBINSize", "nvrtcGetCUBIN")

    def ptx(self) -> str:
        return self._blob("nvrtcGetPTXSize", "nvrtcGetPTX").rstrip(b"\0").decode()

    def lowered_name(self, expression: str) -> str:
        lowered = ctypes.c_char_p()
        self._nvrtc.call("nvrtcGetLoweredName", self._handle, expression.encode(), ctypes.byref(lowered))
        return lowered.value.decode()


@functools.lru_cache(maxsize=None)
def load(path: Path) -> Nvrtc:
    """The library at `path`, loaded once per process (workers racing on the first call at worst load it twice:
    dlopen counts references, the prototypes are the same)."""
    return Nvrtc(path)
