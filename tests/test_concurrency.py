"""Processes sharing one cache: one compile per key, correct results everywhere, and no hang when a lock
holder dies."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from proc_helpers import descendants

REPO = Path(__file__).resolve().parent.parent

RACER = r"""
import json, sys, torch, jitops
x = torch.linspace(-4, 4, 4097, dtype=torch.float64)
y = jitops.gelu(x, "tanh")
ok = torch.allclose(y, torch.nn.functional.gelu(x, approximate="tanh"), rtol=1e-12, atol=1e-12)
print(json.dumps({"ok": bool(ok), "compiles": jitops.stats.compiles, "disk_hits": jitops.stats.disk_hits}))
"""


def _env(cache: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ, JITOPS_CACHE_DIR=str(cache), PYTHONPATH=str(REPO))
    env.update(extra)
    return env


@pytest.mark.timeout(900)
def test_eight_processes_racing_on_a_cold_key_compile_once(tmp_path):
    cache = tmp_path / "cache"
    racers = [subprocess.Popen([sys.executable, "-c", RACER], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=_env(cache)) for _ in range(8)]
    results = []
    for racer in racers:
        out, err = racer.communicate(timeout=850)
        assert racer.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert all(r["ok"] for r in results)
    assert sum(r["compiles"] for r in results) == 1
    assert sum(r["disk_hits"] for r in results) == 7
    assert len(list(cache.glob("v1/cpu/fp64/*/meta.json"))) == 1
    assert list((cache / "v1" / "tmp").iterdir()) == []


HOLDER = r"""
import sys, time, jitops
from jitops.runtime import runtime
from jitops.specs import Target
from jitops.ops.gelu import GELU_FORWARD
request = GELU_FORWARD.bind("bf16", T="__nv_bfloat16", VEC=8, APPROX=1, I="int")
key, _ = runtime.key_for(request, Target.parse("sm_90"))
with runtime.disk_cache().lock(key, timeout=60):
    print("locked", flush=True)
    time.sleep(600)
"""


@pytest.mark.timeout(300)
def test_a_lock_holder_killed_with_sigkill_does_not_block_the_next_process(tmp_path):
    cache = tmp_path / "cache"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True, env=_env(cache))
    assert holder.stdout.readline().strip() == "locked"
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    started = time.monotonic()
    code = ("import jitops; from jitops.runtime import runtime; from jitops.specs import Target; "
            "from jitops.ops.gelu import GELU_FORWARD; "
            "r = GELU_FORWARD.bind('bf16', T='__nv_bfloat16', VEC=8, APPROX=1, I='int'); "
            "print(runtime.prewarm(r, Target.parse('sm_90')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=_env(cache, JITOPS_LOCK_TIMEOUT="30"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "compiled"
    assert time.monotonic() - started < 60
    assert list(cache.glob("v1/sm_90/bf16/*/kernel.cubin"))


KILLED_MID_COMPILE = r"""
import torch, jitops
jitops.gelu(torch.randn(8, dtype=torch.float32))   # cold CPU compile: cc1plus, then the link, then the publish
"""


@pytest.mark.timeout(900)
def test_a_process_killed_mid_compile_leaves_no_entry_and_no_lock(tmp_path):
    cache = tmp_path / "cache"
    victim = subprocess.Popen([sys.executable, "-c", KILLED_MID_COMPILE], stderr=subprocess.PIPE, text=True,
                              env=_env(cache, JITOPS_PROGRESS_SECONDS="0"))
    assert "compiling" in victim.stderr.readline()  # the compile has started, under the lock
    # Killed while its compiler runs (the build takes about a second, so a fixed sleep would miss it): the link
    # and the publish come after cc1plus, so nothing can be published yet.
    deadline = time.monotonic() + 120
    while "cc1plus" not in descendants(victim.pid).values():
        assert victim.poll() is None and time.monotonic() < deadline, "the victim finished before it was killed"
        time.sleep(0.005)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    assert not list(cache.glob("v1/cpu/*/*/meta.json"))  # nothing half-published
    out = subprocess.run([sys.executable, "-c", RACER.replace("float64", "float32").replace("1e-12", "1e-5")],
                         capture_output=True, text=True, timeout=600, env=_env(cache, JITOPS_LOCK_TIMEOUT="60"))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"ok": True, "compiles": 1, "disk_hits": 0}
