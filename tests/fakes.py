"""A compiler backend for tests of the runtime and the cache: compiles in microseconds, counts its compiles,
and 'loads' to the bytes it wrote, so tests check the pipeline without a real compiler or a GPU."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from jitops import backends
from jitops.backends.base import Backend, BuildOutput
from jitops.errors import CompileError
from jitops.specs import BuildRequest, Source


class EchoBackend(Backend):
    name = "echo"
    env_allowlist = ("JITOPS_TEST_ECHO_FLAG",)

    def __init__(self) -> None:
        self.compiles = 0
        self.toolchain_identity: dict[str, Any] | None = {"echo": "1.0"}
        self.delay = 0.0

    def toolchain(self, request: BuildRequest) -> dict[str, Any] | None:
        return self.toolchain_identity

    def compile(self, request: BuildRequest, arch: str, build_dir: Path, tag: str) -> BuildOutput:
        if "#error" in request.source.read():
            raise CompileError(kernel=request.label(), backend=self.name, arch=arch, options=[],
                               log=f"{request.source.name}(1): error: #error directive",
                               source=request.source.read(), source_name=request.source.name)
        time.sleep(self.delay)
        self.compiles += 1
        (build_dir / "payload.bin").write_bytes(f"{arch}|{request.source.read()}".encode())
        return BuildOutput(["payload.bin"], {"tag": tag}, log="echo: fine")

    def load(self, request: BuildRequest, directory: Path, blobs: dict[str, bytes], meta: dict[str, Any],
             device_index: int | None) -> bytes:
        return blobs["payload.bin"]


def install() -> EchoBackend:
    backend = EchoBackend()
    backends.BACKENDS["echo"] = backend
    return backend


def request(text: str = "kernel body", kernel: str = "echo_kernel", dtype: str = "fp32",
            **params: str) -> BuildRequest:
    return BuildRequest(backend="echo", kernel=kernel, source=Source.inline(kernel, text), dtype=dtype,
                        params=tuple(sorted(params.items())))


class FakeTmaDriver:
    """The TMA driver calls of a CUTLASS-style host side (jitops.cutlass_host, jitops.light_gemm), recorded:
    `encode_into` stands in for cuTensorMapEncodeTiled; subclasses add the launch their host side makes."""

    def __init__(self, address_field, encode_into) -> None:
        self.address_field = address_field
        self.encode_into = encode_into
        self.replaced: list = []
        self.launches: list = []
        self.shared: list = []
        self.contexts: list = []

    def set_shared_memory(self, function, size):
        self.shared.append(size)

    def ensure_context(self, device_index):
        self.contexts.append(device_index)

    def replace(self, descriptor_address, address):
        self.replaced.append((descriptor_address, address))
        return 0
