"""Every JITOPS_* environment variable, typed, read when used (never at import).

    from jitops import config
    config.offline            # reads JITOPS_OFFLINE now
    with config.scope(offline=True, cache_dir=tmp):   # tests and tools override without touching os.environ
        ...

A bad value raises ConfigError naming the variable and what it accepts.
"""
from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Generic, Iterator, TypeVar

from .errors import ConfigError

T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _parse_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean; use 1/0, true/false, yes/no or on/off")


def _parse_path(name: str, raw: str) -> Path | None:
    return Path(raw).expanduser() if raw.strip() else None


def _parse_path_list(name: str, raw: str) -> tuple[Path, ...]:
    return tuple(Path(p).expanduser() for p in raw.split(os.pathsep) if p.strip())


def _parse_float(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number of seconds") from None
    if value < 0:
        raise ConfigError(f"{name}={raw!r} must be >= 0")
    return value


def _parse_int(name: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None
    if value < 1:
        raise ConfigError(f"{name}={raw!r} must be >= 1")
    return value


def _parse_level(name: str, raw: str) -> str:
    value = raw.strip().upper()
    if value not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
        raise ConfigError(f"{name}={raw!r}: use DEBUG, INFO, WARNING or ERROR")
    return value


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One environment variable: its name, parser, default and meaning."""

    env: str
    parse: Callable[[str, str], T]
    default: Callable[[], T]
    doc: str

    def __set_name__(self, owner: type, attr: str) -> None:
        object.__setattr__(self, "attr", attr)

    def __get__(self, obj: Any, owner: type | None = None) -> T:
        if obj is None:
            return self  # type: ignore[return-value]
        overrides = obj._overrides()
        if self.attr in overrides:  # type: ignore[attr-defined]
            return overrides[self.attr]  # type: ignore[attr-defined]
        raw = os.environ.get(self.env)
        if raw is None:
            return self.default()
        return self.parse(self.env, raw)


def _default_cache_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("jitops", appauthor=False))


class Config:
    cache_dir: Setting[Path | None] = Setting(
        "JITOPS_CACHE_DIR", _parse_path, _default_cache_dir,
        "Writable cache root (default: the platform's user cache dir, e.g. ~/.cache/jitops).")
    cache_path: Setting[tuple[Path, ...]] = Setting(
        "JITOPS_CACHE_PATH", _parse_path_list, tuple,
        "Read-only cache roots, os.pathsep-separated, searched before compiling and never written "
        "(deployment images).")
    offline: Setting[bool] = Setting(
        "JITOPS_OFFLINE", _parse_bool, lambda: False,
        "1: never compile; a cache miss raises CacheMissError naming the prewarm command.")
    record: Setting[Path | None] = Setting(
        "JITOPS_RECORD", _parse_path, lambda: None,
        "File to which each cache miss is appended as one JSON line (replay with "
        "`python -m cache_tools prewarm --record FILE`).")
    progress_seconds: Setting[float] = Setting(
        "JITOPS_PROGRESS_SECONDS", _parse_float, lambda: 1.0,
        "A compile running longer than this is announced on the `jitops` logger.")
    log_level: Setting[str] = Setting(
        "JITOPS_LOG_LEVEL", _parse_level, lambda: "INFO",
        "Level of the `jitops` logger's own stderr handler (DEBUG, INFO, WARNING, ERROR).")
    lock_timeout: Setting[float] = Setting(
        "JITOPS_LOCK_TIMEOUT", _parse_float, lambda: 1800.0,
        "Seconds to wait for another process compiling the same kernel before giving up.")
    jobs: Setting[int] = Setting(
        "JITOPS_JOBS", _parse_int, lambda: os.cpu_count() or 1,
        "Parallel compiles in prewarm (and checksum threads in cache_tools verify, export and import).")
    cuda_home: Setting[Path | None] = Setting(
        "JITOPS_CUDA_HOME", _parse_path, lambda: None,
        "CUDA toolkit to use for headers and nvcc, overriding the pip wheels, CUDA_HOME and CUDA_PATH.")
    keep_failed_builds: Setting[bool] = Setting(
        "JITOPS_KEEP_FAILED_BUILDS", _parse_bool, lambda: False,
        "1: keep the temporary build directory of a failed compile and print its path.")

    def __init__(self) -> None:
        # Process-wide, not thread-local: prewarm's worker threads must see what the caller scoped.
        self._stack: list[dict[str, Any]] = [{}]
        self._lock = threading.Lock()

    def _overrides(self) -> dict[str, Any]:
        return self._stack[-1]

    @contextlib.contextmanager
    def scope(self, **values: Any) -> Iterator[None]:
        """Override settings inside a `with` block (tests, tools), without touching os.environ."""
        for key in values:
            if not isinstance(getattr(type(self), key, None), Setting):
                raise ConfigError(f"config.scope(): unknown setting {key!r}; known: {', '.join(settings())}")
        with self._lock:
            merged = dict(self._stack[-1])
            merged.update(values)
            self._stack.append(merged)
        try:
            yield
        finally:
            with self._lock:  # by identity: two scopes may hold equal dicts
                index = next(i for i in range(len(self._stack) - 1, 0, -1) if self._stack[i] is merged)
                del self._stack[index]

    def describe(self) -> list[tuple[str, str, str]]:
        """(variable, current value, meaning) for every setting: for `cache_tools info` and the README."""
        rows = []
        for attr in settings():
            setting: Setting = getattr(type(self), attr)
            try:
                value = repr(getattr(self, attr))
            except ConfigError as exc:
                value = f"<invalid: {exc}>"
            rows.append((setting.env, value, setting.doc))
        return rows


def settings() -> list[str]:
    return [name for name, value in vars(Config).items() if isinstance(value, Setting)]


config = Config()
