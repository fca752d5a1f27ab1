"""A real redis-server for tests and benchmarks: a random loopback port, a private temporary directory, no
persistence, stopped (or killed) by its owner.

The binary: $JITOPS_REDIS_SERVER, else `redis-server` on PATH (Debian: apt-get install redis-server).  A binary
carried to a machine without the package (the Debian .deb unpacked with `dpkg -x`, its libraries beside it) is
run with LD_LIBRARY_PATH=$JITOPS_REDIS_LIBS when that is set.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path


def find_binary() -> str | None:
    explicit = os.environ.get("JITOPS_REDIS_SERVER")
    if explicit:
        return explicit if Path(explicit).is_file() else None
    for candidate in (shutil.which("redis-server"), "/usr/bin/redis-server", "/usr/sbin/redis-server"):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    def __init__(self, directory: Path, binary: str | None = None, port: int | None = None,
                 config: dict[str, str] | None = None) -> None:
        self.binary = binary or find_binary()
        if self.binary is None:
            raise FileNotFoundError("redis-server not found: apt-get install redis-server, or set "
                                    "JITOPS_REDIS_SERVER to the binary")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.config = dict(config or {})
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> "RedisServer":
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory),
                "--save", "", "--appendonly", "no", "--daemonize", "no", "--protected-mode", "yes",
                "--logfile", str(self.directory / "redis.log")]
        for name, value in self.config.items():
            args += [f"--{name}", value]
        env = dict(os.environ)
        if os.environ.get("JITOPS_REDIS_LIBS"):
            env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [os.environ["JITOPS_REDIS_LIBS"],
                                                                   env.get("LD_LIBRARY_PATH")]))
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                log = (self.directory / "redis.log")
                raise RuntimeError(f"redis-server exited with {self.process.returncode}: "
                                   f"{self.process.stderr.read().decode(errors='replace')}"
                                   f"{log.read_text() if log.exists() else ''}")
            if _answers_ping(self.port):
                return self
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server did not answer on port {self.port} within {timeout} s")

    def client(self):
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, db=0)

    def kill(self) -> None:
        """SIGKILL: the server vanishes mid-run, as a crashed or OOM-killed one does."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.process is not None and self.process.stderr is not None:
            self.process.stderr.close()
