"""SIGINT and SIGTERM stop the compiler processes jitops started (each compile's process group: nvcc with its
cicc, ptxas and host compiler; ninja with c++ and cc1plus) and remove their build directories."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from jitops.backends import processes, toolkit
from jitops.cache.disk import CacheEntry, CacheRoot

from cache_tools_helpers import entry_dirs, write_manifest
from proc_helpers import alive, descendants, wait_gone

REPO = Path(__file__).resolve().parent.parent


pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process trees from /proc")


# ---- the process-group runner -----------------------------------------------------------------------------------
def test_an_interrupted_run_stops_the_whole_process_group(tmp_path):
    pidfile = tmp_path / "grandchild"

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    try:
        with pytest.raises(KeyboardInterrupt):
            processes.run(["sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert wait_gone([int(pidfile.read_text())]) == []  # the grandchild, not only the shell
    assert processes.running() == 0


def test_stop_all_stops_compiles_running_in_other_threads(tmp_path):
    pidfile = tmp_path / "grandchild"
    results = []
    worker = threading.Thread(target=lambda: results.append(
        processes.run(["sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"], capture_output=True)))
    worker.start()
    deadline = time.monotonic() + 10
    while not (pidfile.exists() and pidfile.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert processes.stop_all(refuse_new=True) == 1
        worker.join(10)
        assert results and results[0].returncode != 0
        assert wait_gone([int(pidfile.read_text())]) == []
        with pytest.raises(InterruptedError):  # a worker about to start one after the interrupt
            processes.run(["true"])
    finally:
        processes.allow_new()
    assert processes.run(["true"]).returncode == 0


def test_build_directories_left_behind_are_removed_at_exit(tmp_path):
    code = ("from jitops.backends import processes; d = processes.new_build_dir('jitops-probe-'); "
            "(d / 'half.o').write_text('x'); print(d)")
    env = dict(os.environ, PYTHONPATH=str(REPO), TMPDIR=str(tmp_path))
    made = Path(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                               check=True).stdout.strip())
    assert made.parent == tmp_path and not made.exists()


def test_load_inline_runs_ninja_through_the_tracked_runner():
    import subprocess as real
    from torch.utils import cpp_extension

    processes.track_cpp_extension()
    assert cpp_extension.subprocess.run is processes.run
    assert cpp_extension.subprocess.PIPE == real.PIPE and cpp_extension.subprocess.check_output is real.check_output


# ---- a prewarm interrupted while its compilers run ----------------------------------------------------------------
OPS = '''
import torch, jitops

CPU = jitops.CppExtension("interrupt_probe_cpu", jitops.Source.inline("interrupt_probe.cpp", """
#include <torch/extension.h>
// {marker}
torch::Tensor probe(torch::Tensor x) {{ return x; }}
"""), functions=("probe",))
CUDA = jitops.CudaLibrary("interrupt_probe_cuda", jitops.Source.inline("interrupt_probe.cu", """
#include <cute/tensor.hpp>
// {marker}
extern "C" int probe() {{ return 0; }}
"""), functions={{"probe": ((), "i32")}})

probe = jitops.op("interrupttest::probe(Tensor x) -> Tensor", shape_class=lambda x: x.dtype,
                  cpu=jitops.Impl(lambda cls, target: {{"k": CPU.bind("fp32")}}, lambda k, x: x),
                  cuda=jitops.Impl(lambda cls, target: {{"k": CUDA.bind("fp32")}}, lambda k, x: x),
                  fake=lambda x: torch.empty_like(x))
'''

COMPILERS = {"cc1plus"}  # ninja's (load_inline); nvcc adds its own


def _default_sigint() -> None:
    """A process started from a background job inherits SIGINT ignored (and Python keeps it so): reset it, as a
    terminal or a supervisor's process has it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
