"""The compiler processes jitops starts, and their build directories.

Each compiler runs in a process group of its own (a new session), so that stopping it stops everything it
started: nvcc's cicc, ptxas and host compiler, ninja's c++ and cc1plus.  Without that, a KeyboardInterrupt
killed ninja alone and left cc1plus running under init, writing into a build directory that was being removed.

- run() is subprocess.run with the process group tracked: when the wait is interrupted (KeyboardInterrupt, a
  timeout, any exception) the whole group is stopped before the exception goes on.
- stop_all() stops every group still running: `cache_tools prewarm` calls it on SIGINT and SIGTERM, whose
  compiles run in worker threads; at interpreter exit it also runs, for compiles in daemon threads.
- torch's load_inline runs ninja through `subprocess.run` of torch.utils.cpp_extension's module:
  track_cpp_extension() points that name at run() here (everything else passes through untouched).
- new_build_dir() makes a build directory that is removed at exit if a compile left it behind.
"""
from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import types
from pathlib import Path
from typing import Any

_LIVE: set[subprocess.Popen] = set()
_BUILD_DIRS: set[Path] = set()
_GUARD = threading.Lock()
_STOPPING = threading.Event()
GRACE_SECONDS = 2.0  # between SIGTERM and SIGKILL: compilers exit at once on SIGTERM; nothing needs flushing


def run(args: Any, *, input: Any = None, capture_output: bool = False, timeout: float | None = None,
        check: bool = False, **kwargs: Any) -> subprocess.CompletedProcess:
    """subprocess.run in a new process group that is stopped as a whole if the wait is interrupted."""
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    kwargs["start_new_session"] = True
    process = subprocess.Popen(args, stdin=subprocess.PIPE if input is not None else kwargs.pop("stdin", None),
                               **kwargs)
    with _GUARD:
        _LIVE.add(process)
        stopping = _STOPPING.is_set()
    try:
        if stopping:  # stop_all() ran while this one was starting: it must not outlive the others
            raise InterruptedError("jitops: compiles were stopped (interrupted)")
        stdout, stderr = process.communicate(input, timeout=timeout)
    except BaseException:
        stop(process)
        raise
    finally:
        with _GUARD:
            _LIVE.discard(process)
    if check and process.returncode:
        raise subprocess.CalledProcessError(process.returncode, process.args, output=stdout, stderr=stderr)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def stop(process: subprocess.Popen) -> None:
    """SIGTERM to the process's group, SIGKILL after GRACE_SECONDS; the group is signalled again after the
    leader exits, for children that outlive it (the group id stays valid while any member lives)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            process.wait(timeout=GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            continue
        except BaseException:  # noqa: BLE001 - a second Ctrl-C while stopping: finish stopping first
            continue


def stop_all(refuse_new: bool = False) -> int:
    """Stop every compiler process group that run() started and that still runs; with `refuse_new`, also
    those that start from now until allow_new() (a worker thread may be about to start one).  Returns how many
    were running."""
    with _GUARD:
        if refuse_new:
            _STOPPING.set()
        live = list(_LIVE)
    for process in live:
        stop(process)
    return len(live)


def allow_new() -> None:
    _STOPPING.clear()


def running() -> int:
    with _GUARD:
        return len(_LIVE)


# ---- build directories -------------------------------------------------------------------------------------------
def new_build_dir(prefix: str) -> Path:
    """A private temporary directory for one compile, removed at exit if nothing removed it before."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    with _GUARD:
        _BUILD_DIRS.add(path)
    return path


def release_build_dir(path: Path) -> None:
    """The caller removed `path`, or keeps it on purpose (JITOPS_KEEP_FAILED_BUILDS)."""
    with _GUARD:
        _BUILD_DIRS.discard(path)


def _at_exit() -> None:
    stop_all()
    with _GUARD:
        leftovers = list(_BUILD_DIRS)
    for path in leftovers:
        shutil.rmtree(path, ignore_errors=True)


atexit.register(_at_exit)


# ---- torch's load_inline ----------------------------------------------------------------------------------------
class _TrackedSubprocess(types.ModuleType):
    """The subprocess module with run() replaced by this module's."""

    def __init__(self) -> None:
        super().__init__("subprocess")

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)

    run = staticmethod(run)


def track_cpp_extension() -> None:
    """Make torch.utils.cpp_extension start ninja through run() (idempotent)."""
    from torch.utils import cpp_extension

    if not isinstance(getattr(cpp_extension, "subprocess", None), _TrackedSubprocess):
        cpp_extension.subprocess = _TrackedSubprocess()
