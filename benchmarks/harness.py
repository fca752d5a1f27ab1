"""Benchmark runner shared by every benchmark: times ours and a baseline in the same run on the same GPU,
prints one table and writes one JSON record (docs/benchmarks.md and notebooks/04_performance.ipynb read it).

    from harness import Bench
    bench = Bench("gelu", baseline="torch (F.gelu, aten.gelu_backward)", roofline=copy_bandwidth())
    bench.compare(op="gelu fwd", shape=(16384, 8192), dtype="bf16",
                  ours=lambda: jitops.gelu(x), baseline=lambda: F.gelu(x), baseline_name="torch",
                  bytes_moved=2 * x.numel() * 2)           # or flops=...
    bench.summarize(goal_met=True)
    bench.finish()   # table on stdout, the record as JSON (below)

Records.  A benchmark's full run writes benchmarks/results/<benchmark>.json, replacing the one before: that
directory holds the latest record of each benchmark and nothing else (tests/test_benchmark_results.py checks
it).  Sweeps, tuning runs and partial runs name a `variant` and go to benchmarks/out/<benchmark>-<variant>.json,
which git ignores.  $JITOPS_BENCH_OUT, when set, takes both (benchmarks/gpu_session.sh points it at $OUT).
Every record has the same keys: benchmark, date, device (a dict), command, baseline, rows, summary (and variant
where there is one); the summary names the commit measured (`source_commit`; a copy of the tree without .git
names it in JITOPS_BENCH_COMMIT).

Timing: CUDA events around each call, after warm-up (which also absorbs JIT compiles), median of many
repetitions.  Inputs over 64 MB make the 50 MB L2 irrelevant; smaller cases rotate over enough copies of
their inputs to spill it (see `rotate`).  Calls shorter than the host's launch overhead would time the host, not
the kernel: `compare(timing="auto")` captures such calls (ours and the baseline alike) in a CUDA graph, many to a
graph, and times the replays (`time_cuda_graph`).  The per-call host overhead is its own benchmark
(bench_jit_latency.py).  `Bench(name, roofline=copy_bandwidth())` adds a column with each rate as a share of the
device copy bandwidth measured in the same run.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
import time
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

RESULTS = Path(__file__).resolve().parent / "results"   # the latest full run of each benchmark (committed)
SCRATCH = Path(__file__).resolve().parent / "out"       # sweeps, tuning and partial runs (not committed)
BENCHMARKS = Path(__file__).resolve().parent
# The keys of every record, and of a row of Bench.compare (a Row); tests/test_benchmark_results.py checks them.
RECORD_KEYS = ("benchmark", "date", "device", "command", "baseline", "rows", "summary")


def time_cuda(fn: Callable[[], Any], *, warmup: int = 10, reps: int = 100, min_ms: float = 200.0) -> float:
    """Median milliseconds per call of fn, measured with CUDA events (one event pair per call)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    # Estimate, then repeat enough to cover min_ms in total.
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate = max(start.elapsed_time(end) / 5, 1e-3)
    reps = max(reps, min(int(min_ms / estimate), 10000))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def time_cuda_graph(fn: Callable[[], Any], *, calls: int | None = None, reps: int = 30,
                    target_ms: float = 2.0) -> float:
    """Median milliseconds per call of fn, from replays of a CUDA graph holding `calls` calls (by default enough
    to last about target_ms).  Launch overhead and host work disappear: this is the device time per call,
    including the gaps between dependent kernels that a graph keeps."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up off the default stream, as torch.cuda.graphs asks
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    if calls is None:
        estimate = time_cuda(fn, warmup=2, reps=20, min_ms=5.0)
        # At least 100 calls a graph, so a replay's own launch is spread thin: a 5 us kernel once timed at 20.8
        # us (layer_norm (1, 16384) fp32, lent H100, 2026-11-22; 5.0 us in the runs before and after), and
        # gemm 128x8192x8192 at 76.8 us against 52.8 after this floor, most likely graphs of a call or two sized
        # from an estimate that caught a host hiccup or first-call work.
        calls = max(100, min(2000, int(target_ms / max(estimate, 1e-4))))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        s.record()
        graph.replay()
        e.record()
    torch.cuda.synchronize()
    ms = statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) / calls
    del graph
    return ms


def host_us(*fns: Callable[[], Any], calls: int = 20000, rounds: int = 7, warmup: int = 2000) -> list[float]:
    """Wall microseconds per call of each fn (the host's per-call cost, on inputs tiny enough that the GPU keeps
    up): best of `rounds`, the fns' rounds interleaved (A B A B ...) so that clock or neighbour drift hits all
    alike.  Every benchmark's host-overhead figures come from here: a separate, shorter, sequential loop in the
    layer_norm benchmark once read x1.51 where this read x1.12-1.22 for the same call (lent H100, 2026-11-22)."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)  # CPU calls: nothing queued
    for fn in fns:
        for _ in range(warmup):
            fn()
    sync()
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for slot, fn in enumerate(fns):
            started = time.perf_counter()
            for _ in range(calls):
                fn()
            sync()
            best[slot] = min(best[slot], (time.perf_counter() - started) / calls * 1e6)
    return best


