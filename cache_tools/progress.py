"""A progress display on stderr: one redrawn bar on a terminal; elsewhere (CI logs, docker build output) one
plain line per finished kernel, and a line naming what still compiles every HEARTBEAT seconds."""
from __future__ import annotations

import shutil
import sys
import threading
import time
from typing import TextIO

HEARTBEAT = 30.0


class Progress:
    def __init__(self, total: int, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.total = total
        self.stream = stream or sys.stderr
        self.enabled = enabled and total > 0
        self.tty = self.enabled and getattr(self.stream, "isatty", lambda: False)()
        self.done = 0
        self.counts: dict[str, int] = {}
        self.running: dict[int, tuple[str, float]] = {}
        self.started = time.perf_counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._said = time.perf_counter()
        self._ticker: threading.Thread | None = None
        if self.enabled:  # long compiles: redraw the elapsed time, or say what still runs
            self._ticker = threading.Thread(target=self._tick, daemon=True)
            self._ticker.start()

    def start(self, token: int, label: str) -> None:
        with self._lock:
            self.running[token] = (label, time.perf_counter())
            if self.tty:
                self._draw()

    def finish(self, token: int, label: str, outcome: str, arch: str, seconds: float) -> None:
        with self._lock:
            self.running.pop(token, None)
            self.done += 1
            self.counts[outcome] = self.counts.get(outcome, 0) + 1
            if not self.enabled:
                return
            if self.tty:
                self._draw()
            else:
                width = len(str(self.total))
                print(f"[{self.done:{width}d}/{self.total}] {outcome:<12} {arch:<7} {label} ({seconds:.2f} s)",
                      file=self.stream, flush=True)
                self._said = time.perf_counter()

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        if self.tty:
            with self._lock:
                self.stream.write("\r\x1b[K")
                self.stream.flush()

    def _tick(self) -> None:
        while not self._stop.wait(0.5):
            with self._lock:
                if self.tty:
                    self._draw()
                elif self.running and time.perf_counter() - self._said >= HEARTBEAT:
                    now = time.perf_counter()
                    names = ", ".join(f"{label} ({now - since:.0f} s)" for label, since in self.running.values())
                    print(f"[{self.done}/{self.total}] still compiling: {names}", file=self.stream, flush=True)
                    self._said = now

    def _draw(self) -> None:
        columns = shutil.get_terminal_size((100, 20)).columns
        filled = int(20 * self.done / self.total)
        counts = " ".join(f"{n} {k}" for k, n in sorted(self.counts.items()))
        text = f"[{'#' * filled}{'.' * (20 - filled)}] {self.done}/{self.total} {counts} " \
               f"{time.perf_counter() - self.started:.0f}s"
        if self.running:
            label, since = min(self.running.values(), key=lambda r: r[1])
            more = f" +{len(self.running) - 1}" if len(self.running) > 1 else ""
            text += f"  {label} ({time.perf_counter() - since:.0f}s){more}"
        self.stream.write("\r\x1b[K" + text[: columns - 1])
        self.stream.flush()
