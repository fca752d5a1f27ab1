"""The contract between the runtime and a compiler backend.

A backend turns a BuildRequest into files in a build directory (compile) and files back into something callable
(load).  It knows nothing of the cache: the runtime names the build directory, publishes it, verifies checksums
and hands load() only bytes that matched.  toolchain() must be cheap and must not raise when the compiler is
missing: it returns None, and the runtime then looks for any toolchain's build of the same request.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ..specs import BuildRequest


@dataclass
class BuildOutput:
    files: list[str]                                # artifact names inside the build directory
    meta: dict[str, Any] = field(default_factory=dict)  # what load() needs (e.g. the lowered kernel name)
    log: str = ""                                   # compiler warnings, kept beside the entry


class Backend(abc.ABC):
    name: ClassVar[str]
    # Environment variables that change the generated code; their values are part of the key.
    env_allowlist: ClassVar[tuple[str, ...]] = ()

    @abc.abstractmethod
    def toolchain(self, request: BuildRequest) -> dict[str, Any] | None:
        """Compiler identity for the key, or None if this machine cannot compile `request`."""

    def load_identity(self) -> dict[str, Any]:
        """The parts of this process that a build must share to load here (the torch it links against, its
        ABI...), each under the name toolchain() gives it.  Device code needs none: a cubin does not depend on
        which compiler made it."""
        return {}

    def loads_builds_by(self, toolchain: dict[str, Any]) -> bool:
        """Whether a build of the same request by another toolchain (a shipped image's, the fleet's) can load in
        this process: its toolchain has every part of load_identity() as this process has it."""
        return all(toolchain.get(name) == value for name, value in self.load_identity().items())

    def unavailable_reason(self, request: BuildRequest) -> str | None:
        """Why `request` cannot be compiled here (prewarm reports it by name), or None."""
        return None if self.toolchain(request) is not None else f"no {self.name} compiler found"

    def unsupported_arch(self, request: BuildRequest, arch: str) -> str | None:
        """Why this machine's compiler cannot target `arch` (sm_999, or an arch newer than the compiler), or
        None when it can or cannot say."""
        return None

    @abc.abstractmethod
    def compile(self, request: BuildRequest, arch: str, build_dir: Path, tag: str) -> BuildOutput:
        """Compile into build_dir.  `tag` is unique per key (for module names).  Raises CompileError."""

    @abc.abstractmethod
    def load(self, request: BuildRequest, directory: Path, blobs: dict[str, bytes], meta: dict[str, Any],
             device_index: int | None) -> Any:
        """Turn verified artifacts into a callable kernel for one device (None: CPU)."""