def rotate(make: Callable[[], Sequence[Any]], bytes_per_set: int,
           l2_bytes: int = 50 * 2**20) -> Callable[[], Sequence[Any]]:
    """Cycle through enough input sets that consecutive calls do not find their inputs in L2."""
    count = max(1, min(64, (3 * l2_bytes) // max(bytes_per_set, 1) + 1))
    sets = [make() for _ in range(count)]
    state = {"i": 0}

    def next_set() -> Sequence[Any]:
        state["i"] = (state["i"] + 1) % count
        return sets[state["i"]]

    return next_set


def copy_bandwidth(nbytes: int = 2 * 2**30) -> float:
    """Device-to-device copy in TB/s counting bytes read plus bytes written: the memory roofline of this run."""
    src = torch.empty(nbytes // 2, dtype=torch.float16, device="cuda").uniform_()
    dst = torch.empty_like(src)
    ms = time_cuda(lambda: dst.copy_(src), warmup=5, reps=30)
    return 2 * nbytes / (ms * 1e-3) / 1e12


def device_description() -> dict[str, Any]:
    props = torch.cuda.get_device_properties(0)
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.strip()
    except OSError:
        driver = "?"
    return {"name": props.name, "sms": props.multi_processor_count, "capability": f"{props.major}.{props.minor}",
            "driver": driver, "torch": torch.__version__, "cuda": torch.version.cuda,
            "python": platform.python_version()}


def record_path(benchmark: str, variant: str | None = None) -> Path:
    """Where a record goes: results/<benchmark>.json for a full run, out/<benchmark>-<variant>.json for a
    variant; both in $JITOPS_BENCH_OUT when it is set."""
    out_dir = Path(os.environ.get("JITOPS_BENCH_OUT") or (SCRATCH if variant else RESULTS))
    return out_dir / (f"{benchmark}-{variant}.json" if variant else f"{benchmark}.json")


def cpu_description() -> dict[str, Any]:
    """The device entry of a run on a machine without a GPU (the remote-cache benchmark, CPU kernels)."""
    return {"name": f"cpu: {platform.machine()}, {os.cpu_count()} cores", "driver": "none (no GPU)",
            "torch": torch.__version__, "python": platform.python_version()}


def source_commit() -> str | None:
    """The commit the run measured: $JITOPS_BENCH_COMMIT where it is set (git cannot tell in a copy of the tree
    without .git), else git's HEAD, "-dirty" with tracked files changed; None outside a checkout."""
    named = os.environ.get("JITOPS_BENCH_COMMIT")
    if named:
        return named
    try:
        head = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=BENCHMARKS, capture_output=True,
                              text=True, timeout=30)
        if head.returncode:
            return None
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=BENCHMARKS,
                                 capture_output=True, text=True, timeout=30).stdout.strip()
    except OSError:
        return None
    return head.stdout.strip() + ("-dirty" if changed else "")


def save_record(benchmark: str, *, baseline: str, rows: list[dict[str, Any]], summary: dict[str, Any],
                variant: str | None = None, started: _dt.datetime | None = None) -> tuple[Path, dict[str, Any]]:
    """Write one record (module docstring) and return its path and contents.  `benchmark` is the NAME of
    benchmarks/bench_NAME.py; `baseline` says what ours is compared with; `summary` holds the run's headline
    figures (geometric means, totals, goals) and anything else worth keeping that is not a row; the record adds
    the commit it measured (source_commit) to it."""
    if not (BENCHMARKS / f"bench_{benchmark}.py").is_file():
        raise ValueError(f"save_record: no benchmarks/bench_{benchmark}.py; name the benchmark that ran")
    started = started or _dt.datetime.now(_dt.timezone.utc)
    device = device_description() if torch.cuda.is_available() else cpu_description()
    record = {"benchmark": benchmark, "date": started.strftime("%Y-%m-%d %H:%M UTC"), "device": device,
              "command": " ".join([Path(sys.executable).name, *sys.argv]), "baseline": baseline, "rows": rows,
              "summary": {**summary, "commit": summary.get("commit") or source_commit()}}
    if variant:
        record["variant"] = variant
    path = record_path(benchmark, variant)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".tmp")  # a run killed while writing leaves the last record whole
    partial.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(partial, path)
    return path, record


