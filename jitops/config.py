"""Every JITOPS_* environment variable, typed, read when used (never at import).

    from jitops import config
    config.offline            # reads JITOPS_OFFLINE now
    with config.scope(offline=True, cache_dir=tmp):   # tests and tools override without touching os.environ
        ...

A bad value raises ConfigError naming the variable and what it accepts.

Besides the environment variables, a few tuning knobs are settable only through scope() (benchmarks and tests
force an op's plan with them; the defaults are the planned choice): see Knob and `tuning_knobs()`.

    with config.scope(conv2d_tile={"wgrad": "64x64"}, conv2d_splits={"wgrad": 4}):
        jitops.conv2d(...)
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


def _parse_compile_mode(name: str, raw: str) -> str:
    value = raw.strip().lower()
    if value not in COMPILE_MODES:
        raise ConfigError(f"{name}={raw!r}: use 'blocking' (a call waits for its kernels) or 'background' (a call "
                          "runs torch's implementation while its kernels compile)")
    return value


COMPILE_MODES = ("blocking", "background")


GEMM_SM90_KERNELS = ("cutlass", "light")


def _kernel_choice(choices: str):
    """A parser of an sm_90a kernel family setting: 'light' or 'cutlass', `choices` saying what each is."""
    def parse(name: str, raw: str) -> str:
        value = raw.strip().lower()
        if value not in GEMM_SM90_KERNELS:
            raise ConfigError(f"{name}={raw!r}: use {choices}")
        return value
    return parse


_parse_gemm_sm90_kernel = _kernel_choice(
    "'light' (the raw-PTX kernel that compiles in about a second, the default) or 'cutlass' (CUTLASS's "
    "GemmUniversal, about 35-50 s to compile)")
_parse_grouped_gemm_sm90_kernel = _kernel_choice(
    "'light' (the light GEMM kernel's grouped forms, under a second to compile, the default) or 'cutlass' "
    "(CUTLASS 3's ptr-array grouped GEMM through nvcc, about 40 s a kernel)")
_parse_conv2d_sm90_kernel = _kernel_choice(
    "'light' (the light GEMM kernel with im2col loads, under a second to compile, the default) or 'cutlass' "
    "(CUTLASS 3's conv kernels through nvcc, about 40 s each)")


def _parse_positive_float(name: str, raw: str) -> float:
    value = _parse_float(name, raw)
    if value <= 0:
        raise ConfigError(f"{name}={raw!r} must be > 0")
    return value


_SIZE_UNITS = {"": 1, "b": 1, "k": 2**10, "kib": 2**10, "m": 2**20, "mib": 2**20, "g": 2**30, "gib": 2**30,
               "kb": 10**3, "mb": 10**6, "gb": 10**9}


def _parse_size(name: str, raw: str) -> int:
    """'64M' / '64MiB' (powers of 1024), '64MB' (powers of 1000) or a number of bytes."""
    text = raw.strip().lower()
    digits = text.rstrip("abcdefghijklmnopqrstuvwxyz").strip()
    unit = text[len(digits):].strip()
    try:
        value = int(float(digits) * _SIZE_UNITS[unit])
    except (ValueError, KeyError):
        raise ConfigError(f"{name}={raw!r} is not a size; use bytes or a number with a unit: 64M, 1G, 500MB") from None
    if value < 1:
        raise ConfigError(f"{name}={raw!r} must be at least 1 byte")
    return value


REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def _parse_redis_url(name: str, raw: str) -> str | None:
    url = raw.strip()
    if not url:
        return None
    if not url.startswith(REDIS_SCHEMES) or url in REDIS_SCHEMES:
        shown = repr(raw) if "@" not in raw else "(a URL with credentials, not shown)"
        raise ConfigError(f"{name}={shown} is not a Redis URL; use redis://host:port/db (rediss:// for TLS, "
                          "unix:///path/to/redis.sock?db=0 for a local socket)")
    return url


def _parse_secret(name: str, raw: str) -> str | None:
    return raw if raw.strip() else None


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
    secret: bool = False  # describe() shows whether it is set, never its value

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


class Knob(Generic[T]):
    """A tuning knob with no environment variable: its default, or the value of the innermost config.scope()
    that sets it.  `check(name, value)` validates and normalises a value given to scope() (raising ConfigError);
    knobs are read on hot paths, so reading one is a dict lookup."""

    def __init__(self, check: Callable[[str, Any], T], default: T, doc: str) -> None:
        self.check, self.default, self.doc = check, default, doc

    def __set_name__(self, owner: type, attr: str) -> None:
        self.attr = attr

    def __get__(self, obj: Any, owner: type | None = None) -> T:
        if obj is None:
            return self  # type: ignore[return-value]
        return obj._stack[-1].get(self.attr, self.default)


CONV2D_OPERATORS = ("fprop", "dgrad", "wgrad")


def _per_operator(kind: type, what: str) -> Callable[[str, Any], dict]:
    def check(name: str, value: Any) -> dict:
        if value is None:
            return {}
        if not isinstance(value, dict) or any(k not in CONV2D_OPERATORS for k in value):
            raise ConfigError(f"config.{name}={value!r}: use a dict from operator ({', '.join(CONV2D_OPERATORS)}) "
                              f"to {what}, e.g. {{'wgrad': {'64' if kind is int else repr('64x64')}}}")
        found = {k: v for k, v in value.items() if v is not None}
        for k, v in found.items():
            if type(v) is not kind or (kind is int and v < 1):
                raise ConfigError(f"config.{name}[{k!r}]={v!r}: use {what} (or None for the plan's choice)")
        return found
    return check


def _optional_fold(name: str, value: Any) -> int | None:
    if value is not None and (type(value) is not int or value < 0):
        raise ConfigError(f"config.{name}={value!r}: use None (the plan's choice), 0 (the whole im2col matrix) or "
                          "a number of filter rows >= 1")
    return value


def _tuning(keys: tuple[str, ...], where: str) -> Callable[[str, Any], dict[str, int]]:
    """A dict of an op's tuning constants to override (names from `keys`, values ints >= 0)."""
    def check(name: str, value: Any) -> dict[str, int]:
        if value is None:
            return {}
        if not isinstance(value, dict) or any(k not in keys or type(v) is not int or v < 0
                                              for k, v in value.items()):
            raise ConfigError(f"config.{name}={value!r}: use a dict from {', '.join(keys)} to an int >= 0 "
                              f"(see {where}); names left out keep the plan's values")
        return dict(value)
    return check


