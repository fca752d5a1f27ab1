"""Child processes for tests: a clean environment for a fresh jitops process, and process trees read from /proc
for tests that stop or kill processes mid-compile (Linux only)."""
from __future__ import annotations

import os
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a fresh jitops process: none of this session's JITOPS_ settings (a read-only root of
    prebuilt kernels, JITOPS_CACHE_PATH, would turn a cold run warm), this checkout first on the path, then
    whatever the session's path holds (the GPU machine's carried wheels)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JITOPS_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env["JITOPS_LOG_LEVEL"] = "WARNING"
    env.update(extra)
    return env


def stat(pid: int) -> tuple[str, str, int] | None:
    """(comm, state, ppid) of a live process, or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    comm = text[text.index("(") + 1:text.rindex(")")]
    state, ppid = text[text.rindex(")") + 2:].split()[:2]
    return comm, state, int(ppid)


def alive(pid: int) -> bool:
    found = stat(pid)
    return found is not None and found[1] != "Z"


def descendants(root: int) -> dict[int, str]:
    """pid -> comm of every live descendant of `root`."""
    parents: dict[int, tuple[int, str]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            found = stat(int(name))
            if found is not None and found[1] != "Z":
                parents[int(name)] = (found[2], found[0])
    result: dict[int, str] = {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, comm) in parents.items():
            if ppid == parent and pid not in result:
                result[pid] = comm
                frontier.append(pid)
    return result


def wait_gone(pids, seconds: float = 10.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.1)
    return [p for p in pids if alive(p)]
