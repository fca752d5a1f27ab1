"""Test setup: every test session gets its own cache root (never ~/.cache), GPU tests skip only without a GPU, and
a session leaves no temporary directory behind."""
from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

# Every temporary file of the session lives under one directory, removed when the session ends: pytest's
# tmp_path directories, the runtime's build directories, subprocesses' (through TMPDIR), and the cache root.
# (pytest's own basetemp follows tempfile.gettempdir(); --basetemp DIR keeps a session's files.)
_SESSION_TMP = Path(tempfile.mkdtemp(prefix="jitops-tests-"))
os.environ["TMPDIR"] = str(_SESSION_TMP)
tempfile.tempdir = str(_SESSION_TMP)
atexit.register(shutil.rmtree, _SESSION_TMP, True)  # after jitops' own exit hook (stops compilers) has run

# Before jitops is imported anywhere: kernels compile once per session
# into this root.  JITOPS_TEST_CACHE keeps it across sessions when iterating locally.
_SESSION_ROOT = Path(os.environ.get("JITOPS_TEST_CACHE") or _SESSION_TMP / "cache")
os.environ["JITOPS_CACHE_DIR"] = str(_SESSION_ROOT)
os.environ.pop("JITOPS_CACHE_PATH", None)
if os.environ.get("JITOPS_TEST_CACHE_PATH"):  # read-only roots of prebuilt kernels (a GPU session carries them)
    os.environ["JITOPS_CACHE_PATH"] = os.environ["JITOPS_TEST_CACHE_PATH"]
os.environ.pop("JITOPS_OFFLINE", None)
os.environ.pop("JITOPS_RECORD", None)
if os.environ.get("JITOPS_TEST_RECORD"):  # a GPU session lists what its tests compiled, to prebuild it next time
    os.environ["JITOPS_RECORD"] = os.environ["JITOPS_TEST_RECORD"]
sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none present); run on the GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def session_cache() -> Path:
    """The session's shared cache root (holds the compiled CPU kernels)."""
    return _SESSION_ROOT


@pytest.fixture
def fresh_cache(tmp_path):
    """An empty writable cache root for this test, with the runtime's memory forgotten before and after."""
    import jitops

    def forget() -> None:
        jitops.clear_memory_cache()
        jitops.runtime._private.clear()  # builds kept in memory after a failed store belong to one test

    root = tmp_path / "cache"
    forget()
    with jitops.config.scope(cache_dir=root, cache_path=(), offline=False, record=None):
        yield root
    forget()


def pytest_terminal_summary(terminalreporter):
    """tests/test_opinfo.py's counts (match / rejected / xfail / wrong / unclear per op and dtype), when it ran;
    also written as JSON to $JITOPS_OPINFO_SUMMARY when that names a file."""
    opinfo = sys.modules.get("test_opinfo")
    if opinfo is None or not opinfo.OUTCOMES:
        return
    terminalreporter.section("OpInfo samples through jitops")
    for line in opinfo.summary_lines():
        terminalreporter.write_line(line)
    if os.environ.get("JITOPS_OPINFO_SUMMARY"):
        opinfo.write_summary(os.environ["JITOPS_OPINFO_SUMMARY"])