def _bool(name: str, value: Any) -> bool:
    if type(value) is not bool:
        raise ConfigError(f"config.{name}={value!r}: use True or False")
    return value


def _optional_name(name: str, value: Any) -> str | None:
    if value is not None and (type(value) is not str or not value):
        raise ConfigError(f"config.{name}={value!r}: use a configuration name (str) or None for the default")
    return value


def _optional_schedule(name: str, value: Any) -> tuple[int, int] | None:
    if value is None:
        return None
    try:
        raster, swizzle = value
    except (TypeError, ValueError):
        raster = swizzle = None
    if type(raster) is not int or type(swizzle) is not int or raster not in (0, 1) or swizzle not in (1, 2, 4, 8):
        raise ConfigError(f"config.{name}={value!r}: use None or (raster, swizzle): raster 0 (along M) or 1 (along "
                          "N), swizzle 1, 2, 4 or 8")
    return (raster, swizzle)


GEMM_FAMILIES = ("auto", "sm80")


def _gemm_family(name: str, value: Any) -> str:
    if value not in GEMM_FAMILIES:
        raise ConfigError(f"config.{name}={value!r}: use 'auto' (the device's kernels) or 'sm80' (the CUTLASS 2 "
                          "kernels on every arch)")
    return value


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
    compile_mode: Setting[str] = Setting(
        "JITOPS_COMPILE", _parse_compile_mode, lambda: "blocking",
        "blocking: a call on a new shape class waits for its kernels to compile (scripts, benchmarks); "
        "background: it runs torch's own implementation at once while the kernels compile in a worker pool, and "
        "later calls switch to them (notebooks).  Never applies with JITOPS_OFFLINE=1.")
    gemm_sm90_kernel: Setting[str] = Setting(
        "JITOPS_GEMM_SM90_KERNEL", _parse_gemm_sm90_kernel, lambda: "light",
        "jitops.gemm's sm_90a kernel: light (default: kernels/gemm/sm90_light_gemm.cu, raw PTX, about 1 s to "
        "compile, level with CUTLASS's kernel on bench_gemm's shapes) or cutlass (CUTLASS's GemmUniversal, 35-50 s "
        "to compile).  Read when a shape class's kernels are first built in a process.")
    conv2d_sm90_kernel: Setting[str] = Setting(
        "JITOPS_CONV2D_SM90_KERNEL", _parse_conv2d_sm90_kernel, lambda: "light",
        "jitops.conv2d's sm_90a kernels: light (default: kernels/gemm/sm90_light_gemm.cu as an implicit GEMM with "
        "TMA im2col loads, NVRTC, under a second to compile, level with CUTLASS's over ResNet-50) or cutlass "
        "(CUTLASS 3's conv kernels, nvcc, about 40 s each).  Forced split-K fprop and dgrad plans take CUTLASS's "
        "either way.  Read when a shape class's kernels are first built in a process.")
    grouped_gemm_sm90_kernel: Setting[str] = Setting(
        "JITOPS_GROUPED_GEMM_SM90_KERNEL", _parse_grouped_gemm_sm90_kernel, lambda: "light",
        "jitops.grouped_gemm's sm_90a kernels: light (default: kernels/gemm/sm90_light_gemm.cu with LIGHT_GROUPED, "
        "NVRTC, under a second to compile) or cutlass (CUTLASS 3's ptr-array grouped GEMM, "
        "kernels/grouped_gemm/grouped_gemm.cu, nvcc, about 40 s a kernel).  A forced grouped_gemm_config picks "
        "its own family.  Read when a shape class is computed.")
    native_host: Setting[bool] = Setting(
        "JITOPS_NATIVE_HOST", _parse_bool, lambda: True,
        "1 (default): jitops.linear's, jitops.layer_norm's and jitops.conv2d's calls on CUDA take a C++ host path "
        "(kernels/host/host_path.cpp: the launches and the autograd node in C++), and so do gemm's, linear's, "
        "gelu's, layer_norm's and conv2d's calls through torch's dispatcher (torch.compile's graphs, the "
        "profiler); built once per machine in the background on the first CUDA call and used once ready; until "
        "then, and for anything it does not cover, the Python path runs.  0: Python only.")
    keep_failed_builds: Setting[bool] = Setting(
        "JITOPS_KEEP_FAILED_BUILDS", _parse_bool, lambda: False,
        "1: keep the temporary build directory of a failed compile and print its path.")
    # The remote tier (jitops/cache/remote.py, docs/cache_tools.md "Fleets").
    remote_cache: Setting[str | None] = Setting(
        "JITOPS_REMOTE_CACHE", _parse_redis_url, lambda: None,
        "Redis URL of a cache shared by a fleet (redis://host:port/db), looked up after the disk cache and "
        "before compiling; needs `pip install jitops[remote]`.  Unset: no remote tier.")
    remote_cache_key: Setting[str | None] = Setting(
        "JITOPS_REMOTE_CACHE_KEY", _parse_secret, lambda: None,
        "Shared secret: entries published to the remote are signed with HMAC-SHA256, and unsigned or wrongly "
        "signed entries are rejected.", secret=True)
    remote_timeout: Setting[float] = Setting(
        "JITOPS_REMOTE_TIMEOUT", _parse_positive_float, lambda: 0.05,
        "Seconds one Redis request (connect, send, receive) may block before the remote counts as down "
        "(default 0.05).")
    remote_backoff: Setting[float] = Setting(
        "JITOPS_REMOTE_BACKOFF", _parse_float, lambda: 60.0,
        "Seconds the remote is left alone after an error (or after it reported itself full) before it is tried "
        "again; kernels are compiled and cached locally meanwhile (default 60).")
    remote_ttl: Setting[float] = Setting(
        "JITOPS_REMOTE_TTL", _parse_float, lambda: 30 * 86400.0,
        "Seconds a remote entry lives after it was last published or loaded (default 30 days); 0: no expiry.")
    remote_max_entry_size: Setting[int] = Setting(
        "JITOPS_REMOTE_MAX_ENTRY_SIZE", _parse_size, lambda: 64 * 2**20,
        "Largest entry (all its files) shared through the remote (default 64M); a bigger build stays local and "
        "a bigger remote entry is not downloaded.")
    remote_lock_seconds: Setting[float] = Setting(
        "JITOPS_REMOTE_LOCK_SECONDS", _parse_positive_float, lambda: 30.0,
        "Expiry of the fleet lock that lets one node compile a kernel while the others wait (default 30); the "
        "holder renews it every third of that, so a node killed mid-compile stalls the others this long at most.")

    # ---- tuning knobs (scope() only; read by the ops' plans) -------------------------------------------------
    conv2d_tile: Knob[dict[str, str]] = Knob(
        _per_operator(str, "a tile name of jitops/ops/conv2d_plan.py's TILES"), {},
        "conv2d: force the tile of an operator ('fprop', 'dgrad', 'wgrad'), e.g. {'wgrad': '64x192t3'}; an "
        "operator not named keeps the plan's tile.  The plan raises ValueError for a tile it has not.")
    conv2d_splits: Knob[dict[str, int]] = Knob(
        _per_operator(int, "a split count >= 1"), {},
        "conv2d: force the GEMM-K split count of an operator, e.g. {'fprop': 2} (fprop and dgrad then run the "
        "split-K variant of the tile).")
    conv2d_fold: Knob[int | None] = Knob(
        _optional_fold, None,
        "conv2d: the few-channel layers' (the 7x7 stem's) im2col fold: 0 the whole matrix, f > 0 f filter rows "
        "per matrix row; None: the plan's choice.")
    conv2d_wgrad_direct: Knob[bool] = Knob(
        _bool, True,
        "conv2d: a one-slice wgrad of aligned channels writes dw itself (False: an fp32 slice and torch's copy, "
        "the benchmark's comparison).  The shape class carries it, so the kernel memo follows a change.")
    conv2d_wgrad_reduce_kernel: Knob[bool] = Knob(
        _bool, True,
        "conv2d: split wgrad slices are summed by jitops' reduction kernel (False: torch's sum and a copy).")
    conv2d_dgrad_phase_streams: Knob[bool] = Knob(
        _bool, True,
        "conv2d, CUTLASS's kernels (conv2d_sm90_kernel='cutlass'): a strided dgrad's phases, a launch each, run on "
        "side streams so their short kernels overlap (False: in turn).  The light kernel runs them in one launch.")
    gelu_tuning: Knob[dict[str, int]] = Knob(
        _tuning(("unroll_forward", "unroll_backward", "blocks_per_sm", "fast_tanh"), "jitops/ops/gelu_plan.py"), {},
        "gelu: override its tuning constants, e.g. {'unroll_forward': 2}: 16-byte loads a thread issues before it "
        "computes, the grid cap in blocks per SM (0: none), tanh.approx for 16-bit tanh (1).  Read when a shape "
        "class's kernels are first built; the kernel set keeps what it was built with.")
    layer_norm_tuning: Knob[dict[str, int]] = Knob(
        _tuning(("forward_tile_bytes", "backward_tile_bytes", "forward_blocks_per_sm"),
                "jitops/ops/layer_norm_plan.py"), {},
        "layer_norm: override its tuning constants, e.g. {'forward_tile_bytes': 64}: bytes of a row a thread keeps "
        "in registers, forward and backward (read when the buckets are computed: layer_norm_plan.clear_buckets()), "
        "and the forward's grid cap in blocks per SM.")
    gemm_family: Knob[str] = Knob(
        _gemm_family, "auto",
        "gemm (and linear): the kernel family on every arch; 'sm80' runs the CUTLASS 2 kernels on an sm_90 GPU too "
        "(mma.sync runs on Hopper), which is how the GPU tests check that path on an H100.  The shape classes "
        "carry it.")
    grouped_gemm_config: Knob[str | None] = Knob(
        _optional_name, None,
        "grouped_gemm: force a kernel configuration: one of jitops/ops/grouped_gemm_plan.py's CONFIGS (CUTLASS's "
        "kernel) or LIGHT_CONFIGS (the light kernel); None: the planned one.  The shape classes carry it.")
    grouped_gemm_schedule: Knob[tuple[int, int] | None] = Knob(
        _optional_schedule, None,
        "grouped_gemm: force the tile scheduler's (raster, swizzle); None: the planned one.")

    def __init__(self) -> None:
        # Process-wide, not thread-local: prewarm's worker threads must see what the caller scoped.
        self._stack: list[dict[str, Any]] = [{}]
        self._lock = threading.Lock()
        # Changes whenever a scope starts or ends, never back to an earlier value.  Knobs are set only by scopes,
        # so a memo of values derived from knobs (conv2d's shape classes) keys on this one int instead of
        # reading every knob on every call (0.24-0.4 us a read on the dev box).
        self.generation = 0
        self._listeners: list[Callable[[int], None]] = []

    def on_generation(self, listener: Callable[[int], None]) -> None:
        """Call listener(generation) whenever the generation changes: the C++ host path's dispatcher kernels
        (kernels/host/dispatch.h) cannot read it from Python on each call."""
        self._listeners.append(listener)
        listener(self.generation)

    def _changed(self) -> None:
        for listener in self._listeners:
            listener(self.generation)

    def _overrides(self) -> dict[str, Any]:
        return self._stack[-1]

    @contextlib.contextmanager
    def scope(self, **values: Any) -> Iterator[None]:
        """Override settings inside a `with` block (tests, tools), without touching os.environ."""
        values = dict(values)
        for key, value in values.items():
            declared = vars(type(self)).get(key)
            if isinstance(declared, Knob):
                values[key] = declared.check(key, value)
            elif not isinstance(declared, Setting):
                raise ConfigError(f"config.scope(): unknown setting {key!r}; known: "
                                  f"{', '.join(settings() + tuning_knobs())}")
        with self._lock:
            merged = dict(self._stack[-1])
            merged.update(values)
            self._stack.append(merged)
            self.generation += 1
        self._changed()
        try:
            yield
        finally:
            with self._lock:  # by identity: two scopes may hold equal dicts
                index = next(i for i in range(len(self._stack) - 1, 0, -1) if self._stack[i] is merged)
                del self._stack[index]
                self.generation += 1
            self._changed()

    def describe(self) -> list[tuple[str, str, str]]:
        """(variable, current value, meaning) for every setting: for `cache_tools info` and the README."""
        rows = []
        for attr in settings():
            setting: Setting = getattr(type(self), attr)
            try:
                value = getattr(self, attr)
                value = ("'<set>'" if value is not None else "None") if setting.secret else repr(value)
            except ConfigError as exc:
                value = f"<invalid: {exc}>"
            rows.append((setting.env, value, setting.doc))
        return rows


def settings() -> list[str]:
    return [name for name, value in vars(Config).items() if isinstance(value, Setting)]


def tuning_knobs() -> list[str]:
    return [name for name, value in vars(Config).items() if isinstance(value, Knob)]


config = Config()
