"""What an op asks the runtime to build: kernel sources, kernel specs, and the concrete build requests.

A spec (CudaKernel, CudaLibrary, CppLibrary, CppExtension) is declared once per op; `spec.bind(dtype,
**params)` turns it into a BuildRequest for one shape class.  Pure data: nothing here compiles, loads or touches
a GPU.
"""
from __future__ import annotations

import hashlib
import os
import platform
import re
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Mapping

_INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)

# Kinds of kernel parameters and how they are packed (struct codes; native alignment).
PARAM_KINDS = {"ptr": "Q", "i32": "i", "u32": "I", "i64": "q", "u64": "Q", "f32": "f", "f64": "d"}


@lru_cache(maxsize=1)
def kernels_root() -> Path:
    """Directory of the shipped kernel sources: jitops/kernels in a wheel, kernels/ in a source checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "kernels", here.parent / "kernels"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"jitops: kernel sources not found next to {here}; the installation is incomplete")


@dataclass(frozen=True)
class Source:
    """A kernel source: a file under kernels/ (`Source.file("gelu.cu")`) or text from a notebook cell
    (`Source.inline("scaled_add", text)`).  Inline sources may #include the shipped headers."""

    name: str                 # file name used in compiler messages, e.g. "gelu.cu"
    relpath: str | None = None  # path under kernels/, for shipped sources
    text: str | None = field(default=None, repr=False)

    @staticmethod
    def file(relpath: str) -> "Source":
        return Source(name=Path(relpath).name, relpath=relpath)

    @staticmethod
    def inline(name: str, text: str, suffix: str = ".cu") -> "Source":
        if not text.strip():
            raise ValueError(f"jitops: inline source {name!r} is empty")
        return Source(name=name if Path(name).suffix else name + suffix, text=text)

    @property
    def path(self) -> Path | None:
        return kernels_root() / self.relpath if self.relpath else None

    def read(self) -> str:
        if self.text is not None:
            return self.text
        assert self.path is not None
        return self.path.read_text()

    def closure(self) -> dict[str, str]:
        """sha256 of this source and of every header it includes from kernels/, transitively.

        Keys are paths relative to kernels/ ("<inline>/name" for inline text), so the digest is the same in a
        checkout and in an installed wheel.  Includes that do not resolve under kernels/ (CUDA, CUTLASS, the
        C++ library) are versioned by the toolchain and CUTLASS components of the cache key instead.
        """
        return dict(_closure(self).digests)

    def includes_external(self, prefixes: tuple[str, ...]) -> bool:
        """Whether the include closure names a header under one of `prefixes` (e.g. cutlass/, cute/)."""
        return any(name.startswith(prefixes) for name in _closure(self).includes)


@dataclass(frozen=True)
class _Closure:
    digests: dict[str, str]                      # relative path (or <inline>/name) -> sha256
    includes: frozenset[str]                     # every #include name in the closure, resolved or not
    stamps: tuple[tuple[str, int, int, int], ...]  # (path, mtime_ns, size, inode) of every file read


# Every kernel's first load in a process needs its source closure for the cache key.  Walking it (read, hash,
# regex, path checks) took 0.11-0.5 ms per source on the dev box (0.5 the first in a process), twice per kernel
# (key and CUTLASS check); re-checking a remembered walk, one stat per file, took 0.007 ms there.  A file edited
# while the process runs (a notebook user working on kernels/) changes its stamp, and the walk runs again.
# Timestamps are coarse (a few ms), so two same-size writes in a row could share one: as in git's "racy" index
# rule, a walk that read a file modified less than RACY_SECONDS before is not remembered.
_CLOSURES: dict[tuple[Source, str], _Closure] = {}
RACY_SECONDS = 2


def _stamp(path: str) -> tuple[str, int, int, int]:
    st = os.stat(path)
    return (path, st.st_mtime_ns, st.st_size, st.st_ino)


