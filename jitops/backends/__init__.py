"""Compiler backends.  The runtime is their only user; they never import the cache."""
from __future__ import annotations

from .base import Backend, BuildOutput
from .cxx import CxxBackend
from .inline import LoadInlineBackend
from .nvcc import NvccBackend
from .nvrtc import NvrtcBackend

BACKENDS: dict[str, Backend] = {b.name: b for b in (NvrtcBackend(), NvccBackend(), CxxBackend(), LoadInlineBackend())}


def get(name: str) -> Backend:
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(f"jitops: unknown backend {name!r}; known: {', '.join(BACKENDS)}") from None


__all__ = ["Backend", "BuildOutput", "BACKENDS", "get"]