NVCC = {"nvcc", "cicc", "cudafe++", "ptxas"}


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupted_prewarm_stops_its_compilers_and_leaves_nothing(sig, code, tmp_path):
    with_nvcc = toolkit.nvcc_path() is not None
    (tmp_path / "interrupt_ops.py").write_text(OPS.format(marker=uuid.uuid4().hex))  # never cached before
    archs = ["cpu", "sm_90a"] if with_nvcc else ["cpu"]
    manifest = write_manifest(tmp_path / "m.json", {"op": "interrupttest::probe", "dtypes": ["fp32"],
                                                    "shapes": [[[4]]]}, archs=archs)
    temp, cache = tmp_path / "tmp", tmp_path / "cache"
    temp.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("JITOPS_")}
    env.update(PYTHONPATH=os.pathsep.join([str(REPO), str(tmp_path)]), TMPDIR=str(temp))
    prewarm = subprocess.Popen([sys.executable, "-m", "cache_tools", "prewarm", "--manifest", str(manifest),
                                "--import", "interrupt_ops", "--cache-dir", str(cache), "--jobs", "2",
                                "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env, cwd=REPO, start_new_session=True, preexec_fn=_default_sigint)
    running: dict[int, str] = {}
    seen: dict[int, str] = {}  # every compiler process met, killed at the end whatever happens
    try:
        deadline = time.monotonic() + 300
        # Signal only while the compilers run at once: a short-lived cc1plus (nvcc's host preprocessing) seen in
        # one poll may be gone by the next, and a check against everything ever seen failed in CI that way.
        while time.monotonic() < deadline and prewarm.poll() is None:
            running = descendants(prewarm.pid)
            seen.update(running)
            names = set(running.values())
            if COMPILERS & names and (not with_nvcc or NVCC & names):
                break
            time.sleep(0.1)
        assert prewarm.poll() is None, prewarm.communicate()
        assert COMPILERS & set(running.values()), running
        prewarm.send_signal(sig)
        out, err = prewarm.communicate(timeout=60)
        assert prewarm.returncode == code, out + err
        assert ("terminated" if sig == signal.SIGTERM else "interrupted") in err and "Traceback" not in err, err
        assert wait_gone(list(running)) == [], {p: running[p] for p in running if alive(p)}
        assert not [p.name for p in temp.iterdir() if p.name.startswith("jitops-")]  # build directories
        # A compile that ended between the last poll and the signal keeps its whole entry (CI saw nvcc's last
        # step end in that gap); the compile the signal stopped leaves none, and nothing is half-written.
        left = entry_dirs(cache)
        assert len(left) < len(archs), left
        root = CacheRoot(cache, writable=True)
        for entry in left:  # every file meta.json lists, with its size and sha256 (CorruptEntry otherwise)
            CacheEntry(entry, root, json.loads((entry / "meta.json").read_text())).verify()
        assert not (cache / "v1" / "tmp").exists() or list((cache / "v1" / "tmp").iterdir()) == []
    finally:
        if prewarm.poll() is None:
            os.killpg(prewarm.pid, signal.SIGKILL)
            prewarm.wait()
        for pid in seen:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


# ---- the test suite itself -----------------------------------------------------------------------------------------
PROBE = """
import tempfile
import jitops

def test_makes_temporary_files(tmp_path, fresh_cache, session_cache):
    (tmp_path / "f").write_text("x")
    tempfile.mkdtemp(prefix="jitops-probe-")
    assert session_cache.is_relative_to(tempfile.gettempdir())
"""


@pytest.mark.timeout(300)
def test_a_test_session_leaves_no_temporary_directory(tmp_path):
    """tests/conftest.py keeps the session's cache root, pytest's tmp_path directories and everything made
    through tempfile under one directory, removed when the session ends."""
    probe = tmp_path / "probe" / "test_probe.py"
    probe.parent.mkdir()
    probe.write_text(PROBE)
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("JITOPS_")}
    env.update(PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests")]), TMPDIR=str(temp))
    ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
                          str(probe)], capture_output=True, text=True, env=env, cwd=probe.parent, timeout=280)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert list(temp.iterdir()) == []