def _closure(source: Source) -> _Closure:
    root = str(kernels_root())
    known = _CLOSURES.get((source, root))
    if known is not None:
        try:
            if all(_stamp(s[0]) == s for s in known.stamps):
                return known
        except OSError:
            pass
    walk = _Walk(root)
    if source.text is not None:
        walk.digests[f"<inline>/{source.name}"] = _sha256(source.text.encode())
        walk.includes_of(source.text, root)
    else:
        walk.file(os.path.join(root, source.relpath))  # type: ignore[arg-type]
    closure = _Closure(walk.digests, frozenset(walk.includes), tuple(walk.stamps))
    fresh = time.time_ns() - RACY_SECONDS * 10**9
    if all(stamp[1] < fresh for stamp in walk.stamps):
        _CLOSURES[(source, root)] = closure
    return closure


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class _Walk:
    """One walk of an include graph under kernels/ (paths as strings: pathlib's resolve() cost most of it)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.digests: dict[str, str] = {}
        self.includes: set[str] = set()
        self.stamps: list[tuple[str, int, int, int]] = []

    def file(self, path: str) -> None:
        rel = os.path.relpath(path, self.root).replace(os.sep, "/")
        if rel in self.digests:
            return
        stamp = _stamp(path)
        with open(path, "rb") as fh:
            data = fh.read()
        self.stamps.append(stamp)
        self.digests[rel] = _sha256(data)
        self.includes_of(data.decode(errors="replace"), os.path.dirname(path))

    def includes_of(self, text: str, directory: str) -> None:
        # Conditional includes are all followed: hashing a header too many is safe, one too few serves stale code.
        inside = self.root + os.sep
        for match in _INCLUDE.finditer(text):
            quote, name = match.groups()
            self.includes.add(name)
            candidates = ([os.path.join(directory, name)] if quote == '"' else []) + [os.path.join(self.root, name)]
            for candidate in candidates:
                candidate = os.path.normpath(candidate)
                if candidate.startswith(inside) and os.path.isfile(candidate):
                    self.file(candidate)
                    break


@dataclass(frozen=True)
class Target:
    """Where a kernel runs: a CUDA compute capability, or the CPU."""

    device_type: str                      # "cuda" or "cpu"
    capability: tuple[int, int] | None = None

    def arch(self, specific: bool = False) -> str:
        """The exact compile target: sm_90, or sm_90a when the kernel uses arch-specific instructions
        (wgmma, setmaxnreg), which exist only as 'a' targets from compute capability 9.0 on."""
        if self.device_type == "cpu":
            return "cpu"
        major, minor = self.capability  # type: ignore[misc]
        suffix = "a" if specific and major >= 9 else ""
        return f"sm_{major}{minor}{suffix}"

    @staticmethod
    def parse(arch: str) -> "Target":
        """'sm_90a', 'sm_90', 'sm_80', '90', or 'cpu'."""
        text = arch.strip().lower()
        if text == "cpu":
            return Target("cpu")
        match = re.fullmatch(r"(?:sm_?|compute_)?(\d)(\d+)a?", text)
        if not match:
            raise ValueError(f"jitops: unknown arch {arch!r}; use sm_XY (e.g. sm_80, sm_90a) or cpu")
        major, minor = int(match.group(1)), int(match.group(2))
        if major < 7:
            raise ValueError(f"jitops: arch {arch!r} is older than sm_70, which jitops does not support")
        return Target("cuda", (major, minor))

    def __str__(self) -> str:
        return self.arch()


@dataclass(frozen=True)
class BuildRequest:
    """One concrete thing to compile: a spec bound to a shape class."""

    backend: str                          # "nvrtc", "nvcc", "cxx" or "load_inline"
    kernel: str                           # cache directory name, e.g. "gelu_forward"
    source: Source
    dtype: str                            # cache directory layer, e.g. "bf16" ("any" when dtype-free)
    params: tuple[tuple[str, str], ...]   # the shape class as it reaches the compiler
    entry: str | None = None              # NVRTC name expression, e.g. "jitops::gelu_forward<__nv_bfloat16, 8>"
    signature: tuple[str, ...] = ()       # NVRTC parameter kinds, see PARAM_KINDS
    functions: tuple[str, ...] = ()       # exported functions (load_inline, nvcc, cxx)
    c_signatures: tuple[tuple[str, tuple[str, ...], str], ...] = ()  # nvcc, cxx: (name, arg kinds, return kind)
    defines: tuple[tuple[str, str], ...] = ()
    options: tuple[str, ...] = ()
    arch_specific: bool = False
    cuda: bool = True                     # load_inline: whether the source is CUDA (needs nvcc + torch.cuda)

    def arch(self, target: Target) -> str:
        return target.arch(self.arch_specific)

    def label(self) -> str:
        return self.entry or f"{self.kernel}[{', '.join(f'{k}={v}' for k, v in self.params)}]"


def _format_params(template: str, params: Mapping[str, object]) -> str:
    try:
        return template.format(**params)
    except KeyError as exc:
        raise ValueError(f"jitops: template {template!r} needs parameter {exc.args[0]!r}; got {sorted(params)}") \
            from None


def _parse_signature(signature: str | tuple[str, ...]) -> tuple[str, ...]:
    kinds = tuple(signature.replace(",", " ").split()) if isinstance(signature, str) else tuple(signature)
    for kind in kinds:
        if kind not in PARAM_KINDS:
            raise ValueError(f"jitops: unknown parameter kind {kind!r}; use one of {', '.join(PARAM_KINDS)}")
    return kinds


@dataclass(frozen=True)
class CudaKernel:
    """A __global__ function compiled with NVRTC to a cubin and launched through CuPy.

    `entry` is a C++ name expression with {placeholders} filled from the shape class, so kernels/ holds real
    templates and Python only names the instantiation:
        CudaKernel("gelu_forward", Source.file("gelu.cu"), "jitops::gelu_forward<{T}, {VEC}>", "ptr ptr i64")
    """

    name: str
    source: Source
    entry: str
    signature: str | tuple[str, ...]
    options: tuple[str, ...] = ()
    arch_specific: bool = False
    defines: bool = False  # the params also reach the source as -D macros (a configuration header's choices)

    def bind(self, dtype: str = "any", **params: object) -> BuildRequest:
        items = tuple((k, str(v)) for k, v in sorted(params.items()))
        return BuildRequest(
            backend="nvrtc", kernel=self.name, source=self.source, dtype=dtype, params=items,
            entry=_format_params(self.entry, params), signature=_parse_signature(self.signature),
            defines=items if self.defines else (), options=tuple(self.options), arch_specific=self.arch_specific)


@dataclass(frozen=True)
class CppExtension:
    """C++ (or CUDA C++) compiled by torch.utils.cpp_extension.load_inline into a Python module.

    The shape class reaches the source as -D macros: bind("fp32", SCALAR_T="float") compiles with
    -DSCALAR_T=float.  `functions` are the at::Tensor functions the module exports."""

    name: str
    source: Source
    functions: tuple[str, ...]
    options: tuple[str, ...] = ("-O3",)
    cuda: bool = False

    def bind(self, dtype: str = "any", **params: object) -> BuildRequest:
        return BuildRequest(
            backend="load_inline", kernel=self.name, source=self.source, dtype=dtype,
            params=tuple((k, str(v)) for k, v in sorted(params.items())),
            functions=tuple(self.functions), defines=tuple((k, str(v)) for k, v in sorted(params.items())),
            options=tuple(self.options), cuda=self.cuda)


@dataclass(frozen=True)
class CudaLibrary:
    """Host and device code compiled by nvcc into a shared library with a C ABI, called through ctypes.

    For kernels that need host code (the CUTLASS device-level API builds TMA descriptors on the host) and
    no torch headers.  `functions` maps each extern "C" function to (argument kinds, return kind)."""

    name: str
    source: Source
    functions: Mapping[str, tuple[tuple[str, ...], str]]
    options: tuple[str, ...] = ()
    arch_specific: bool = False

    def bind(self, dtype: str = "any", **params: object) -> BuildRequest:
        return _library_request("nvcc", self, dtype, params, arch_specific=self.arch_specific)


@dataclass(frozen=True)
class CppLibrary:
    """C++ CPU code compiled by the host compiler into a shared library with a C ABI, called through ctypes.

    For CPU kernels over raw pointers: no torch/extension.h and no Python bindings, so a build takes about a
    second where CppExtension's takes 20-40 s.  The source may include ATen/Parallel.h (torch's intra-op
    threads).  `functions` maps each extern "C" function to (argument kinds, return kind), as CudaLibrary's."""

    name: str
    source: Source
    functions: Mapping[str, tuple[tuple[str, ...], str]]
    options: tuple[str, ...] = ("-O3",)

    def bind(self, dtype: str = "any", **params: object) -> BuildRequest:
        return _library_request("cxx", self, dtype, params, cuda=False)


def _library_request(backend: str, spec: "CudaLibrary | CppLibrary", dtype: str, params: Mapping[str, object],
                     **extra: bool) -> BuildRequest:
    """A C-ABI library's request: its functions' signatures, the params as -D macros too."""
    signatures = tuple((fn, tuple(args), ret) for fn, (args, ret) in sorted(spec.functions.items()))
    items = tuple((k, str(v)) for k, v in sorted(params.items()))
    return BuildRequest(backend=backend, kernel=spec.name, source=spec.source, dtype=dtype, params=items,
                        functions=tuple(name for name, _, _ in signatures), c_signatures=signatures, defines=items,
                        options=tuple(spec.options), **extra)


def host_machine() -> str:
    """CPU kernels are machine code for this ISA; it is part of their key."""
    return platform.machine().lower()
