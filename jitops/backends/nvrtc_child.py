"""A child process that runs one NVRTC compile: `python -m jitops.backends.nvrtc_child`, the pickled
(request, arch, build directory, tag) on stdin, the pickled ("ok", BuildOutput) or ("error", CompileError's
fields) on stdout.  NvrtcBackend.compile starts it for CUTLASS compiles off the main thread (NVRTC compiles one
program at a time per process)."""
from __future__ import annotations

import pickle
import sys
from pathlib import Path


def main() -> int:
    from jitops.backends.nvrtc import NvrtcBackend
    from jitops.errors import CompileError

    request, arch, build_dir, tag = pickle.loads(sys.stdin.buffer.read())
    try:
        result = ("ok", NvrtcBackend().compile_here(request, arch, Path(build_dir), tag))
    except CompileError as error:
        result = ("error", error.fields())
    sys.stdout.buffer.write(pickle.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
