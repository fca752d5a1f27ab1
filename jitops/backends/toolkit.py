"""Where the CUDA pieces come from, and their identities for the cache key.

Identities must be cheap: a warm start must not load the 100 MB NVRTC library (290 ms measured on the dev box)
just to build a key.  So versions come from package metadata, header macros and file names; the compiler is
loaded or run only to compile, and then its self-reported version is checked against the identity.

Precedence, the same for NVRTC's headers and nvcc:
  1. JITOPS_CUDA_HOME, if set;
  2. NVIDIA's pip wheels (nvidia-cuda-nvrtc/-runtime/-cccl/-crt, nvidia-cuda-nvcc), when the whole set is
     installed: NVRTC then loads from the wheel (nvrtc_api), so the headers must come from the same release;
  3. a system toolkit: CUDA_HOME, CUDA_PATH, the directory above `nvcc` on PATH, /usr/local/cuda.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..config import config
from ..errors import ToolchainError
from . import nvrtc_api


@functools.lru_cache(maxsize=None)
def _site_versions(site: Path) -> dict[str, str]:
    """Versions of the distributions installed in one site-packages directory, from one listdir.
    (importlib.metadata scans every sys.path entry per call: ~20 ms a call in a 200-package venv.)"""
    versions = {}
    try:
        names = os.listdir(site)
    except OSError:
        return versions
    for name in names:
        if name.endswith(".dist-info"):
            dist, _, version = name[: -len(".dist-info")].partition("-")
            versions[dist.lower().replace("_", "-")] = version
    return versions


def _dist_version(name: str) -> str | None:
    """Version of an NVIDIA wheel, looked up beside the nvidia/ package it installs into."""
    for prefix in _nvidia_wheel_dirs():
        version = _site_versions(prefix.parent.parent).get(name)
        if version:
            return version
    return None


@functools.lru_cache(maxsize=1)
def _nvidia_wheel_dirs() -> list[Path]:
    """site-packages/nvidia/cu13 (CUDA 13 wheels put everything under one prefix)."""
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(p) / "cu13" for p in spec.submodule_search_locations if (Path(p) / "cu13").is_dir()]



def _system_homes() -> list[Path]:
    homes = []
    override = config.cuda_home
    if override is not None:
        return [override]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            homes.append(Path(os.environ[var]))
    nvcc = shutil.which("nvcc")
    if nvcc:
        homes.append(Path(nvcc).resolve().parent.parent)
    homes.append(Path("/usr/local/cuda"))
    return homes


@dataclass(frozen=True)
class HeaderSet:
    dirs: tuple[Path, ...]
    identity: dict[str, str]


def _macro(path: Path, name: str, head: int = 65536) -> str | None:
    """A numeric #define from the first `head` bytes of a header (cuda.h is 1.1 MB; its CUDA_VERSION sits
    near the top).  A plain search, not a regex: the regexes, compiled per macro, were most of the CUDA header
    identity's cost, 1.03 ms against 0.12 ms now for a toolkit's headers on the dev box, in a warm first call
    that takes 2.7-3.6 ms on the H100 (bench_jit_latency.py)."""
    try:
        with open(path, "rb") as fh:
            text = fh.read(head)
    except OSError:
        return None
    needle = name.encode()
    start = 0
    while (at := text.find(needle, start)) >= 0:
        start = at + len(needle)
        line_start = text.rfind(b"\n", 0, at) + 1
        head_of_line = text[line_start:at].replace(b" ", b"").replace(b"\t", b"")
        end = text.find(b"\n", start)
        rest = text[start:end if end >= 0 else len(text)]
        tokens = rest.split()
        if head_of_line == b"#define" and rest[:1] in (b" ", b"\t") and tokens and tokens[0].isdigit():
            return tokens[0].decode()
    return None


def _system_header_set(home: Path) -> HeaderSet | None:
    include = home / "include"
    if not (include / "cuda_runtime.h").is_file():
        return None
    cccl = include / "cccl"
    dirs = (cccl, include) if cccl.is_dir() else (include,)
    cccl_version = _macro((cccl if cccl.is_dir() else include) / "cuda" / "std" / "__cccl" / "version.h",
                          "CCCL_VERSION")
    return HeaderSet(dirs, {"source": "toolkit", "cuda": _macro(include / "cuda.h", "CUDA_VERSION") or "?",
                            "cccl": cccl_version or "?"})


@functools.lru_cache(maxsize=None)
def _cuda_headers(override: Path | None) -> HeaderSet:
    if override is None:
        for prefix in _nvidia_wheel_dirs():
            include = prefix / "include"
            if all((include / p).exists() for p in ("cuda_runtime.h", "cccl/cuda/std", "crt")):
                return HeaderSet((include / "cccl", include), {
                    "source": "wheels", "runtime": _dist_version("nvidia-cuda-runtime") or "?",
                    "cccl": _dist_version("nvidia-cuda-cccl") or "?", "crt": _dist_version("nvidia-cuda-crt") or "?"})
    for home in _system_homes():
        found = _system_header_set(home)
        if found is not None:
            return found
    raise ToolchainError(
        "jitops: no CUDA headers found for NVRTC.  Install the wheels (pip install nvidia-cuda-runtime "
        "nvidia-cuda-crt 'nvidia-cuda-cccl<13.2'), or point JITOPS_CUDA_HOME or CUDA_HOME at a CUDA toolkit.")


def cuda_headers() -> HeaderSet:
    return _cuda_headers(config.cuda_home)


@functools.lru_cache(maxsize=None)
def _nvrtc_location(override: Path | None) -> tuple[Path, str] | None:
    """(libnvrtc's file, its identity for the cache key), found without loading it."""
    if override is None:
        version = _dist_version("nvidia-cuda-nvrtc")
        if version:
            for prefix in _nvidia_wheel_dirs():
                libraries = sorted((prefix / "lib").glob("libnvrtc.so.*"))
                if libraries:
                    return libraries[0], f"{version} (wheel)"
    for home in _system_homes():
        for libdir in ("lib64", "lib", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib"):
            lib = home / libdir / "libnvrtc.so"
            if lib.exists():
                # The real file is libnvrtc.so.13.0.88: its name carries the full version.
                return lib, f"{lib.resolve().name.removeprefix('libnvrtc.so.')} (toolkit)"
    return None


def nvrtc_identity() -> str | None:
    """NVRTC's version without loading it; None if no NVRTC is installed."""
    found = _nvrtc_location(config.cuda_home)
    return found[1] if found else None


def nvrtc() -> "nvrtc_api.Nvrtc":
    """NVRTC, loaded through ctypes from the file nvrtc_identity() describes (jitops/backends/nvrtc_api.py)."""
    found = _nvrtc_location(config.cuda_home)
    if found is None:
        raise ToolchainError("jitops: NVRTC is not installed: pip install nvidia-cuda-nvrtc, or point "
                             "JITOPS_CUDA_HOME or CUDA_HOME at a CUDA toolkit")
    return nvrtc_api.load(found[0])


@functools.lru_cache(maxsize=None)
def _nvcc_path(override: Path | None) -> Path | None:
    candidates = [home / "bin" / "nvcc" for home in _system_homes()]
    if override is None:
        candidates += [prefix / "bin" / "nvcc" for prefix in _nvidia_wheel_dirs()]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def nvcc_path() -> Path | None:
    """nvcc: a system toolkit first (it has the host-side libraries), then the nvidia-cuda-nvcc wheel."""
    return _nvcc_path(config.cuda_home)


@functools.lru_cache(maxsize=None)
def _version_line(executable: str, last: bool) -> str:
    """One line of `executable --version`, run once per process."""
    try:
        out = subprocess.run([executable, "--version"], capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise ToolchainError(f"jitops: `{executable} --version` failed: {exc}") from None
    lines = [line.strip() for line in out.splitlines() if line.strip()] or ["?"]
    return lines[-1] if last else lines[0]


def nvcc_identity() -> str | None:
    """e.g. 'Build cuda_13.0.r13.0/compiler.36424714_0' (nvcc's last version line is the most specific)."""
    path = nvcc_path()
    return _version_line(str(path), last=True) if path else None


def host_compiler_path(compiler: str | None = None) -> str | None:
    """The C++ compiler the builds run: `compiler`, else $CXX, else c++ on PATH; None if there is none."""
    return shutil.which(compiler or os.environ.get("CXX") or "c++")


def host_compiler_identity(compiler: str | None = None) -> str | None:
    """e.g. 'c++ (Debian 12.2.0-14+deb12u1) 12.2.0'."""
    path = host_compiler_path(compiler)
    return _version_line(path, last=False) if path else None


def torch_link_identity() -> dict[str, object]:
    """What a library linked against libtorch depends on: torch's version and its C++ ABI."""
    import torch

    return {"torch": torch.__version__, "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI)}


# ---- which GPU archs the compilers can target -------------------------------------------------------------------
def arch_number(arch: str) -> int:
    """'sm_90a' -> 90, 'sm_120' -> 120."""
    return int(arch.removeprefix("sm_").rstrip("a"))


@functools.lru_cache(maxsize=None)
def _nvrtc_archs(override: Path | None) -> tuple[int, ...] | None:
    if _nvrtc_location(override) is None:
        return None
    try:
        return nvrtc().supported_archs()
    except Exception:  # noqa: BLE001 - an NVRTC that cannot say: nothing is rejected up front
        return None


def nvrtc_archs() -> tuple[int, ...] | None:
    """The compute capabilities NVRTC can compile for (loads NVRTC: ~0.3 s), or None without NVRTC."""
    return _nvrtc_archs(config.cuda_home)


@functools.lru_cache(maxsize=None)
def _nvcc_archs(executable: str) -> tuple[int, ...] | None:
    try:
        out = subprocess.run([executable, "--list-gpu-arch"], capture_output=True, text=True, timeout=60,
                             check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = sorted({int(n) for n in re.findall(r"compute_(\d+)", out)})
    return tuple(found) or None


def unsupported_arch(compiler: str, supported: tuple[int, ...] | None, arch: str) -> str | None:
    """'nvcc supports sm_75 to sm_121, not sm_999' or None (supported, or the compiler cannot say)."""
    if supported is None or arch == "cpu" or arch_number(arch) in supported:
        return None
    return f"{compiler} here compiles for {format_archs(supported)}, not {arch}"


def format_archs(supported: tuple[int, ...]) -> str:
    return ", ".join(f"sm_{n}" for n in supported)


def nvcc_archs() -> tuple[int, ...] | None:
    """The compute capabilities nvcc can compile for (`nvcc --list-gpu-arch`), or None without nvcc."""
    path = nvcc_path()
    return _nvcc_archs(str(path)) if path else None


# ---- CUTLASS -------------------------------------------------------------------------------------------------
CUTLASS_PREFIXES = ("cutlass/", "cute/")


@functools.lru_cache(maxsize=1)
def cutlass_include_dirs() -> tuple[Path, ...]:
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or not spec.submodule_search_locations:
        raise ToolchainError("jitops: CUTLASS headers not found.  pip install 'nvidia-cutlass>=4.2,<4.3'")
    source = Path(list(spec.submodule_search_locations)[0]) / "source"
    dirs = (source / "include", source / "tools" / "util" / "include")
    if not (dirs[0] / "cutlass" / "cutlass.h").is_file():
        raise ToolchainError(f"jitops: the nvidia-cutlass package at {source} has no CUTLASS headers")
    return dirs


@functools.lru_cache(maxsize=1)
def cutlass_version() -> str:
    version_h = cutlass_include_dirs()[0] / "cutlass" / "version.h"
    parts = [_macro(version_h, f"CUTLASS_{p}") for p in ("MAJOR", "MINOR", "PATCH")]
    if None in parts:
        raise ToolchainError(f"jitops: cannot read the CUTLASS version from {version_h}")
    return ".".join(parts)  # type: ignore[arg-type]