@dataclass
class Row:
    op: str
    shape: str
    dtype: str
    ours_ms: float
    baseline_ms: float
    baseline: str
    metric: str          # "TB/s" or "TFLOP/s"
    ours_rate: float
    baseline_rate: float
    speedup: float       # baseline time / our time: > 1 means we are faster
    extra: dict[str, Any] = field(default_factory=dict)


class Bench:
    def __init__(self, name: str, *, baseline: str, variant: str | None = None, roofline: float | None = None,
                 min_ms: float = 200.0, reps: int = 100, rounds: int = 1) -> None:
        """name: the NAME of benchmarks/bench_NAME.py; baseline: what ours is compared with; variant: set for a
        sweep, tuning or partial run (its record then goes to benchmarks/out/, not results/)."""
        self.name, self.baseline, self.variant = name, baseline, variant
        self.min_ms, self.reps = min_ms, reps  # event timing: at least `reps` calls and `min_ms` in all
        # Event timing in `rounds` alternating rounds (ours, baseline, then baseline, ours, ...), each side's time
        # the median of its rounds: the clock of a power-bound GPU drifts over seconds (cuBLAS's bf16 4096^3
        # read 645-708 TFLOP/s within one minute on the lent H100, 2026-11-22), which one back-to-back
        # pair of timings turns into a ratio error.
        self.rounds = rounds
        self.rows: list[Row] = []
        self.summary: dict[str, Any] = {}
        self.started = _dt.datetime.now(_dt.timezone.utc)
        self.roofline = roofline  # TB/s of a device copy in this run: rates get a "% of copy" column
        if roofline:
            self.summary["copy TB/s (read + write)"] = round(roofline, 3)

    def compare(self, *, op: str, shape: Any, dtype: str, ours: Callable[[], Any], baseline: Callable[[], Any],
                baseline_name: str, bytes_moved: float | None = None, flops: float | None = None,
                check: Callable[[], None] | None = None, timing: str = "events", graph_below_ms: float = 0.05,
                **extra: Any) -> Row:
        """Time ours and the baseline the same way.  timing: "events" (CUDA events around each call), "graph"
        (replays of a CUDA graph of many calls) or "auto" (graph when either call takes under graph_below_ms
        with events, where the host's launch cost would be what is timed)."""
        if check is not None:
            check()
        if timing == "auto":
            # Event timing of a short call measures the host when the host is slow (seen: a call of 4 us timed
            # at 60-160 us, ours and torch's alike), so the byte count decides first: under graph_below_ms at
            # 3 TB/s is a short call.
            short = bytes_moved is not None and bytes_moved < graph_below_ms * 1e-3 * 3e12
            if not short:
                short = min(time_cuda(ours, warmup=3, reps=10, min_ms=2.0),
                            time_cuda(baseline, warmup=3, reps=10, min_ms=2.0)) < graph_below_ms
            timing = "graph" if short else "events"
        if timing == "graph":
            extra["timing"] = "graph"
            timer = time_cuda_graph
        else:
            def timer(fn):
                return time_cuda(fn, min_ms=self.min_ms / self.rounds, reps=self.reps)
        times: dict[Callable[[], Any], list[float]] = {ours: [], baseline: []}
        for index in range(self.rounds):
            for fn in ((ours, baseline) if index % 2 == 0 else (baseline, ours)):
                times[fn].append(timer(fn))
        ours_ms, base_ms = statistics.median(times[ours]), statistics.median(times[baseline])
        if self.rounds > 1:
            extra["rounds"] = self.rounds
        if flops is not None:
            metric, scale = "TFLOP/s", flops / 1e12
        else:
            metric, scale = "TB/s", (bytes_moved or 0) / 1e12
        row = Row(op, str(shape), dtype, ours_ms, base_ms, baseline_name, metric,
                  scale / (ours_ms * 1e-3), scale / (base_ms * 1e-3), base_ms / ours_ms, extra)
        if self.roofline and metric == "TB/s":
            extra["ours_of_copy"] = row.ours_rate / self.roofline
        self.rows.append(row)
        print(f"  {op:22s} {str(shape):28s} {dtype:5s} ours {ours_ms * 1e3:9.1f} us  "
              f"{baseline_name} {base_ms * 1e3:9.1f} us  x{row.speedup:.2f}  {row.ours_rate:.2f} {metric}"
              + (f" ({extra['ours_of_copy']:.0%} of copy)" if "ours_of_copy" in extra else ""), flush=True)
        return row

    def summarize(self, **values: Any) -> None:
        """Headline figures and anything else of the run that is not a row (the record's summary)."""
        self.summary.update(values)

    def table(self) -> str:
        copy = bool(self.roofline)
        header = (f"| op | shape | dtype | ours (us) | baseline (us) | ours {self.rows[0].metric if self.rows else ''} "
                  f"| baseline rate | baseline | ours/baseline speed |" + (" ours % of copy |" if copy else ""))
        lines = [header, "|" + " --- |" * (10 if copy else 9)]
        for r in self.rows:
            share = r.extra.get("ours_of_copy")
            graph = " (graph)" if r.extra.get("timing") == "graph" else ""
            lines.append(f"| {r.op} | {r.shape} | {r.dtype} | {r.ours_ms * 1e3:.1f}{graph} | "
                         f"{r.baseline_ms * 1e3:.1f}{graph} | {r.ours_rate:.2f} {r.metric} | "
                         f"{r.baseline_rate:.2f} {r.metric} | {r.baseline} | {r.speedup:.2f} |"
                         + (f" {share:.0%} |" if share is not None else (" - |" if copy else "")))
        return "\n".join(lines)

    def finish(self) -> Path:
        path, record = save_record(self.name, baseline=self.baseline, rows=[asdict(r) for r in self.rows],
                                   summary=self.summary, variant=self.variant, started=self.started)
        device = record["device"]
        title = self.name + (f" ({self.variant})" if self.variant else "")
        print(f"\n## {title} - {device.get('name')} - {record['date']}\n`{record['command']}`\n"
              f"baseline: {self.baseline}\n")
        for key, value in self.summary.items():
            print(f"- {key}: {value}")
        print()
        print(self.table())
        print(f"\nJSON: {path}")
        return path
