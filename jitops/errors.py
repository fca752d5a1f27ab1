"""Errors jitops raises.  Each says what happened, to which op or kernel, and what to do next."""
from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Sequence


class JitopsError(RuntimeError):
    """Base class of jitops' own errors."""


class ConfigError(JitopsError, ValueError):
    """A JITOPS_* variable (or config.scope() value) is malformed."""


class ToolchainError(JitopsError):
    """A compiler or header set that a kernel needs is not installed."""


class CacheMissError(JitopsError):
    """Offline mode (JITOPS_OFFLINE=1) met a kernel that is not in any cache root."""

    def __init__(self, *, op: str, kernel: str, shape_class: object, arch: str, roots: Sequence[Path],
                 manifest_item: str | None, kernel_op: str | None = None) -> None:
        self.op, self.kernel, self.shape_class, self.arch = op, kernel, shape_class, arch
        self.kernel_op = kernel_op
        where = ", ".join(str(r) for r in roots) or "(no cache roots)"
        # The remedy repeats the cache in use: the root an image reads (the first, read-only ones come first),
        # so the prewarm fills the directory that is shipped, not the build machine's default cache.
        cache_dir = f" --cache-dir {shlex.quote(str(roots[0]))}" if roots else ""
        prewarm = f"python -m cache_tools prewarm{cache_dir} --arch {arch} --manifest M.json"
        if manifest_item:
            prewarm += f"   # with M.json = {{\"ops\": [{manifest_item}]}}"
        via = f" (through its op {kernel_op})" if kernel_op and kernel_op != op else ""
        super().__init__(
            f"jitops: offline mode (JITOPS_OFFLINE=1) and op {op!r}{via} needs kernel {kernel!r} for arch {arch}, "
            f"shape class {shape_class}, which is not cached in: {where}.\n"
            f"Prewarm it on a build machine (no GPU needed for NVRTC kernels) and ship the cache:\n  {prewarm}\n"
            f"or record every miss of a real run with JITOPS_RECORD=misses.jsonl and replay it with "
            f"`python -m cache_tools prewarm{cache_dir} --record misses.jsonl`.")


class CompileError(JitopsError):
    """A kernel failed to compile.  Carries the compiler log, the options and the source lines around the error."""

    def __init__(self, *, kernel: str, backend: str, arch: str, options: Sequence[str], log: str,
                 source: str | None = None, source_name: str | None = None,
                 build_dir: Path | None = None) -> None:
        self.kernel, self.backend, self.arch = kernel, backend, arch
        self.options = list(options)
        self.log = log
        self.source = source
        self.source_name = source_name
        self.build_dir = build_dir
        super().__init__(self._message())

    def fields(self) -> dict:
        """The constructor's arguments: how a compile in a child process sends its error back."""
        return {"kernel": self.kernel, "backend": self.backend, "arch": self.arch, "options": self.options,
                "log": self.log, "source": self.source, "source_name": self.source_name, "build_dir": self.build_dir}

    def excerpt(self, context: int = 3) -> str:
        """Numbered source lines around the first error the log points into this source."""
        if not self.source:
            return ""
        lines = self.source.splitlines()
        for line_no in _error_lines(self.log, self.source_name):
            if 1 <= line_no <= len(lines):
                lo, hi = max(1, line_no - context), min(len(lines), line_no + context)
                width = len(str(hi))
                return "\n".join(
                    f"{'>' if n == line_no else ' '} {n:{width}d} | {lines[n - 1]}" for n in range(lo, hi + 1))
        return ""

    def _message(self) -> str:
        log = self.log.strip()
        if len(log) > 8000:  # CUTLASS template errors run to megabytes; the head names the cause
            log = log[:8000] + f"\n... ({len(self.log) - 8000} more characters in CompileError.log)"
        parts = [f"jitops: compiling kernel {self.kernel!r} for {self.arch} with {self.backend} failed.",
                 "options: " + " ".join(self.options)]
        excerpt = self.excerpt()
        if excerpt:
            parts.append(f"source ({self.source_name}):\n{excerpt}")
        parts.append("compiler log:\n" + (log or "(empty)"))
        if self.build_dir is not None:
            parts.append(f"build directory kept at {self.build_dir}")
        else:
            parts.append("Set JITOPS_KEEP_FAILED_BUILDS=1 to keep the build directory.")
        return "\n".join(parts)


# "k.cu(12): error: ..." (NVRTC, nvcc) and "k.cpp:12:5: error: ..." (gcc, clang)
_NV_ERROR = re.compile(r"^(?P<file>[^\s(][^(]*)\((?P<line>\d+)\): (?:catastrophic )?error", re.M)
_GCC_ERROR = re.compile(r"^(?P<file>[^\s:][^:]*):(?P<line>\d+):(?:\d+:)? (?:fatal )?error", re.M)


def _error_lines(log: str, source_name: str | None) -> list[int]:
    found = []  # (position in the log, line): the first error in the log comes first
    for pattern in (_NV_ERROR, _GCC_ERROR):
        for match in pattern.finditer(log):
            file = match.group("file").strip()
            if source_name is None or Path(file).name == Path(source_name).name:
                found.append((match.start(), int(match.group("line"))))
    return [line for _, line in sorted(found)]
