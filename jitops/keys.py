"""The disk key: sha256 over named components, kept as JSON beside each entry so a miss can be explained.

The key has two halves:
  request   - what is compiled: kernel, entry, backend, source closure hashes, CUTLASS version, flags, exact
              arch, dtype, shape class, entry format, and the environment variables that change code generation;
  toolchain - who compiles it: compiler versions (NVRTC, nvcc, the C++ compiler, torch for cxx and load_inline) and the
              CUDA header set.
An entry lives at <root>/v<FORMAT>/<arch>/<dtype>/<kernel>-<request[:16]>-<toolchain[:8]>/.
A machine with a compiler looks up the exact pair, so a toolkit upgrade recompiles.  A machine with no
compiler (a deployment image) or in offline mode accepts any toolchain for the same request whose build can load
here (jitops/backends/base.py, loads_builds_by), so an image built by a toolchain it does not carry still finds its
kernels.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from .specs import BuildRequest, Target, host_machine

FORMAT_VERSION = 1


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def digest(obj: Any) -> str:
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()


@dataclass(frozen=True)
class CacheKey:
    request: dict[str, Any]
    toolchain: dict[str, Any]

    # Digests are computed once per key (each is canonical JSON plus sha256 of a whole key half): a warm
    # first call reads each several times.  The key's dicts are never mutated after construction.
    @cached_property
    def request_hash(self) -> str:
        return digest(self.request)

    @cached_property
    def toolchain_hash(self) -> str:
        return digest(self.toolchain)

    @cached_property
    def full(self) -> str:
        return digest({"request": self.request, "toolchain": self.toolchain})

    @property
    def arch(self) -> str:
        return self.request["arch"]

    @property
    def dtype(self) -> str:
        return self.request["dtype"]

    @property
    def kernel(self) -> str:
        return self.request["kernel"]

    def dirname(self) -> str:
        return f"{self.kernel}-{self.request_hash[:16]}-{self.toolchain_hash[:8]}"

    def request_prefix(self) -> str:
        """Directory-name prefix shared by every toolchain's build of this request."""
        return f"{self.kernel}-{self.request_hash[:16]}-"


def request_components(request: BuildRequest, target: Target, *, cutlass_version: str | None,
                       env_allowlist: tuple[str, ...]) -> dict[str, Any]:
    components: dict[str, Any] = {
        "format": FORMAT_VERSION,
        "backend": request.backend,
        "kernel": request.kernel,
        "entry": request.entry,
        "functions": list(request.functions),
        "signature": list(request.signature),
        "c_signatures": [[name, list(args), ret] for name, args, ret in request.c_signatures],
        "sources": request.source.closure(),
        "cutlass": cutlass_version,
        "options": list(request.options),
        "defines": [list(d) for d in request.defines],
        "arch": request.arch(target),
        "dtype": request.dtype,
        "shape_class": [list(p) for p in request.params],
        "env": {name: os.environ.get(name) for name in env_allowlist},
    }
    if target.device_type == "cpu":
        components["machine"] = host_machine()
    return components


def explain_difference(wanted: dict[str, Any], have: dict[str, Any], prefix: str = "") -> list[str]:
    """Human-readable list of the components that differ between two key halves (for `cache_tools explain`)."""
    lines = []
    for name in sorted(set(wanted) | set(have)):
        a, b = wanted.get(name, "<absent>"), have.get(name, "<absent>")
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            lines += explain_difference(a, b, prefix + name + ".")
        else:
            lines.append(f"{prefix}{name}: wanted {canonical_json(a)}, cached {canonical_json(b)}")
    return lines
